"""The catalogue's rows of ``python -m benchmarks.inference_speed``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.inference_speed"  # python -m benchmarks.inference_speed, from the repository root

IN_PROCESS = [
    row(ENTRY, "zero-batch", ["--batch", "0"], "--batch must be at least 1, got 0"),
    row(ENTRY, "heads-do-not-divide-dim", ["--heads", "5"], "--heads 5 must divide --dim 768"),
    row(ENTRY, "kv-heads-do-not-divide-heads", ["--kv-heads", "5"], "--kv-heads 5 must divide --heads 12"),
    row(ENTRY, "json-is-a-folder", ["--json", "{tmp}"], "is a folder; name a file"),
    row(ENTRY, "unknown-variant", ["--variants", "quadratic"], "invalid choice: 'quadratic'"),
    row(ENTRY, "cuda-without-a-gpu", ["--device", "cuda"], "no CUDA device is visible", needs_no_cuda=True),
]

SUBPROCESS = [
    row(ENTRY, "zero-decode-steps", ["--decode", "0"], "--decode must be at least 1, got 0"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
