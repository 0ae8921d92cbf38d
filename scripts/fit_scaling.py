#!/usr/bin/env python
"""Fit validation loss against training compute per query type: exponents, floors, crossing, a plot.

Usage: python scripts/fit_scaling.py RUN... [--at-flops C] [--out DIR] [--allow-different-data] [--allow-exact-fits]
See docs/experiments.md, "Scaling".
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.experiments.scaling import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli())
