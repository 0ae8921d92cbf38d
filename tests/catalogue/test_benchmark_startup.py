"""The catalogue's rows of ``python -m benchmarks.startup``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.startup"  # python -m benchmarks.startup, from the repository root

IN_PROCESS = [
    row(ENTRY, "zero-rounds", ["--rounds", "0"], "--rounds must be at least 1, got 0"),
    row(ENTRY, "only-an-unknown-command", ["--only", "sample"], "--only 'sample' names no command"),
]

SUBPROCESS = [
    row(ENTRY, "negative-rounds", ["--rounds", "-2"], "--rounds must be at least 1, got -2"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
