"""The catalogue's rows of ``python -m benchmarks.cpu_allocator``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.cpu_allocator"  # python -m benchmarks.cpu_allocator, from the repository root

IN_PROCESS = [
    row(ENTRY, "no-config", ["--rounds", "2"], "give a config first"),
    row(ENTRY, "config-missing", ["{tmp}/nope.toml"], "config file '{tmp}/nope.toml' not found"),
    row(ENTRY, "rounds-zero", ["{config}", "--rounds", "0"], "--rounds must be at least 1, got 0"),
    row(ENTRY, "steps-not-a-number", ["{config}", "--steps", "few"], "argument --steps: invalid int value: 'few'"),
    row(ENTRY, "json-in-a-missing-folder", ["{config}", "--json", "{tmp}/no/such/out.json"],
        "must be a file in an existing folder"),
]

SUBPROCESS = [
    row(ENTRY, "warmup-negative", ["{config}", "--warmup", "-1"], "--warmup must be at least 0, got -1"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
