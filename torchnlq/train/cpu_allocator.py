"""On a CPU, keep freed memory in the process instead of handing it back to the kernel every step.

glibc munmaps large freed allocations, so each step page-faults its buffers back in, zero-filled
(docs/performance.md). ``TORCHNLQ_CPU_ALLOCATOR=default`` leaves glibc as it is.
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
    """Tell glibc to keep freed memory in the heap (call before a CPU run allocates); True when in effect."""
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
