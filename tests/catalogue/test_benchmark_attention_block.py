"""The catalogue's rows of ``python -m benchmarks.attention_block``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.attention_block"  # python -m benchmarks.attention_block, from the repository root

#: The attention block at a tiny shape.
ATTENTION = ("--dim", "32", "--heads", "4", "--seq", "8", "--steps", "1", "--warmup", "0")

IN_PROCESS = [
    row(ENTRY, "heads-do-not-divide-dim", ["--dim", "32", "--heads", "5"], "model.n_heads=5 does not divide model.dim=32"),
    row(ENTRY, "kv-heads-do-not-divide-heads", [*ATTENTION, "--kv-heads", "3"], "model.n_kv_heads=3 must be in 1..4"),
    row(ENTRY, "rope-with-an-odd-head-dim", ["--dim", "30", "--heads", "6", "--rope"], "needs an even head_dim"),
    row(ENTRY, "zero-dim", ["--dim", "0", "--heads", "4"], "model.dim=0 must be at least 1"),
    row(ENTRY, "zero-steps", ["--dim", "32", "--heads", "4", "--steps", "0"], "--steps must be at least 1"),
    row(ENTRY, "negative-batch", ["--dim", "32", "--heads", "4", "--batch", "-1"], "(got -1, "),
    row(ENTRY, "cuda-without-a-gpu", [*ATTENTION, "--device", "cuda"], "--device cuda asked for but no CUDA device",
        needs_no_cuda=True),
    row(ENTRY, "unknown-autocast", [*ATTENTION, "--autocast", "fp16"], "fp16"),
]

SUBPROCESS = [
    row(ENTRY, "zero-heads", ["--heads", "0"], "model.n_heads=0 does not divide model.dim=768"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
