"""Checkpoint save/load timing (sync vs async); see benchmarks/checkpoint_io.py.

Usage: python scripts/bench_checkpoint.py [--flavor debug gpt_small] [--repeats 3]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks.checkpoint_io import main
from torchnlq.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
