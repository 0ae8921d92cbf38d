"""The catalogue's rows of ``python -m benchmarks.gpu_check``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.gpu_check"  # python -m benchmarks.gpu_check, from the repository root

IN_PROCESS = [
    row(ENTRY, "cuda-without-a-gpu", ["--device", "cuda"], "for the CPU smoke mode run: ", needs_no_cuda=True),
    row(ENTRY, "unknown-query-type", ["--device", "cpu", "--query-types", "quadratic"], "--query-types: unknown 'quadratic'"),
    row(ENTRY, "query-type-misspelt", ["--device", "cpu", "--query-types", "residual-mlp"], "did you mean 'residual_mlp'?"),
    row(ENTRY, "query-types-without-a-value", ["--device", "cpu", "--query-types"], "argument --query-types: expected at least one argument"),
    row(ENTRY, "steps-zero", ["--device", "cpu", "--steps", "0"], "--steps must be at least 1, got 0"),
    row(ENTRY, "steps-not-a-number", ["--device", "cpu", "--steps", "two"], "argument --steps: invalid int value: 'two'"),
    row(ENTRY, "steps-without-a-value", ["--device", "cpu", "--steps"], "argument --steps: expected one argument"),
    row(ENTRY, "warmup-zero", ["--device", "cpu", "--warmup", "0"], "--warmup must be at least 1"),
    row(ENTRY, "unknown-device", ["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    row(ENTRY, "unknown-compile-backend", ["--device", "cpu", "--compile-backend", "tvm"], "argument --compile-backend: invalid choice: 'tvm'"),
    row(ENTRY, "json-is-a-folder", ["--device", "cpu", "--json", "{tmp}"], "is a folder"),
    row(ENTRY, "json-in-a-missing-folder", ["--device", "cpu", "--json", "{tmp}/no/such/out.json"], "does not exist"),
    row(ENTRY, "json-without-a-value", ["--device", "cpu", "--json"], "argument --json: expected one argument"),
    row(ENTRY, "config-missing", ["nowhere.toml", "--device", "cpu"], "config file 'nowhere.toml' not found"),
    row(ENTRY, "unknown-config-key", ["--device", "cpu", "--model.query.typo=1"], "unknown key 'model.query.typo'"),
    row(ENTRY, "fused-projection-of-a-linear-query", ["--device", "cpu", "--query-types", "linear",
        "--model.query.fuse_kv=true"], "model.query.fuse_kv was removed"),
]

SUBPROCESS = [
    row(ENTRY, "no-gpu", [], "no CUDA device is visible", needs_no_cuda=True),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
