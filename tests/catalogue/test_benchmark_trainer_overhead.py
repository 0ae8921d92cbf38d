"""The catalogue's rows of ``python -m benchmarks.trainer_overhead``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from catalogue.rows import Inputs, Mistake, row
from catalogue.runner import Launches, check_in_process, check_in_subprocess

ENTRY = "benchmarks.trainer_overhead"  # python -m benchmarks.trainer_overhead, from the repository root

IN_PROCESS = [
    row(ENTRY, "zero-steps", ["--steps", "0"], "--steps must be at least 1, got 0"),
    row(ENTRY, "zero-threads", ["--threads", "0"], "--threads must be at least 1, got 0"),
    row(ENTRY, "unknown-shape", ["--shape", "huge"], "argument --shape: invalid choice: 'huge'"),
]

SUBPROCESS = [
    row(ENTRY, "negative-rounds", ["--rounds", "-1"], "--rounds must be at least 1, got -1"),
]


@pytest.mark.parametrize("mistake", IN_PROCESS)
def test_mistake(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    check_in_process(mistake, inputs, tmp_path, clean_env, capsys)


@pytest.mark.integration
@pytest.mark.parametrize("mistake", SUBPROCESS)
def test_mistake_in_a_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
    check_in_subprocess(mistake, request, launched)
