"""Helpers shared by the tests (not test modules).

- ``helpers.train``: tiny trainer configs, ``run_train`` (the one way tests launch ./run_train.sh),
  TensorBoard scalars.
- ``helpers.data``: token folders, toy tiktoken files, the shared-data skip marker.
- ``helpers.checkpoints``: tiny models and trainer-like checkpoint folders, importing scripts/*.py.

Tests import them as ``from helpers.train import run_train``: pytest puts tests/ on sys.path
(``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
