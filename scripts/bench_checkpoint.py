"""Checkpoint save/load timing (sync vs async); see torchnlq/tools/checkpoint_bench.py."""

import sys

from torchnlq.cli import run_cli
from torchnlq.tools.checkpoint_bench import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
