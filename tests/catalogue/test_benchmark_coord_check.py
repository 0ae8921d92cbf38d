"""The catalogue's rows of ``python -m benchmarks.coord_check``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.coord_check"  # python -m benchmarks.coord_check, from the repository root

IN_PROCESS = [
    row(ENTRY, "widths-not-numbers", ["--widths", "64,wide"], "--widths '64,wide': give whole numbers"),
    row(ENTRY, "one-width", ["--widths", "64"], "--widths needs two or more widths"),
    row(ENTRY, "zero-steps", ["--widths", "32,64", "--steps", "0"], "--steps, --batch and --seq at least 1"),
    row(ENTRY, "negative-lr", ["--widths", "32,64", "--lr", "-1"], "--lr above 0"),
    row(ENTRY, "a-width-the-heads-do-not-divide", ["--widths", "32,50", "--model.n_heads=4"],
        "model.n_heads=4 does not divide model.dim=50"),
    row(ENTRY, "unknown-option", ["--widths", "32,64", "--model.parametrisation=mup"],
        "unknown key 'model.parametrisation'"),
]

SUBPROCESS = [
    row(ENTRY, "config-not-found", ["no_such.toml", "--widths", "32,64"], "config file 'no_such.toml' not found"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
