"""Start from a pretrained model: read a Hugging Face GPT-2 or Llama folder, and give a linear-query model the
anchored query (:func:`upcycle`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from torchnlq.interop.load import LoadedModel, is_export, load_model, planned_model
from torchnlq.checkpoint.metadata import META_FILE
from torchnlq.config.job_config import Query
from torchnlq.data.tokenizer import BASE_VOCAB_SIZE, GPT2_EOT_ID
from torchnlq.interop.tokenizer_files import tokenizer_from_folder
from torchnlq.errors import UserError
from torchnlq.interop.hf_folder import hf_model_type
from torchnlq.interop.hf_gpt2 import read_hf_gpt2
from torchnlq.interop.hf_llama import read_hf_llama
from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT


def read_hf_model(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor], dict[str, Any]]:
    """(ModelArgs, torchnlq state dict in fp32, tokenizer description) of a Hugging Face GPT-2 or Llama folder."""
    folder = Path(path)
    kind = hf_model_type(folder)
    args, sd = read_hf_llama(folder) if kind == "llama" else read_hf_gpt2(folder)
    if any((folder / name).is_file() for name in ("vocab.json", "tokenizer.json")):
        return args, sd, tokenizer_from_folder(folder).describe()
    # save_pretrained of a model alone writes no tokenizer: GPT-2's vocabulary is taken to be GPT-2's, whose ranks
    # an export finds offline (--tiktoken-file, $TORCHNLQ_TIKTOKEN_FILE or tiktoken's cache) and carries on.
    gpt2 = {"name": "gpt2", "vocab_size": BASE_VOCAB_SIZE["gpt2"], "eot_id": GPT2_EOT_ID}
    return args, sd, gpt2 if args.vocab_size == BASE_VOCAB_SIZE["gpt2"] else {}


def check_carries_tokenizer(loaded: LoadedModel) -> None:
    """An imported model must bring a tokenizer into its export (generate.py has no other): else one line saying
    what to add to the source."""
    if not loaded.tokenizer.get("name"):
        raise UserError(
            f"'{loaded.path}' carries no tokenizer (no tokenizer.json or vocab.json) and its vocabulary "
            f"({loaded.args.vocab_size:,} ids) is not GPT-2's ({BASE_VOCAB_SIZE['gpt2']:,}), so --tiktoken-file "
            f"cannot supply one; save the model's tokenizer into it (tokenizer.save_pretrained('{loaded.path}'))"
        )


def _pretrained(source: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(args, state dict, tokenizer, run metadata) of a Hugging Face GPT-2/Llama folder or a torchnlq checkpoint/export."""
    path = Path(source)
    if not path.is_dir():
        raise UserError(f"'{source}' does not exist or is not a folder; pass a Hugging Face GPT-2 or Llama folder "
                        "or a torchnlq checkpoint or export")
    kind = hf_model_type(path)
    if kind is not None and not is_export(path):
        args, sd, tokenizer = read_hf_model(path)
        return args, sd, tokenizer, {"source": str(path), "imported_from": f"huggingface-{kind}"}
    if not (is_export(path) or (path / META_FILE).is_file()):
        raise UserError(f"'{source}' is neither a Hugging Face GPT-2 or Llama folder (config.json with model_type "
                        "'gpt2' or 'llama') nor a torchnlq checkpoint or export")
    loaded = load_model(path, "cpu")
    meta = {"source": str(path)}
    return loaded.args, {k: v.float() for k, v in loaded.model.state_dict().items()}, loaded.tokenizer, meta


def pretrained_weights(source: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, fp32 state dict) of a Hugging Face GPT-2/Llama folder or a torchnlq export/checkpoint."""
    args, state, _, _ = _pretrained(source)
    return args, state


def anchored_from_linear(source: ModelArgs, target: ModelArgs) -> bool:
    """True when ``target`` is ``source`` with its linear query made anchored (what upcycling loads)."""
    return source.query.type == "linear" and target.query.type == "anchored"


def upcycle(source: str | Path, query: Query | None = None, seed: int = 0) -> LoadedModel:
    """The pretrained model at ``source`` with the query ``query`` (None: as pretrained), as a LoadedModel.

    ``anchored`` keeps a linear source's W_Q as the anchor and draws f with ``seed`` (f = 0 at the
    start): the result's logits equal the source's.
    """
    args, sd, tokenizer, meta = _pretrained(source)
    if query is None or query.type == args.query.type == "linear" and query == args.query:
        target = args
    else:
        if args.query.type != "linear":
            raise UserError(f"'{source}' has a {args.query.type!r} query; upcycling needs a pretrained linear W_Q "
                            "(GPT-2's or Llama's, or a torchnlq model with model.query.type = 'linear')")
        if query.type not in ("linear", "anchored"):
            raise UserError(f"upcycling gives a pretrained model the 'anchored' query (or keeps it 'linear'), "
                            f"not {query.type!r}")
        target = dataclasses.replace(args, query=query)
        target.validate()
    shapes = {k: tuple(v.shape) for k, v in planned_model(target, torch.device("cpu"), source).state_dict().items()}
    branch = {"input_norm", "w1", "w2", "output_norm"}
    stray = [k for k in shapes if k not in sd and k.split(".")[-2] not in branch]
    unexpected = [k for k in sd if k not in shapes]
    if unexpected or stray:
        raise UserError(f"'{source}' does not fit the upcycled model (missing {stray[:3]}, unexpected "
                        f"{unexpected[:3]}); is it a linear-query model?")
    wrong = [k for k, v in sd.items() if tuple(v.shape) != shapes[k]]
    if wrong:
        raise UserError(f"'{source}': tensor '{wrong[0]}' has shape {tuple(sd[wrong[0]].shape)} but the upcycled "
                        f"model needs {shapes[wrong[0]]}; is it a linear-query model?")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            model = GPT(target)  # sized above: its weights fit this machine
    model.load_state_dict(sd, strict=False)
    model.eval()
    return LoadedModel(model, target, tokenizer, meta, Path(source), "python", None)
