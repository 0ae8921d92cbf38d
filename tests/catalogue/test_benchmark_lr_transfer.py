"""The catalogue's rows of ``python -m benchmarks.lr_transfer``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.lr_transfer"  # python -m benchmarks.lr_transfer, from the repository root

IN_PROCESS = [
    row(ENTRY, "no-such-folder", ["no_such_suite"], "no_such_suite is not a folder"),
    row(ENTRY, "a-folder-without-runs", ["."], "holds no finished run with a validation loss"),
    row(ENTRY, "no-folder", [], "the following arguments are required: suite"),
]

SUBPROCESS = [
    row(ENTRY, "a-file-not-a-folder", ["README.md"], "README.md is not a folder"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
