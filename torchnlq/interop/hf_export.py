"""Export any torchnlq model as a Hugging Face transformers folder (``scripts/convert_checkpoint.py --format hf``).

It loads with ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` without torchnlq: it
carries the model's code (:mod:`torchnlq.interop.ship_code`); the weights keep torchnlq's names under ``model.``.
"""

from __future__ import annotations

import ast
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

import torch

from torchnlq.checkpoint.metadata import CONFIG_FILE, WEIGHTS_FILE
from torchnlq.interop.export import (
    DTYPE_NAMES,
    HF_EXPORT_FILE,
    cast_weights,
    end_of_text_id,
    export_folder,
    export_source,
    hf_config_base,
    prepare_export,
    run_metadata,
    write_json,
)
from torchnlq.interop.load import LoadedModel
from torchnlq.interop.ship_code import WRAPPER_SOURCE, export_code
from torchnlq.interop.tokenizer_files import carried_bos_id
from torchnlq.models.args import ModelArgs

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


def hf_config(args: ModelArgs, tokenizer: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """config.json: every ModelArgs field (defaults included: the file does not rely on the copied code's
    defaults) under its TorchnlqConfig name (``CONFIG_NAMES``, else its own), plus what transformers reads."""
    values = {k: v for k, v in asdict(args).items() if k not in wrapper_constant("NOT_IN_CONFIG")}
    names = wrapper_constant("CONFIG_NAMES")
    return {
        **{names.get(k, k): v for k, v in values.items()},
        **hf_config_base(args, tokenizer, dtype, "TorchnlqForCausalLM", "torchnlq"),
        "auto_map": dict(AUTO_MAP),
    }


def export_hf(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write a transformers folder for any torchnlq model (checkpoint, export or :class:`LoadedModel`); return its
    path. docs/checkpoints.md lists its files; generation_config.json makes end-of-text stop generation and pad
    finished rows (written when its id is in the vocabulary); BOS is the carried tokenizer's own, where it names
    one (a Llama's), else end-of-text."""
    from safetensors.torch import save_file

    loaded, target = prepare_export(source, dtype)
    # a plugin that cannot travel: refused before any write
    code = export_code(loaded.args.query.type, loaded.args.family)
    weights = {f"model.{k}": v for k, v in loaded.model.state_dict().items()}
    # code_files: what --overwrite may replace.
    extra = {**run_metadata(loaded), "dtype": DTYPE_NAMES[target], "code_files": sorted(code)}
    eot = end_of_text_id(loaded.args, loaded.tokenizer)
    with export_folder(loaded, out_dir, overwrite) as tmp:
        save_file(cast_weights(weights, target), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        for name, text in code.items():
            (tmp / name).write_text(text, encoding="utf-8")
        bos = carried_bos_id(loaded.tokenizer, export_source(loaded), loaded.args.vocab_size)  # files written now
        if eot is not None:
            write_json(tmp / "generation_config.json", {"bos_token_id": eot if bos is None else bos,
                                                        "eos_token_id": eot, "pad_token_id": eot})
        write_json(tmp / HF_EXPORT_FILE, extra)
        config = hf_config(loaded.args, loaded.tokenizer, target)
        write_json(tmp / CONFIG_FILE, config | ({"bos_token_id": bos} if bos is not None else {}))
    return Path(out_dir).expanduser()
