"""The catalogue as one table: every row of every entry point's file is its own mistake, every entry point has
rows (one of them a real process), and the subprocess rows, run side by side, leave the shared inputs alone."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from catalogue.rows import P, Inputs, Mistake
from catalogue.runner import ENTRIES, Launches, assert_unchanged, snapshot

HERE = Path(__file__).parent


def row_files() -> list[ModuleType]:
    """Every test file of the catalogue but this one (the modules pytest imported, or imports now)."""
    return [importlib.import_module(f"catalogue.{path.stem}") for path in sorted(HERE.glob("test_*.py"))
            if path.stem != Path(__file__).stem]


def _mistakes(params: list[Any]) -> list[Mistake]:
    return [p.values[0] for p in params]


def test_the_catalogue_has_at_least_120_distinct_mistakes() -> None:
    """Every row is its own mistake (command line and environment), and every entry point has rows."""
    files = row_files()
    assert len(files) >= 20, [f.__name__ for f in files]
    in_process = [p for f in files for p in f.IN_PROCESS]
    subprocess = [p for f in files for p in f.SUBPROCESS]
    rows = _mistakes(in_process) + _mistakes(subprocess)
    keys = [m.key() for m in rows]
    duplicates = sorted({str(k) for k in keys if keys.count(k) > 1})
    assert not duplicates, duplicates
    assert len(set(keys)) >= 120, len(set(keys))
    ids = [p.id for p in in_process + subprocess]
    assert len(set(ids)) == len(ids)
    assert {m.entry for m in rows} == set(ENTRIES), set(ENTRIES) - {m.entry for m in rows}
    assert {m.entry for m in _mistakes(subprocess)} >= set(ENTRIES) - {P}  # each script once as a real process
    for file in files:  # one file per entry point (run_train.sh's holds its NGPU=2 preflight too)
        entries = {m.entry for m in _mistakes(file.IN_PROCESS + file.SUBPROCESS)} - {P}
        assert len(entries) == 1, (file.__name__, entries)


@pytest.mark.integration
def test_subprocess_rows_leave_the_shared_inputs_alone(inputs: Inputs, launched: Launches) -> None:
    """The processes run side by side: the shared inputs are compared once, after all of them ended."""
    for state in launched.rows.values():
        state.outcome.result()
    assert_unchanged(launched.inputs_before, snapshot(inputs.root))
