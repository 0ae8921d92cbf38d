"""The catalogue's rows of ``python -m benchmarks.activation_memory``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from catalogue.rows import Inputs, Mistake, row
from catalogue.runner import Launches, check_in_process, check_in_subprocess

ENTRY = "benchmarks.activation_memory"  # python -m benchmarks.activation_memory, from the repository root

IN_PROCESS = [
    row(ENTRY, "unknown-query", ["--query", "mlp"], "model.query.type: unknown 'mlp'"),
    row(ENTRY, "heads-do-not-divide-dim", ["--heads", "3"], "model.n_heads=3 does not divide model.dim=256"),
    row(ENTRY, "zero-steps", ["--steps", "0"], "--steps must be at least 1, got 0"),
    row(ENTRY, "zero-threads", ["--threads", "0"], "--threads must be at least 1, got 0"),
    row(ENTRY, "zero-seq", ["--seq", "0"], "--seq must be at least 1, got 0"),
]

SUBPROCESS = [
    row(ENTRY, "negative-batch", ["--batch", "-1"], "--batch must be at least 1, got -1"),
]


@pytest.mark.parametrize("mistake", IN_PROCESS)
def test_mistake(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    check_in_process(mistake, inputs, tmp_path, clean_env, capsys)


@pytest.mark.integration
@pytest.mark.parametrize("mistake", SUBPROCESS)
def test_mistake_in_a_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
    check_in_subprocess(mistake, request, launched)
