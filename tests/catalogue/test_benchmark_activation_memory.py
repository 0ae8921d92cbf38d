"""The catalogue's rows of ``python -m benchmarks.activation_memory``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.activation_memory"  # python -m benchmarks.activation_memory, from the repository root

IN_PROCESS = [
    row(ENTRY, "unknown-query", ["--query", "mlp"], "model.query.type: unknown 'mlp'"),
    row(ENTRY, "heads-do-not-divide-dim", ["--heads", "3"], "model.n_heads=3 does not divide model.dim=256"),
    row(ENTRY, "zero-steps", ["--steps", "0"], "--steps must be at least 1, got 0"),
    row(ENTRY, "zero-threads", ["--threads", "0"], "--threads must be at least 1, got 0"),
    row(ENTRY, "zero-seq", ["--seq", "0"], "--seq must be at least 1, got 0"),
]

SUBPROCESS = [
    row(ENTRY, "negative-batch", ["--batch", "-1"], "--batch must be at least 1, got -1"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
