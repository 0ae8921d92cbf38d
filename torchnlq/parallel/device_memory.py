"""How much memory a device has, and the least a model's training state needs there (no model is built)."""

from __future__ import annotations

import os

import torch

from torchnlq.errors import UserError
from torchnlq.models.args import ModelArgs
from torchnlq.models.counts import num_params

GIB = 2**30

#: fp32 weights, their gradients and AdamW's two moments: what a parameter holds at least while training.
STATE_BYTES_PER_PARAM = 16


def minimum_state_bytes(args: ModelArgs, world_size: int = 1) -> int:
    """A lower bound per process from the analytic parameter count alone (no model is built, nothing allocated)."""
    return num_params(args) * STATE_BYTES_PER_PARAM // world_size


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory a run on ``device`` can use: the GPU's, or the machine's RAM for the CPU (None if unknown)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_device(args: ModelArgs, device: torch.device, world_size: int = 1) -> None:
    """UserError before any allocation when the weights, gradients and optimizer state alone exceed the device."""
    limit = device_memory_bytes(device)
    need = minimum_state_bytes(args, world_size)
    if limit is not None and need > limit:
        where = "this machine's RAM" if device.type == "cpu" else f"the GPU's {limit / GIB:,.1f} GiB"
        raise UserError(
            f"the model has {num_params(args):,} parameters: {need / GIB:,.1f} GiB per process for weights, "
            f"gradients and AdamW state alone, more than {where} ({limit / GIB:,.1f} GiB); make the model smaller "
            "(model.n_layers, model.dim, model.vocab_size) or shard it over more processes"
        )
