"""Checkpoint save/load timing (sync vs async); see torchnlq/benchmarks/checkpoint_io.py."""

import sys

from torchnlq.benchmarks.checkpoint_io import main
from torchnlq.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
