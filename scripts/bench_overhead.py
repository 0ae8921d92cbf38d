#!/usr/bin/env python
"""What the trainer costs beyond the model: whole trainer runs against a bare step loop (benchmarks/trainer_overhead.py).

Usage: python scripts/bench_overhead.py [--shape toy|matched|debug] [--steps K] [--rounds N] [--threads T]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trainer_overhead import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
