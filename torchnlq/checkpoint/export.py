"""Export a model to a safetensors folder (``model.safetensors`` + ``config.json`` + ``tokenizer_config.json``).

The folder is what :func:`torchnlq.checkpoint.load.load_model` reads back; it is written
into a temporary sibling and renamed into place, so a reader never sees half an export.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from torchnlq.checkpoint.load import LoadedModel, as_loaded
from torchnlq.checkpoint.metadata import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    FORMAT_KEYS,
    FORMAT_VERSION,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
)
from torchnlq.errors import UserError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def atomic_folder(out_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``out_dir``; rename it to ``out_dir`` when the block succeeds.

    A reader never sees a half-written export, and a failure leaves nothing
    behind. An existing ``out_dir`` is a UserError unless ``overwrite``.
    """
    final = Path(out_dir).expanduser()
    if final.exists() and not overwrite:
        raise UserError(f"'{out_dir}' already exists; choose another output folder or remove it")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def parse_dtype(name: str) -> torch.dtype:
    """``fp32`` / ``bf16`` / ``fp16`` -> torch dtype (UserError otherwise)."""
    if name not in DTYPES:
        raise UserError(f"unknown dtype '{name}'; choose one of: {', '.join(DTYPES)}")
    return DTYPES[name]


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Pretty, key-sorted JSON with a final newline (diff-friendly)."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def export_safetensors(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write ``out_dir`` with model.safetensors, config.json and tokenizer_config.json; return its path.

    A tied LM head is the token embedding itself: the state dict holds it once
    (``tok_emb.weight``, no ``lm_head.weight``) and ``tie_embeddings`` in the
    model_args restores the sharing. ``config.json`` keeps the run's
    ``seq_len``, ``validation`` and data metadata so evaluation can use them.
    """
    from safetensors.torch import save_file

    from torchnlq.version import __version__

    target = parse_dtype(dtype)
    loaded = as_loaded(source)
    state = {k: v.detach().to("cpu", target).contiguous() for k, v in loaded.model.state_dict().items()}
    run_meta = {k: v for k, v in loaded.meta.items() if k not in ("model_args", "tokenizer", *FORMAT_KEYS)}
    config = {
        **run_meta,
        "format": EXPORT_FORMAT,
        "format_version": FORMAT_VERSION,
        "torchnlq_version": __version__,
        "dtype": dtype,
        "source": str(loaded.path),
        "model_args": loaded.args.to_dict(),
        "tokenizer": loaded.tokenizer,
    }
    with atomic_folder(out_dir, overwrite) as tmp:
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "torchnlq_format": EXPORT_FORMAT})
        write_json(tmp / TOKENIZER_FILE, loaded.tokenizer)
        write_json(tmp / CONFIG_FILE, config)  # last: is_export() keys on it
    return Path(out_dir).expanduser()
