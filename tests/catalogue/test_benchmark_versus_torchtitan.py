"""The catalogue's rows of ``python -m benchmarks.versus_torchtitan``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from catalogue.rows import Inputs, Mistake, row, write
from catalogue.runner import Launches, check_in_process, check_in_subprocess

ENTRY = "benchmarks.versus_torchtitan"  # python -m benchmarks.versus_torchtitan, from the repository root

#: A folder with the files the benchmark looks for, whose trainer does not import.
TORCHTITAN = {"tt/torchtitan/__init__.py": "", "tt/torchtitan/train.py": "",
              "tt/torchtitan/models/llama3/config_registry.py": ""}

IN_PROCESS = [
    row(ENTRY, "no-torchtitan-folder", [], "the following arguments are required: --torchtitan"),
    row(ENTRY, "folder-without-torchtitan", ["--torchtitan", "{tmp}"],
        "holds no torchtitan package (torchtitan/train.py)"),
    row(ENTRY, "steps-not-a-pair", ["--torchtitan", "{tmp}/tt", "--steps", "8"],
        "--steps '8': expected LONG,SHORT such as 8,2", setup=write(TORCHTITAN)),
    row(ENTRY, "short-not-below-long", ["--torchtitan", "{tmp}/tt", "--steps", "2,8"],
        "need 1 <= SHORT < LONG", setup=write(TORCHTITAN)),
    row(ENTRY, "zero-rounds", ["--torchtitan", "{tmp}/tt", "--rounds", "0"],
        "--rounds must be at least 1, got 0", setup=write(TORCHTITAN)),
    row(ENTRY, "torchtitan-dependencies-missing", ["--torchtitan", "{tmp}/tt"],
        "'import torchtitan.trainer' failed", setup=write(TORCHTITAN)),
]

SUBPROCESS = [
    row(ENTRY, "torchtitan-folder-missing", ["--torchtitan", "{tmp}/nowhere"],
        "holds no torchtitan package (torchtitan/train.py)"),
]


@pytest.mark.parametrize("mistake", IN_PROCESS)
def test_mistake(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    check_in_process(mistake, inputs, tmp_path, clean_env, capsys)


@pytest.mark.integration
@pytest.mark.parametrize("mistake", SUBPROCESS)
def test_mistake_in_a_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
    check_in_subprocess(mistake, request, launched)
