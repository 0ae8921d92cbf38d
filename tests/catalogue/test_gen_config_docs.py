"""The catalogue's rows of ``python scripts/gen_config_docs.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from catalogue.rows import Inputs, Mistake, row
from catalogue.runner import Launches, check_in_process, check_in_subprocess

IN_PROCESS = [
    row("gen_config_docs.py", "option-typo", ["--chek"], "--chek"),
    row("gen_config_docs.py", "file-argument", ["docs/configs.md"], "docs/configs.md"),
]

SUBPROCESS = [
    row("gen_config_docs.py", "unknown-option", ["--write"], "--write"),
]


@pytest.mark.parametrize("mistake", IN_PROCESS)
def test_mistake(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    check_in_process(mistake, inputs, tmp_path, clean_env, capsys)


@pytest.mark.integration
@pytest.mark.parametrize("mistake", SUBPROCESS)
def test_mistake_in_a_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
    check_in_subprocess(mistake, request, launched)
