#!/usr/bin/env python
"""torchnlq against torchtitan's train.py at the matched shape, whole programs (benchmarks/versus_torchtitan.py).

Usage: python scripts/bench_torchtitan.py --torchtitan PATH [--rounds N] [--steps LONG,SHORT]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.versus_torchtitan import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
