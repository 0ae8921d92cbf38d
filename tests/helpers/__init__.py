"""Helpers shared by the tests (not test modules).

- ``helpers.train``: tiny trainer configs, ``run_train`` (the one way tests launch ./run_train.sh),
  TensorBoard scalars.
- ``helpers.data``: token folders, toy tiktoken files, the shared-data skip marker.
- ``helpers.checkpoints``: tiny models and trainer-like checkpoint folders, importing scripts/*.py.

Tests import them as ``from helpers.train import run_train``: pytest puts tests/ on sys.path
(``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# The optional sample data (GPT-2 ranks, Tiny Shakespeare, WikiText-2): $TORCHNLQ_SHARED_DATA, else
# ../shared/data beside the checkout. Tests that need a file skip without it.
SHARED_DATA = Path(os.environ.get("TORCHNLQ_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")

# The first lines of a `python -c` script in which torchnlq (even an installed copy) cannot be imported:
# what a Hugging Face user without torchnlq has.
WITHOUT_TORCHNLQ = """
import sys

class NoTorchnlq:  # installed before anything
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchnlq":
            raise ImportError("torchnlq is blocked in this test")
        return None

sys.meta_path.insert(0, NoTorchnlq())
"""
