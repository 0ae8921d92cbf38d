#!/usr/bin/env python
"""Time the data loader alone (read_batch on a large uint16 memmap, warm and cold page cache).

Usage: python scripts/bench_loader.py [--file train.bin | --tokens 1e9] [--shapes 12x1024,1x1024] [--iters 200]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batch_reads import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
