"""``TorchnlqLM``: a torchnlq checkpoint or export as an lm-evaluation-harness model.

Importing this module registers the class in lm-eval's model registry as ``torchnlq``. What the
three request types compute is in docs/checkpoints.md, "lm-evaluation-harness".
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval imports its own models only into an empty registry)
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from torchnlq.errors import UserError
from torchnlq.inference.multiple_choice import DEFAULT_BATCH_SIZE, model_tokenizer, score_continuations
from torchnlq.inference.sampling import generate_tokens
from torchnlq.interop.load import LoadedModel, as_loaded

MODEL_NAME = "torchnlq"
DEFAULT_MAX_GEN_TOKS = 256
# lm-eval adds these to every model's arguments; they mean nothing for a torchnlq folder
# (its weights are safetensors or DCP tensors, its code is torchnlq's own: nothing remote runs).
IGNORED_ARGS = ("trust_remote_code", "max_batch_size")

log = logging.getLogger(__name__)


def _int_arg(name: str, value: Any, minimum: int) -> int:
    """An integer model argument (lm-eval hands them over as ints or strings), at least ``minimum``."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):  # True is an int to Python, not to a user
        raise UserError(f"model argument {name}={value!r} must be an integer")
    if value < minimum:
        raise UserError(f"model argument {name}={value} must be at least {minimum}")
    return value


def _batch_size(value: Any, max_batch_size: Any) -> int:
    """lm-eval's batch size: an integer, or ``auto``/``auto:N`` (no tuning here: the default, capped)."""
    if value is None:
        return DEFAULT_BATCH_SIZE
    if isinstance(value, str) and value.strip().startswith("auto"):
        cap = DEFAULT_BATCH_SIZE if max_batch_size is None else _int_arg("max_batch_size", max_batch_size, 1)
        return min(DEFAULT_BATCH_SIZE, cap)
    return _int_arg("batch_size", value, 1)


@register_model(MODEL_NAME)
class TorchnlqLM(LM):
    """Any torchnlq checkpoint or export (every query type) behind lm-eval's ``LM`` interface."""

    def __init__(
        self,
        path: str | Path | LoadedModel | None = None,
        device: str | None = None,
        batch_size: int | str | None = None,
        max_gen_toks: int | str = DEFAULT_MAX_GEN_TOKS,
        tiktoken_file: str | None = None,
        seed: int | str = 1234,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        unknown = sorted(k for k in kwargs if k not in IGNORED_ARGS)
        if unknown:
            known = "path, device, batch_size, max_gen_toks, tiktoken_file, seed"
            raise UserError(f"unknown model argument(s) {', '.join(unknown)} for model {MODEL_NAME} (known: {known})")
        if path is None or path == "":
            raise UserError(f"model {MODEL_NAME} needs a checkpoint or export: --model_args path=CKPT_OR_EXPORT")
        self.batch_size = _batch_size(batch_size, kwargs.get("max_batch_size"))
        self.max_gen_toks = _int_arg("max_gen_toks", max_gen_toks, 1)
        self.seed = _int_arg("seed", seed, 0)
        # A path made of digits arrives as an int from lm-eval's key=value parser.
        source = path if isinstance(path, LoadedModel) else str(path)
        self.loaded = as_loaded(source, "cpu" if device is None else str(device))
        self.model = self.loaded.model
        self.tokenizer = model_tokenizer(self.loaded, tiktoken_file)

    @property
    def max_length(self) -> int:
        """The model's context: ``max_seq_len`` positions."""
        return self.model.args.max_seq_len

    @property
    def eot_token_id(self) -> int:
        """The tokenizer's end-of-text id: the context of an empty prompt."""
        return self.tokenizer.eot_id

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer's name, for lm-eval's request-cache fingerprints."""
        return f"torchnlq-{self.tokenizer.name}"

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records in its results' ``config`` about this model."""
        return {
            "torchnlq_path": str(self.loaded.path),
            "torchnlq_kind": self.loaded.kind,
            "torchnlq_step": self.loaded.record.step if self.loaded.record else None,
            "torchnlq_query": self.model.args.query.type,
        }

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The token ids of a loglikelihood request: the context's trailing whitespace moves to the continuation."""
        stripped = context.rstrip()
        if stripped != context:
            continuation = context[len(stripped):] + continuation
            context = stripped
        return self.tokenizer.encode(context) or [self.eot_token_id], self.tokenizer.encode(continuation)

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log P(continuation | context), is greedy) of each ``(context, continuation)`` request."""
        pairs = [self.encode_pair(*req.args) for req in requests]
        scores = score_continuations(self.model, pairs, self.batch_size, vocab_limit=self.tokenizer.vocab_size)
        results = [(score.logprob, score.greedy) for score in scores]
        for req, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """log P(text) of each ``(text,)`` request: disjoint windows after end-of-text, every token predicted once."""
        windows: list[tuple[list[int], list[int]]] = []
        owner: list[int] = []
        for i, req in enumerate(requests):
            ids = self.tokenizer.encode(req.args[0])
            for window in get_rolling_token_windows(ids, self.eot_token_id, self.max_length, context_len=1):
                windows.append(make_disjoint_window(window))
                owner.append(i)
        scores = score_continuations(self.model, windows, self.batch_size, vocab_limit=self.tokenizer.vocab_size)
        totals = [0.0] * len(requests)
        for i, score in zip(owner, scores):
            totals[i] += score.logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """The continuation of each ``(context, gen_kwargs)`` request (greedy unless ``do_sample``)."""
        results = []
        for req in requests:
            context, kwargs = req.args[0], dict(req.args[1] or {})
            until = kwargs.pop("until", None)
            until = [until] if isinstance(until, str) else [u for u in (until or []) if isinstance(u, str) and u]
            max_gen = _int_arg("max_gen_toks", kwargs.pop("max_gen_toks", self.max_gen_toks), 1)
            do_sample = bool(kwargs.pop("do_sample", False))
            temperature = float(kwargs.pop("temperature", 1.0))
            top_k = kwargs.pop("top_k", None)
            top_k = None if top_k in (None, 0, -1) else _int_arg("top_k", top_k, 1)
            if kwargs:
                log.debug("torchnlq generate_until ignores %s", sorted(kwargs))
            keep = self.max_length - min(max_gen, self.max_length // 2)
            ids = (self.tokenizer.encode(context) or [self.eot_token_id])[-keep:]
            new = generate_tokens(self.model, ids, max_gen, temperature if do_sample else 0.0, top_k, self.seed,
                                  eot_id=self.eot_token_id, vocab_limit=self.tokenizer.vocab_size,
                                  stop_when=lambda new: any(u in self.tokenizer.decode(new) for u in until)).new_tokens
            text = self.tokenizer.decode(new)
            text = text[:min((text.find(u) for u in until if u in text), default=len(text))]
            self.cache_hook.add_partial("generate_until", req.args, text)
            results.append(text)
        return results
