"""The catalogue's rows of ``python -m benchmarks.checkpoint_io``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations


import pytest

from catalogue.rows import row
from catalogue.runner import mistake_tests, valid_command_test

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


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)


test_the_valid_command_works = valid_command_test(CONTROLS)
