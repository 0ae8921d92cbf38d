"""Export any torchnlq model as a Hugging Face transformers folder (``scripts/convert_checkpoint.py --format hf``).

The folder loads with ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``
without torchnlq: it carries the model package's own files and the thin wrapper
(:mod:`torchnlq.interop.ship_code`), so every query type, block option and flavor that trains also
exports, plugins included. With torchnlq installed, :func:`torchnlq.interop.auto.register_auto_classes`
makes the Auto classes load it without remote code. The weights keep torchnlq's names under ``model.``,
so the conversion is a rename.
"""

from __future__ import annotations

import ast
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

import torch

from torchnlq.interop.export import (
    DTYPE_NAMES,
    HF_EXPORT_FILE,
    atomic_folder,
    cast_weights,
    check_export_folder,
    check_tokenizer_fits,
    export_source,
    parse_dtype,
    write_json,
)
from torchnlq.interop.load import LoadedModel, as_loaded
from torchnlq.checkpoint.metadata import CONFIG_FILE, FORMAT_KEYS, WEIGHTS_FILE
from torchnlq.interop.tokenizer_files import write_hf_tokenizer_files
from torchnlq.interop.ship_code import WRAPPER_SOURCE, export_code
from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT

AUTO_MAP = {
    "AutoConfig": "modeling_torchnlq.TorchnlqConfig",
    "AutoModelForCausalLM": "modeling_torchnlq.TorchnlqForCausalLM",
}


@cache
def wrapper_constant(name: str) -> Any:
    """A literal constant of the wrapper (``CONFIG_NAMES``, ``NOT_IN_CONFIG``), read from its source:
    writing an export needs no transformers."""
    for node in ast.parse(WRAPPER_SOURCE.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{WRAPPER_SOURCE} defines no {name}")


def hf_state_dict(model: GPT, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's weights as ``model.`` + torchnlq's names, in ``dtype``, on the CPU (a tied head is stored once)."""
    return cast_weights({f"model.{k}": v for k, v in model.state_dict().items()}, dtype)


def end_of_text_id(args: ModelArgs, tokenizer: dict[str, Any]) -> int | None:
    """The tokenizer's end-of-text id when it lies within the model's vocabulary, else None.

    transformers warns about (and generate() mishandles) a special id outside the vocabulary.
    """
    eot = tokenizer.get("eot_id")
    return eot if isinstance(eot, int) and 0 <= eot < args.vocab_size else None


def hf_config(args: ModelArgs, tokenizer: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """config.json: every ModelArgs field under its TorchnlqConfig name (transformers' usual name where
    ``CONFIG_NAMES`` gives one, else its own), plus what transformers reads.

    Every field is written, defaults included (``to_dict`` leaves some defaults out), so the file
    says what the model is without relying on the defaults of the copied modeling code.
    """
    values = {k: v for k, v in asdict(args).items() if k not in wrapper_constant("NOT_IN_CONFIG")}
    names = wrapper_constant("CONFIG_NAMES")
    eot = end_of_text_id(args, tokenizer)
    return {
        **{names.get(k, k): v for k, v in values.items()},
        "architectures": ["TorchnlqForCausalLM"],
        "model_type": "torchnlq",
        "auto_map": dict(AUTO_MAP),
        "torch_dtype": DTYPE_NAMES[dtype],
        "bos_token_id": eot,
        "eos_token_id": eot,
        "use_cache": True,
    }


def generation_config(eot: int) -> dict[str, Any]:
    """generation_config.json: end-of-text stops generation and pads finished rows (as GPT-2 has no pad token)."""
    return {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}


def export_hf(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write a transformers folder for any torchnlq model; return its path.

    ``source`` is a checkpoint folder, an export folder or a :class:`LoadedModel`. The folder holds
    config.json (``model_type: torchnlq`` and the ``auto_map`` to the carried modeling_torchnlq.py),
    model.safetensors (in ``dtype``: fp32, bf16 or fp16), the code (:func:`export_code`),
    generation_config.json (when the tokenizer's end-of-text id is in the vocabulary),
    torchnlq_export.json (the run's metadata; it marks the folder as a torchnlq export) and the
    tokenizer files (``AutoTokenizer.from_pretrained`` encodes to the model's ids). It is written
    under a temporary name and renamed when complete (:func:`atomic_folder`).
    """
    from safetensors.torch import save_file

    from torchnlq.version import __version__

    target = parse_dtype(dtype)
    loaded = as_loaded(source)
    check_tokenizer_fits(loaded)
    code = export_code(loaded.args.query.type)  # a plugin that cannot travel is refused before anything is written
    check_export_folder(out_dir, export_source(loaded), overwrite)  # before converting the weights
    extra = {
        **{k: v for k, v in loaded.meta.items() if k not in ("model_args", *FORMAT_KEYS)},
        "torchnlq_version": __version__,
        "dtype": DTYPE_NAMES[target],
        "model_args": loaded.args.to_dict(),
        "tokenizer": loaded.tokenizer,
        "source": str(loaded.path),
        "code_files": sorted(code),  # what --overwrite may replace
    }
    eot = end_of_text_id(loaded.args, loaded.tokenizer)
    config = hf_config(loaded.args, loaded.tokenizer, target)
    with atomic_folder(out_dir, overwrite, export_source(loaded)) as tmp:
        # The tokenizer first: a gpt2 model whose ranks cannot be found fails before the weights are converted.
        write_hf_tokenizer_files(loaded.tokenizer, tmp, loaded.args.max_seq_len, export_source(loaded),
                                 loaded.tiktoken_file)
        save_file(hf_state_dict(loaded.model, target), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        for name, source in code.items():
            (tmp / name).write_text(source, encoding="utf-8")
        if eot is not None:
            write_json(tmp / "generation_config.json", generation_config(eot))
        write_json(tmp / HF_EXPORT_FILE, extra)
        write_json(tmp / CONFIG_FILE, config)
    return Path(out_dir).expanduser()
