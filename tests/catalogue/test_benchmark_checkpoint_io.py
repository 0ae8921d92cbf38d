"""The catalogue's rows of ``python -m benchmarks.checkpoint_io``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from catalogue.rows import Inputs, Mistake, Setup, row
from catalogue.runner import Launches, check_in_process, check_in_subprocess, check_valid_command

ENTRY = "benchmarks.checkpoint_io"  # python -m benchmarks.checkpoint_io, from the repository root

IN_PROCESS = [
    row(ENTRY, "flavor-typo", ["--flavor", "gpt_smal"], "--flavor: unknown 'gpt_smal'; did you mean 'gpt_small'?"),
    row(ENTRY, "zero-repeats", ["--flavor", "debug", "--repeats", "0"], "--repeats must be at least 1, got 0"),
    row(ENTRY, "option-spelled-flavour", ["--flavour", "debug"], "--flavour"),
]

SUBPROCESS = [
    row(ENTRY, "negative-repeats", ["--flavor", "debug", "--repeats", "-1"], "--repeats must be at least 1, got -1"),
]

CONTROLS = [
    pytest.param(ENTRY, ["--flavor", "debug", "--repeats", "1"], None, id="bench-checkpoint"),
]


@pytest.mark.parametrize("mistake", IN_PROCESS)
def test_mistake(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    check_in_process(mistake, inputs, tmp_path, clean_env, capsys)


@pytest.mark.integration
@pytest.mark.parametrize("mistake", SUBPROCESS)
def test_mistake_in_a_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
    check_in_subprocess(mistake, request, launched)


@pytest.mark.parametrize(("entry", "argv", "setup"), CONTROLS)
def test_the_valid_command_works(entry: str, argv: list[str], setup: Setup | None, inputs: Inputs, tmp_path: Path,
                                 clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    check_valid_command(entry, argv, setup, inputs, tmp_path, clean_env, capsys)
