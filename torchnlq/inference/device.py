"""The device a tool (evaluate.py, generate.py, the lm-eval adapter) loads a model on, checked to exist.

``interop.load.resolve_device`` reads the name (cpu, cuda, cuda:N, auto) and checks that CUDA is there at all;
a device index the machine lacks (``cuda:3`` on a one-GPU machine, ``cpu:1``) would otherwise reach the weights'
reader, whose refusal reads as a damaged model file. Said here, as what is wrong with the device.
"""

from __future__ import annotations

import torch

from torchnlq.errors import UserError
from torchnlq.interop.load import resolve_device


def tool_device(name: str | torch.device) -> torch.device:
    """``name`` resolved (``auto`` included) to a device this machine has; else one UserError about the device."""
    device = resolve_device(name) if isinstance(name, str) else name
    if device.type == "cpu" and device.index not in (None, 0):
        raise UserError(f"device '{name}' does not exist: the CPU is one device (cpu, or cpu:0); use --device cpu")
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            have = f"cuda:0 to cuda:{count - 1}" if count > 1 else "cuda:0" if count == 1 else "none"
            raise UserError(f"device '{name}' does not exist: this machine has {count} CUDA device"
                            f"{'s' if count != 1 else ''} ({have}); use one of them, or --device cpu")
    return device
