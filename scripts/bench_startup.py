#!/usr/bin/env python
"""Start-up time of the commands against `python -c "import torch"` (benchmarks/startup.py).

Usage: python scripts/bench_startup.py [--rounds N] [--only NAME,...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.startup import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
