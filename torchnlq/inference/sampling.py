"""Sampling from a trained model with the KV cache (library code behind ``scripts/generate.py``).

Sampling draws from a private generator seeded with ``seed`` (the global RNG is untouched);
temperature 0 is greedy decoding.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchnlq.config.job_config import SEED_MAX
from torchnlq.data.tokenizer import GPT2_TIKTOKEN_SHA256, TIKTOKEN_FILE_ENV, Tokenizer, build_tokenizer
from torchnlq.errors import UserError
from torchnlq.interop.export import export_source
from torchnlq.interop.load import LoadedModel, as_loaded
from torchnlq.interop.tokenizer_files import tokenizer_from_folder
from torchnlq.models.decoder import Decoder
from torchnlq.models.layers import KVCache

STOP_LENGTH = "max_new_tokens"
STOP_EOT = "end_of_text"
STOP_CONTEXT = "max_seq_len"


@dataclass
class Generation:
    """The prompt's tokens, the sampled tokens (without a final end-of-text) and why sampling stopped."""

    prompt_tokens: list[int]
    new_tokens: list[int]
    stop_reason: str  # STOP_LENGTH, STOP_EOT or STOP_CONTEXT


def sample_next(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """Next token ids [B] from last-position logits [B, V] (float32); temperature 0 takes the argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if torch.isnan(scaled).any() or torch.isposinf(scaled).any():
        # A temperature so small (logits / T overflows) or so large (T itself overflows float32) that float32
        # cannot hold the quotient: shifted to a largest logit of 0 and divided in float64, it stays finite.
        scaled = (logits.double() - logits.double().max(dim=-1, keepdim=True).values) / temperature
    logits = scaled
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, seed: int = 0) -> None:
    """UserError for values sampling cannot use."""
    if max_new_tokens < 0:
        raise UserError(f"--max-new-tokens={max_new_tokens} must be at least 0")
    if not math.isfinite(temperature) or temperature < 0:
        raise UserError(f"--temperature={temperature} must be a finite number >= 0 (0 is greedy)")
    if top_k is not None and top_k < 1:
        raise UserError(f"--top-k={top_k} must be at least 1 (leave it unset for no top-k)")
    if not 0 <= seed <= SEED_MAX:
        raise UserError(f"--seed={seed} must be in 0..{SEED_MAX} (what torch's generators take)")


@torch.inference_mode()
def generate_tokens(
    model: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    eot_id: int | None = None,
    vocab_limit: int | None = None,
    stop_when: Callable[[list[int]], bool] | None = None,
) -> Generation:
    """Sample up to ``max_new_tokens`` tokens after ``prompt`` with a KV cache.

    Stops early at ``eot_id`` (not included) or when the context is full. ``vocab_limit`` masks the
    padded rows of the vocabulary (ids the tokenizer cannot decode); ``stop_when(new tokens)`` ends it early too.
    """
    check_sampling(max_new_tokens, temperature, top_k, seed)
    max_len = model.args.max_seq_len
    if not prompt:
        raise UserError("the prompt is empty; give at least one token of text")
    if len(prompt) > max_len:
        raise UserError(f"the prompt has {len(prompt)} tokens but the model's context is max_seq_len={max_len}")
    was_training = model.training
    model.eval()
    device = model.tok_emb.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    # Sized to what this call can write, not to max_seq_len: a recorded context of millions of positions would
    # otherwise allocate gigabytes of keys and values for a few tokens.
    cache = KVCache(model.args.n_layers, min(max_len, len(prompt) + max_new_tokens))
    new: list[int] = []
    stop = STOP_LENGTH
    try:
        logits = model(torch.tensor([prompt], device=device), cache=cache, last_positions=1)[:, -1].float()
        for i in range(max_new_tokens):
            if vocab_limit is not None and vocab_limit < logits.shape[-1]:
                logits[:, vocab_limit:] = float("-inf")
            token = int(sample_next(logits, temperature, top_k, generator)[0])
            if eot_id is not None and token == eot_id:
                stop = STOP_EOT
                break
            new.append(token)
            if i == max_new_tokens - 1:
                break
            if cache.get_seq_length() >= max_len:  # the next token would need position max_seq_len
                stop = STOP_CONTEXT
                break
            if stop_when is not None and stop_when(new):
                break
            logits = model(torch.tensor([[token]], device=device), cache=cache)[:, -1].float()
    finally:
        model.train(was_training)
    return Generation(list(prompt), new, stop)


def tokenizer_from_description(
    desc: dict[str, Any], tiktoken_file: str | None = None, source: str | Path | None = None
) -> Tokenizer:
    """Rebuild the tokenizer a model was trained with from its ``describe()`` dict.

    What the ``source`` folder carries comes first, unless ``tiktoken_file`` overrides it. A gpt2
    model that recorded another ranks file's sha256 needs that very file.
    """
    # A model that records none (imported before exports carried GPT-2's): the ranks the user names make it gpt2.
    name = desc.get("name") or ("gpt2" if tiktoken_file or os.environ.get(TIKTOKEN_FILE_ENV) else None)
    if not name:
        raise UserError("the model records no tokenizer (no 'tokenizer' in its metadata); it cannot encode a prompt "
                        "(for GPT-2's vocabulary pass its ranks with --tiktoken-file)")
    if tiktoken_file and name != "gpt2":  # a flag that would do nothing is a mistake, not a silent no-op
        raise UserError(f"--tiktoken-file gives GPT-2 ranks, but this model's tokenizer is {name!r}; drop the flag")
    if source is not None and not tiktoken_file:
        carried = tokenizer_from_folder(source, desc)
        if carried is not None:
            return carried
    if name == "hf":  # a tokenizer.json exists only where the model carries it (a present one returned above)
        recorded = desc.get("tokenizer_sha256")
        which = f" (sha256 {str(recorded)[:16]}...)" if recorded else ""
        where = f"'{source}'" if source is not None else "the model folder"
        raise UserError(f"the model's tokenizer is a Hugging Face tokenizer.json{which} that {where} does not carry; "
                        "copy the file the model was trained with into it as tokenizer.json")
    recorded = desc.get("tiktoken_sha256")
    if name == "gpt2" and recorded and recorded != GPT2_TIKTOKEN_SHA256:
        tokenizer = build_tokenizer(name, tiktoken_file, expected_hash=None)
        if tokenizer.file_sha256 != recorded:
            raise UserError(
                f"the model was trained with a .tiktoken file of sha256 {recorded[:16]}..., not "
                f"{(tokenizer.file_sha256 or 'tiktoken default')[:16]}...; pass that file with --tiktoken-file"
            )
        return tokenizer
    return build_tokenizer(name, tiktoken_file)


def model_tokenizer(loaded: LoadedModel, tiktoken_file: str | None = None) -> Tokenizer:
    """The tokenizer a loaded model carries (``tiktoken_file`` overrides it), checked against its vocabulary."""
    tokenizer = tokenizer_from_description(loaded.tokenizer, tiktoken_file, export_source(loaded))
    if tokenizer.vocab_size > loaded.args.vocab_size:
        raise UserError(
            f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens but the model only "
            f"{loaded.args.vocab_size}; the checkpoint's tokenizer metadata is wrong"
        )
    return tokenizer


def generate_text(
    source: str | Path | LoadedModel,
    prompt: str,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 1337,
    device: str = "cpu",
    tiktoken_file: str | None = None,
) -> tuple[str, Generation]:
    """Encode ``prompt``, sample a continuation, decode; returns (prompt + continuation, Generation)."""
    check_sampling(max_new_tokens, temperature, top_k, seed)
    try:  # a command line's bytes that are not UTF-8 arrive as lone surrogates, which no tokenizer encodes
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"the prompt is not UTF-8 text (character {e.start + 1} is {prompt[e.start]!r}, a byte that "
                        "is not UTF-8); give the prompt as UTF-8") from None
    loaded = as_loaded(source, device)
    tokenizer = model_tokenizer(loaded, tiktoken_file)
    # An empty prompt starts from end-of-text, the document boundary the model was trained on.
    prompt_ids = tokenizer.encode(prompt)
    result = generate_tokens(loaded.model, prompt_ids or [tokenizer.eot_id], max_new_tokens, temperature, top_k, seed,
                             eot_id=tokenizer.eot_id, vocab_limit=tokenizer.vocab_size)
    # The new text is the decoded whole less the decoded prompt: decoding the new ids alone loses what a decoder
    # does at the join (a WordLevel or SentencePiece tokenizer.json puts the space between words, or drops a word's
    # leading marker, only inside one decode). A new document's text starts with the first new token.
    head = tokenizer.decode(prompt_ids)
    whole = tokenizer.decode([*prompt_ids, *result.new_tokens])
    new = whole[len(head):] if prompt_ids and whole.startswith(head) else tokenizer.decode(result.new_tokens)
    return prompt + new, result


def stop_note(result: Generation, max_seq_len: int) -> str | None:
    """A line for stderr when sampling stopped before max_new_tokens, else None."""
    if result.stop_reason == STOP_EOT:
        return f"[stopped at end-of-text after {len(result.new_tokens)} tokens]"
    if result.stop_reason == STOP_CONTEXT:
        return (
            f"[stopped after {len(result.new_tokens)} tokens: the model's context of max_seq_len={max_seq_len} "
            "positions is full]"
        )
    return None
