"""What a device can do and what a process holds: the dense bf16 peaks for MFU, peak and resident memory.

Read by the training loop's metrics and by the benchmarks; nothing here logs or writes.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import torch

# Dense bf16 peak TFLOP/s (no sparsity) by a substring of torch.cuda.get_device_name().
# Order matters: the first match wins, so more specific names come first.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("RTX 5090", 209.5),
    ("RTX 4090", 165.2),
    ("A100", 312.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("B200", 2250.0),
]


def peak_tflops(device: torch.device, configured: float | None) -> float | None:
    """The peak for MFU: the configured value, else the table; None when unknown (no guess)."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((value for key, value in PEAK_BF16_TFLOPS if key in name), None)


def memory_label(device: torch.device) -> str:
    """What :func:`peak_memory_gib` measures, as the console line names it."""
    return "peak alloc" if device.type == "cuda" else "peak rss"


def resident_bytes() -> int:
    """The process's resident memory now (Linux: /proc/self/statm), else its peak so far."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return int(peak_memory_gib(torch.device("cpu")) * 2**30)


def format_memory(nbytes: float) -> str:
    """Bytes as the memory estimate writes them: GiB from 1 GiB, MiB below."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory so far: the CUDA allocator's on GPU, the process's max RSS (the whole process) on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30
