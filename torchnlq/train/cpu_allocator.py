"""On a CPU, keep freed memory in the process instead of handing it back to the kernel every step.

glibc serves every allocation above its mmap threshold (128 KiB to 32 MiB, adaptive) with a
fresh ``mmap`` and returns it with ``munmap`` when freed; it also trims the heap's top when
more than the trim threshold is free. A training step frees and re-allocates the same large
buffers (activations, gradients, AdamW's temporaries) every step, so each step page-faults
them back in, zero-filled by the kernel: system time, not compute. ``mallopt(M_MMAP_MAX, 0)``
and a trim threshold at its maximum keep them in the heap for the next step, as the
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...`` environment variables would, but set from
Python once the process knows it trains on a CPU (CUDA memory is the caching allocator's, and
a GPU run's host allocations are small). Peak RSS stays at the step's peak between steps, which
a training process reaches every step anyway. docs/performance.md has the measurement.

``TORCHNLQ_CPU_ALLOCATOR=default`` leaves glibc as it is (e.g. to measure the difference).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

ENV = "TORCHNLQ_CPU_ALLOCATOR"
# mallopt parameters from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# mallopt takes a C int: the largest trim threshold it accepts (2 GiB of free heap top kept).
MAX_TRIM_THRESHOLD = 2**31 - 1

_applied = False


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed memory in the heap (once per process); True when that is in effect.

    False where it does not apply: not Linux/glibc, or ``TORCHNLQ_CPU_ALLOCATOR=default``.
    Call it before the large allocations of a CPU run (buffers allocated earlier keep their mmap).
    """
    global _applied
    if _applied:
        return True
    if os.environ.get(ENV, "keep") == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and friends have no mallopt: nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, MAX_TRIM_THRESHOLD) == 1
    return _applied
