#!/usr/bin/env python
"""Compare training runs: validation loss at the last common step, mean ± std over seeds, plots.

Usage: python scripts/compare_runs.py RUN... --baseline RUN [--out DIR] [--step N] [--x steps|tokens]
                                       [--allow-different-data]
See docs/experiments.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.experiments.compare import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli())
