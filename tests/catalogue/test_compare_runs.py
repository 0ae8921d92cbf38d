"""The catalogue's rows of ``python scripts/compare_runs.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations


import pytest

from catalogue.rows import copy_of, folders, overwrite, row, write
from catalogue.runner import mistake_tests, valid_command_test

IN_PROCESS = [
    row("compare_runs.py", "x-axis-unknown", ["{runs}/a", "--baseline", "a", "--x", "epochs"],
        "argument --x: invalid choice: 'epochs'"),
    row("compare_runs.py", "x-without-a-value", ["{runs}/a", "--baseline", "a", "--x"],
        "argument --x: expected one argument"),
    row("compare_runs.py", "tokens-axis-without-world-size", ["{runs}/a", "--baseline", "a", "--x", "tokens"],
        "run 'a' records no world_size"),
    row("compare_runs.py", "baseline-not-given", ["{runs}/a"], "--baseline"),
    row("compare_runs.py", "run-folder-missing", ["{tmp}/nowhere", "--baseline", "{runs}/a"],
        "'{tmp}/nowhere' is neither a run folder (with run_info.json) nor a folder of runs"),
    row("compare_runs.py", "empty-folder-of-runs", ["{tmp}/empty", "--baseline", "{runs}/a"],
        "'{tmp}/empty' is neither a run folder", setup=folders("empty")),
    row("compare_runs.py", "baseline-not-a-run", ["{runs}/a", "--baseline", "nobody"],
        "baseline 'nobody' is neither the name of one of the runs nor a run folder"),
    row("compare_runs.py", "different-training-batches", ["{runs}/a", "{runs}/other_batches", "--baseline", "a"],
        "the runs saw different training batches"),
    row("compare_runs.py", "different-validation-sequences", ["{runs}/a", "{runs}/other_val", "--baseline", "a"],
        "the runs saw different validation sequences"),
    row("compare_runs.py", "no-common-validation-step", ["{runs}/a", "{runs}/late", "--baseline", "a"],
        "differ only in their seed but share no validation step"),
    row("compare_runs.py", "step-not-a-validation-step", ["{runs}/a", "{runs}/b", "--baseline", "a", "--step", "15"],
        "step 15 is not a validation step of every run"),
    row("compare_runs.py", "run-without-validation-losses", ["{runs}/a", "{runs}/no_tb", "--baseline", "a"],
        "has no validation losses (loss/val)"),
    row("compare_runs.py", "config-toml-corrupt", ["{runs}/a", "{tmp}/broken", "--baseline", "a"],
        "config.toml' is not valid TOML", setup=copy_of("{runs}/b", "broken", overwrite("config.toml", "[job\n"))),
    row("compare_runs.py", "run-info-corrupt", ["{runs}/a", "{tmp}/broken_info", "--baseline", "a"],
        "run_info.json' is not valid JSON", setup=copy_of("{runs}/b", "broken_info", overwrite("run_info.json", "{oops"))),
    row("compare_runs.py", "out-is-a-file", ["{runs}/a", "{runs}/b", "--baseline", "a", "--out", "{tmp}/notes.txt"],
        "--out '{tmp}/notes.txt' exists and is not a folder", setup=write({"notes.txt": "mine"})),
    row("compare_runs.py", "out-is-a-compared-run", ["{runs}/a", "{runs}/b", "--baseline", "a", "--out", "{runs}/b"],
        "is inside the run folder '{runs}/b' being compared"),
]

SUBPROCESS = [
    row("compare_runs.py", "baseline-of-another-data-order", ["{runs}/b", "--baseline", "{runs}/other_batches"],
        "the runs saw different training batches"),
]

CONTROLS = [
    pytest.param("compare_runs.py", ["{runs}/a", "{runs}/b", "--baseline", "a", "--out", "{tmp}/cmp"], None, id="compare"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)


test_the_valid_command_works = valid_command_test(CONTROLS)
