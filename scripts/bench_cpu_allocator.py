#!/usr/bin/env python
"""Training steps on the CPU with and without torchnlq's allocator setting, in alternating processes.

Usage: python scripts/bench_cpu_allocator.py CONFIG [--section.key=value ...] [--rounds 12] [--steps 3]
                                             [--warmup 1] [--json OUT]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_allocator import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
