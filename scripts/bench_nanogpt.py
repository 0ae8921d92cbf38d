#!/usr/bin/env python
"""torchnlq against nanoGPT's train.py at a toy shape, whole programs (benchmarks/versus_nanogpt.py).

Usage: python scripts/bench_nanogpt.py --nanogpt PATH [--rounds N] [--steps LONG,SHORT] [--vocab gpt2|byte]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.versus_nanogpt import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
