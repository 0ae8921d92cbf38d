"""The benchmarks (``python -m benchmarks.NAME``): the training step and attention block ones (tables, interleaving,
ratios, JSON), the loader, start-up, trainer-overhead and torchtitan ones, and their one-line errors.

Only the mechanics are tested; no timing is asserted (the machine is shared).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchnlq.cli import run_cli
from torchnlq.errors import UserError
from benchmarks import attention_block as bench_attention
from benchmarks import train_step as bench
from benchmarks.train_step_args import parse_variant
from benchmarks.timing import interleave, long_short_steps

TINY = [
    "--model.flavor=debug", "--model.n_layers=1", "--model.dim=32", "--model.n_heads=2",
    "--model.query.type=residual_mlp", "--training.seq_len=32", "--training.micro_batch_size=2",
    "--training.grad_accum_steps=2", "--training.device=cpu", "--data.tokenizer=byte",
]
pytestmark = pytest.mark.usefixtures("one_torch_thread")

COLUMNS = ["variant", "precision", "compile", "tokens/step", "tokens/s", "step (ms)", "TFLOP/s", "MFU",
           "peak mem (MiB)", "data (%)", "step vs first"]


def table_rows(out: str) -> list[list[str]]:
    """The Markdown table's rows (header first, the |---| rule dropped) as stripped cells."""
    lines = [line for line in out.splitlines() if line.startswith("|") and not line.startswith("|-")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


@pytest.mark.integration  # builds the Trainer and times real train steps
def test_bench_prints_one_table(capsys):
    assert run_cli(bench.main, [*TINY, "--steps", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows[0] == COLUMNS and len(rows) == 2
    row = dict(zip(COLUMNS, rows[1]))
    assert row["variant"] == "base" and row["precision"] == "fp32" and row["compile"] == "off"
    assert row["tokens/step"] == "128"  # 2 sequences x 2 micro-steps x 32 tokens
    assert row["MFU"] == "–"  # no known peak for a CPU
    assert row["step vs first"] == "1.000×"
    assert float(row["peak mem (MiB)"]) > 0 and row["data (%)"].endswith("%")
    assert out.count("| variant |") == 1 and "load avg" in out


@pytest.mark.integration  # builds the Trainer and times real train steps
def test_compare_interleaves_and_writes_json(tmp_path, capsys, monkeypatch):
    order: list[str] = []
    timed = bench.Variant.timed_step

    def spy(self: bench.Variant) -> float:
        order.append(self.label)
        return timed(self)

    monkeypatch.setattr(bench.Variant, "timed_step", spy)
    out_json = tmp_path / "bench.json"
    argv = [*TINY, "--steps=3", "--warmup=0", "--json", str(out_json),
            "--compare", "lin: --model.query.type=linear",
            "--compare", "mlp: --model.query.type=residual_mlp --autocast=bf16"]
    assert run_cli(bench.main, argv) == 0
    # Interleaved: each round times every variant once (in a shuffled order).
    assert [sorted(order[k : k + 2]) for k in (0, 2, 4)] == [["lin", "mlp"]] * 3

    rows = table_rows(capsys.readouterr().out)
    assert [r[0] for r in rows[1:]] == ["lin", "mlp"]
    assert rows[1][-1] == "1.000×" and rows[2][-1].endswith("×")

    data = json.loads(out_json.read_text())
    assert {"config_args", "options", "machine", "variants"} <= data.keys()
    assert {"device", "torch", "threads", "load_avg_1m", "load_avg_1m_end"} <= data["machine"].keys()
    fields = {f.name for f in dataclasses.fields(bench.VariantResult)}
    lin, mlp = data["variants"]
    assert fields == lin.keys() == mlp.keys()
    assert (lin["label"], mlp["label"]) == ("lin", "mlp")
    assert mlp["overrides"] == ["--model.query.type=residual_mlp"] and mlp["precision"] == "bf16 autocast"
    assert len(lin["step_ms_all"]) == len(mlp["step_ms_all"]) == 3
    assert lin["step_time_ratio"] == 1.0
    paired = sorted(f / b for f, b in zip(mlp["step_ms_all"], lin["step_ms_all"]))
    assert mlp["step_time_ratio"] == pytest.approx(paired[1])  # median of the 3 per-round ratios
    assert lin["tokens_per_s"] == pytest.approx(lin["tokens_per_step"] / (lin["step_ms"] / 1000))
    assert lin["tflops"] == pytest.approx(lin["flops_per_token"] * lin["tokens_per_s"] / 1e12)
    assert lin["mfu"] is None and 0 <= lin["data_share"] < 1


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--steps", "0"], "--steps must be at least 1"),
        (["--steps", "two"], "argument --steps: invalid int value: 'two'"),
        (["--autocast=fp16"], "argument --autocast: invalid choice: 'fp16'"),
        (["--compare", "a: --model.query.typo=1"], "unknown key 'model.query.typo'"),
        (["--compare", "a: --training.steps=1", "--compare", "a: --training.steps=2"], "labels must differ"),
        (["--compare", "a: --autocast=int8"], "--compare 'a': argument --autocast: invalid choice: 'int8'"),
        (["--model.query.type=linear", "--model.query.fuse_kv=true"], "model.query.fuse_kv was removed"),
    ],
)
def test_user_errors_are_one_line(capsys, extra, message):
    assert run_cli(bench.main, [*TINY, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("linear: --model.query.type=linear", ("linear", ["--model.query.type=linear"], "config")),
        ("--model.query.type=identity", ("--model.query.type=identity", ["--model.query.type=identity"], "config")),
        ("bf: --autocast bf16 --training.compile true", ("bf", ["--training.compile", "true"], "bf16")),
        ("empty:", ("empty", [], "config")),
    ],
)
def test_parse_variant(spec, expected):
    assert parse_variant(spec, "config") == expected


def test_interleave_reports_after_each_round_with_that_round_done():
    seen: list[tuple[int, list[int]]] = []
    runs = [lambda i=i: float(i) for i in range(3)]
    interleave(runs, 4, after_round=lambda index, results: seen.append((index, [len(r) for r in results])))
    assert seen == [(k, [k + 1] * 3) for k in range(4)]


def test_interleave_shuffles_the_order_every_round():
    calls: list[int] = []
    runs = [lambda i=i: calls.append(i) or float(i) for i in range(4)]
    assert interleave(runs, 30) == [[float(i)] * 30 for i in range(4)]
    rounds = [calls[k : k + 4] for k in range(0, len(calls), 4)]
    assert all(sorted(r) == [0, 1, 2, 3] for r in rounds)  # each run exactly once per round
    # Every run follows every other run in some round (a cyclic order would give each run one predecessor).
    predecessors = {(r[k - 1], r[k]) for r in rounds for k in range(1, 4)}
    assert predecessors == {(a, b) for a in range(4) for b in range(4) if a != b}
    calls.clear()
    interleave(runs, 30)
    assert [calls[k : k + 4] for k in range(0, len(calls), 4)] == rounds  # seeded: the same orders again


def test_bench_attention_table(capsys):
    argv = ["--dim", "32", "--heads", "4", "--kv-heads", "2", "--rope", "--seq", "16", "--steps", "2", "--warmup", "1"]
    assert run_cli(bench_attention.main, argv) == 0
    rows = table_rows(capsys.readouterr().out)
    assert rows[0] == ["query", "params", "fwd (ms)", "fwd vs linear", "fwd+bwd (ms)", "fwd+bwd vs linear"]
    assert [r[0] for r in rows[1:]] == list(bench_attention.VARIANTS)
    assert rows[1][3] == "1.000×"


def test_bench_loader_table(capsys):
    from benchmarks import batch_reads as bench_loader

    assert bench_loader.main(["--tokens", "200000", "--shapes", "2x64,1x32", "--iters", "3"]) == 0
    out = capsys.readouterr().out
    assert "200,000 tokens" in out
    rows = table_rows(out)
    assert [r[:2] for r in rows[1:]] == [[shape, mode] for shape in ("2 x 64", "1 x 32") for mode in bench_loader.MODES]
    assert all(float(r[2]) > 0 and float(r[3]) >= float(r[2]) for r in rows[1:])


@pytest.mark.parametrize("argv,message", [
    (["--shapes", "12by1024"], "--shapes: expected pairs"),
    (["--shapes", "0x64"], "every --shapes size must be at least 1"),
    (["--file", "/nonexistent/train.bin"], "--file: no such file"),
    (["--tokens", "10"], "smaller than one micro-batch"),
])
def test_bench_loader_bad_input_is_one_line(argv, message, capsys):
    from benchmarks import batch_reads as bench_loader

    assert run_cli(bench_loader.main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--batch", "-1"], ["--seq", "0"], ["--warmup", "-1"]])
def test_bench_attention_bad_input_is_one_line(argv, capsys):
    assert run_cli(bench_attention.main, ["--dim", "32", "--heads", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be at least" in err


@pytest.mark.integration  # starts fresh Python processes
def test_bench_startup_times_the_reference_and_the_chosen_commands(capsys):
    from benchmarks import startup

    assert run_cli(startup.main, ["--rounds", "2", "--only", "generate --help"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert rows[0] == ["command", "wall (s)", "CPU (s)", "wall vs import torch"]
    assert [r[0] for r in rows[1:]] == ["import torch", "generate --help"]
    assert rows[1][3] == "1.00×"  # the reference against itself, round by round
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows[1:])


@pytest.mark.integration  # builds trainers and runs them
def test_bench_overhead_splits_a_trainer_step(capsys):
    from benchmarks import trainer_overhead

    assert run_cli(trainer_overhead.main, ["--shape", "debug", "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    loops, parts = (table_rows(block) for block in out.split("\n\n"))
    assert [r[0] for r in loops[1:]] == ["trainer", "bare"]
    named = {r[0]: float(r[1]) for r in parts[1:]}
    assert set(trainer_overhead.PARTS) < set(named)
    assert named["forward + loss"] > 0 and named["optimizer"] > 0 and named["data"] >= 0


def _fake_torchtitan(folder):
    """A folder that looks like a torchtitan install (the files the benchmark checks) but cannot train."""
    for name in ("torchtitan/__init__.py", "torchtitan/train.py", "torchtitan/models/llama3/config_registry.py"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("")
    return folder


@pytest.mark.parametrize("argv,message", [
    (["--torchtitan", "{tmp}/nowhere"],
     "--torchtitan '{tmp}/nowhere' holds no torchtitan package (torchtitan/train.py)"),
    (["--torchtitan", "{tmp}"], "holds no torchtitan package (torchtitan/train.py)"),
    (["--torchtitan", "{tt}", "--steps", "8"], "--steps '8': expected LONG,SHORT such as 8,2"),
    (["--torchtitan", "{tt}", "--steps", "2,8"], "--steps '2,8': need 1 <= SHORT < LONG"),
    (["--torchtitan", "{tt}", "--steps", "0,0"], "need 1 <= SHORT < LONG"),
    (["--torchtitan", "{tt}", "--rounds", "0"], "--rounds must be at least 1, got 0"),
    ([], "the following arguments are required: --torchtitan"),
])
def test_bench_torchtitan_bad_input_is_one_line(argv, message, tmp_path, capsys):
    from benchmarks import versus_torchtitan

    tt = _fake_torchtitan(tmp_path / "tt")
    places = {"{tmp}": str(tmp_path), "{tt}": str(tt)}
    for key, value in places.items():
        argv, message = [a.replace(key, value) for a in argv], message.replace(key, value)
    assert run_cli(versus_torchtitan.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_bench_torchtitan_unimportable_folder_is_one_line_and_left_alone(tmp_path, capsys, monkeypatch):
    """A torchtitan folder whose trainer does not import (its dependencies missing): one line, nothing written there."""
    from benchmarks import versus_torchtitan

    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # Python would write torchtitan/__pycache__/ here
    tt = _fake_torchtitan(tmp_path / "tt")
    before = sorted(p.relative_to(tt) for p in tt.rglob("*"))
    assert run_cli(versus_torchtitan.main, ["--torchtitan", str(tt), "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'import torchtitan.trainer' failed" in err and "No module named 'torchtitan.trainer'" in err
    assert sorted(p.relative_to(tt) for p in tt.rglob("*")) == before  # no __pycache__ written into the folder


@settings(max_examples=150, deadline=None)
@given(steps=st.one_of(st.text(max_size=12), st.tuples(st.integers(-3, 40), st.integers(-3, 40)).map(
    lambda pair: f"{pair[0]},{pair[1]}")), rounds=st.integers(-2, 20))
def test_long_short_steps_is_the_pair_or_one_line(steps, rounds):
    """Any --steps text and --rounds of the whole-program benchmarks: the two counts with 1 <= SHORT < LONG, or one
    UserError line (never a traceback); the rule is written out here from the docs, not taken from the code."""
    parts = steps.split(",")
    numbers = None
    if len(parts) == 2:
        try:
            numbers = int(parts[0]), int(parts[1])
        except ValueError:
            pass
    valid = numbers is not None and 1 <= numbers[1] < numbers[0] and rounds >= 1
    if valid:
        assert long_short_steps(steps, rounds, "8,2") == numbers
    else:
        with pytest.raises(UserError) as refused:
            long_short_steps(steps, rounds, "8,2")
        assert "\n" not in str(refused.value) and str(refused.value)
