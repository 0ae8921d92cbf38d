"""The catalogue's rows of ``python -m benchmarks.train_step``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.train_step"  # python -m benchmarks.train_step, from the repository root

#: The benchmark's tiny config (tests/test_bench.py): a few milliseconds per step on a CPU.
BENCH = (
    "--model.flavor=debug", "--model.n_layers=1", "--model.dim=32", "--model.n_heads=2", "--training.seq_len=32",
    "--training.micro_batch_size=2", "--training.grad_accum_steps=2", "--training.device=cpu", "--data.tokenizer=byte",
)

IN_PROCESS = [
    row(ENTRY, "zero-steps", [*BENCH, "--steps", "0"], "--steps must be at least 1"),
    row(ENTRY, "steps-not-an-integer", [*BENCH, "--steps", "two"], "argument --steps: invalid int value: 'two'"),
    row(ENTRY, "steps-without-a-value", [*BENCH, "--steps"], "argument --steps: expected one argument"),
    row(ENTRY, "negative-warmup", [*BENCH, "--warmup", "-1"], "--warmup at least 0"),
    row(ENTRY, "unknown-autocast", [*BENCH, "--autocast=fp16"], "argument --autocast: invalid choice: 'fp16'"),
    row(ENTRY, "compare-with-an-unknown-key", [*BENCH, "--compare", "a: --model.query.typo=1"],
        "unknown key 'model.query.typo'"),
    row(ENTRY, "compare-labels-twice", [*BENCH, "--compare", "a: --training.steps=1", "--compare", "a: --training.steps=2"],
        "--compare labels must differ"),
    row(ENTRY, "compare-unclosed-quote", [*BENCH, "--compare", "a: --job.description='x"], "No closing quotation"),
    row(ENTRY, "compare-unknown-autocast", [*BENCH, "--compare", "a: --autocast=int8"], "--compare 'a': argument --autocast: invalid choice: 'int8'"),
    row(ENTRY, "json-into-a-folder", [*BENCH, "--json", "{tmp}"], "--json '{tmp}' is a folder"),
    row(ENTRY, "json-in-a-missing-folder", [*BENCH, "--json", "{tmp}/nowhere/bench.json"], "folder '{tmp}/nowhere' does not exist"),
    row(ENTRY, "config-file-missing", ["nowhere.toml", *BENCH], "config file 'nowhere.toml' not found"),
    row(ENTRY, "removed-fuse-kv", [*BENCH, "--model.query.type=linear", "--model.query.fuse_kv=true"],
        "model.query.fuse_kv was removed"),
    row(ENTRY, "real-data-missing", [*BENCH, "--real-data", "--data.path={tmp}/nowhere"],
        "data.path '{tmp}/nowhere' does not exist"),
    row(ENTRY, "cuda-without-a-gpu", [*BENCH, "--training.device=cuda"], "no CUDA device is visible", needs_no_cuda=True),
]

SUBPROCESS = [
    row(ENTRY, "warmup-not-an-integer", [*BENCH, "--warmup", "x"], "argument --warmup: invalid int value: 'x'"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
