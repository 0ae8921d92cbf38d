#!/usr/bin/env python
"""Time full training steps of a config (tokens/s, ms, TFLOP/s, MFU, memory, data share); see docs/performance.md.

Usage: python scripts/bench.py CONFIG [--section.key=value ...] [--steps N] [--warmup N] [--json OUT]
                               [--autocast config|bf16|fp32] [--real-data] [--compare "label: --k=v ..." ...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.train_step import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
