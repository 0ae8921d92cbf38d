"""The catalogue's rows of ``python -m benchmarks.trainer_overhead``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.trainer_overhead"  # python -m benchmarks.trainer_overhead, from the repository root

IN_PROCESS = [
    row(ENTRY, "zero-steps", ["--steps", "0"], "--steps must be at least 1, got 0"),
    row(ENTRY, "zero-threads", ["--threads", "0"], "--threads must be at least 1, got 0"),
    row(ENTRY, "unknown-shape", ["--shape", "huge"], "argument --shape: invalid choice: 'huge'"),
]

SUBPROCESS = [
    row(ENTRY, "negative-rounds", ["--rounds", "-1"], "--rounds must be at least 1, got -1"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
