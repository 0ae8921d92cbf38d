"""The catalogue's rows of ``python -m benchmarks.versus_torchtitan``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row, write
from catalogue.runner import mistake_tests

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


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
