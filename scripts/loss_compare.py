#!/usr/bin/env python
"""Compare the per-step losses of two runs, read or trained (two run folders, configs or commits).

Usage: python scripts/loss_compare.py A B [--set KEY=VALUE ...] [--set-a ...] [--set-b ...]
                                       [--tolerance REL] [--assert-equal]
A and B: a run folder, a loss file (.json), a config (.toml) or REF:CONFIG (a config at a git commit).
See docs/training.md, "Loss regression".
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.experiments.loss_compare import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli())
