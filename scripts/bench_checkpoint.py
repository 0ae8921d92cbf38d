"""Checkpoint save/load timing (sync vs async); see torchnlq/benchmarks/checkpoint_io.py."""

import sys

from torchnlq.cli import run_cli
from torchnlq.benchmarks.checkpoint_io import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
