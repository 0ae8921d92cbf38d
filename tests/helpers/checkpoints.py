"""Export/generate helpers: tiny models and checkpoint folders (tests/test_export.py, test_generate.py).

They mimic what the trainer writes: a DCP folder whose state dict holds the
model under "model" (beside optimizer and train state) plus torchnlq.json.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from torchnlq.config.job_config import Query
from torchnlq.models import Decoder, ModelArgs
from torchnlq.checkpoint.metadata import write_meta
from torchnlq.models import build_model

from helpers import REPO_ROOT
from helpers.data import write_token_folder

BYTE_TOKENIZER = {"name": "byte", "vocab_size": 257, "eot_id": 256}
VALIDATION = {"seed": 5, "micro_batch_size": 3, "sequences": 10}
SEQ_LEN = 16


def tiny_args(qtype: str = "linear", **kw: Any) -> ModelArgs:
    """A byte-vocabulary model small enough to build in milliseconds."""
    base: dict[str, Any] = dict(n_layers=2, dim=32, n_heads=4, vocab_size=320, max_seq_len=32, init_std=0.1)
    base.update(kw)
    return ModelArgs(**base, query=Query(type=qtype))


def tiny_model(qtype: str = "linear", seed: int = 0, **kw: Any) -> Decoder:
    """A tiny model with non-trivial norm gains (so a dropped gain would show in the logits)."""
    torch.manual_seed(seed)
    model = build_model(tiny_args(qtype, **kw))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model.eval()


def write_checkpoint(folder: Path, model: Decoder, **meta: Any) -> Path:
    """A checkpoint folder laid out as the trainer's: DCP {"model", "optimizer", "train_state"} + torchnlq.json."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long)).float().sum().backward()
    opt.step()  # a real optimizer state, with tensors, that loading must skip
    opt.zero_grad(set_to_none=True)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "train_state": {"step": 7, "tokens": 123}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(folder))
    full = {
        "step": 7,
        "model_args": model.args.to_dict(),
        "tokenizer": dict(BYTE_TOKENIZER),
        "seq_len": SEQ_LEN,
        "validation": dict(VALIDATION),
        "data_path": "unused",
        "data_fingerprint": "0123456789abcdef",
    }
    full.update(meta)
    write_meta(folder, full)
    return folder


def write_byte_data(folder: Path, n_train: int = 3000, n_val: int = 800, seed: int = 0) -> Path:
    """A prepared byte-tokenizer data folder (train.bin, val.bin, meta.json) of random text."""
    rng = np.random.default_rng(seed)
    train = rng.integers(32, 127, n_train).astype(np.uint16)
    val = rng.integers(32, 127, n_val).astype(np.uint16)
    train[-1] = val[-1] = 256
    return write_token_folder(folder, train, val, tokenizer="byte")


def load_script(name: str) -> ModuleType:
    """Import scripts/<name>.py as a module, to call its main(argv) in-process."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module
