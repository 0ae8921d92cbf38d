"""``python -m benchmarks.gpu_check`` on a CPU: the smoke run's figures against independent computations, the
counters, the verdicts on synthetic figures, and the mistakes (one ``error:`` line, exit 2, nothing written).

What is computed independently here: tokens per step from the overrides the test passes, the
median of the recorded step times, FLOPs per token from the parameters of a model built on meta
(6·N + 12·L·H·head_dim·T, N = non-embedding parameters + the tied head's matmul), and a floor
for the peak memory (parameters + the two AdamW moments, fp32). No timing is asserted: the
machine is shared.
"""

from __future__ import annotations

import re

import json
import math
import statistics
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_check import Row, judge
from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.models import QUERY_TYPES
from torchnlq.models.query import LinearQuery, register_query
from torchnlq.train.preflight import check_job_config
from torchnlq.models import build_model

REPO = Path(__file__).resolve().parents[1]
MICRO, SEQ, ACCUM = 2, 32, 2
TINY = [
    str(REPO / "train_configs/debug_model.toml"), "--model.n_layers=1", "--model.dim=32", "--model.n_heads=2",
    f"--training.seq_len={SEQ}", f"--training.micro_batch_size={MICRO}", f"--training.grad_accum_steps={ACCUM}",
]
STEPS, WARMUP = 3, 2


def table_rows(out: str) -> list[dict[str, str]]:
    """The Markdown table's rows as {column: cell}."""
    lines = [line for line in out.splitlines() if line.startswith("|") and not line.startswith("|-")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert cells and cells[0] == gpu_check.COLUMNS
    return [dict(zip(cells[0], row)) for row in cells[1:]]


def gib_cell(cell: str) -> float:
    assert cell.endswith(" GiB"), cell
    return float(cell[: -len(" GiB")])


def run_check(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, Any]]:
    out_json = tmp_path / "check.json"
    assert run_cli(gpu_check.main, [*argv, "--json", str(out_json)]) == 0
    return capsys.readouterr().out, json.loads(out_json.read_text())


def expected_flops_per_token(query_type: str) -> int:
    """6·N + 12·L·H·head_dim·T from the built model's parameters (not from ModelArgs' count)."""
    args = check_job_config(load_job_config([*TINY, f"--model.query.type={query_type}"]))
    with torch.device("meta"):
        model = build_model(args)
    n = sum(p.numel() for name, p in model.named_parameters() if name not in ("tok_emb.weight", "pos_emb.weight"))
    n += model.tok_emb.weight.numel()  # the tied LM head is a matmul: V·d FLOPs per token
    return 6 * n + 12 * args.n_layers * args.n_heads * (args.dim // args.n_heads) * SEQ


def parameter_count(query_type: str) -> int:
    args = check_job_config(load_job_config([*TINY, f"--model.query.type={query_type}"]))
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(args).parameters())


# ----- the smoke run: every printed figure against the JSON and an independent computation ----------


@pytest.mark.integration  # builds Trainers and trains a few steps each (and traces with dynamo)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled-aot_eager"])
def test_cpu_smoke_run_figures_agree(compiled: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    mode = ["--training.compile=true", "--compile-backend", "aot_eager"] if compiled else []
    out, data = run_check([*TINY, *mode, "--device", "cpu", "--query-types", "all",
                           "--steps", str(STEPS), "--warmup", str(WARMUP)], tmp_path, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check.json"]  # nothing else written

    # The header: the device, the software, the honest CPU lines.
    assert "device: cpu (" in out and f"torch {torch.__version__}" in out
    assert "peak bf16: none for a CPU, MFU not defined" in out
    assert "float8: not run: this device is a CPU" in out
    # The memory estimate (torchnlq/train/memory_estimate.py) is in the header and beside each row's peak.
    assert re.search(r"estimate: [0-9.]+ GiB for the config's micro-batch", out)
    for row in data["rows"]:
        assert row["estimate_bytes"] > 0
        assert row["estimate_ratio"] == pytest.approx(row["peak_memory_bytes"] / row["estimate_bytes"])

    printed = table_rows(out)
    rows = data["rows"]
    assert [r["query_type"] for r in rows] == list(QUERY_TYPES)  # --query-types all: the registry, in order
    assert [p["query"] for p in printed] == list(QUERY_TYPES)
    for row, cells in zip(rows, printed):
        qtype = row["query_type"]
        assert row["error"] is None and not row["float8"]
        assert row["precision"] == "fp32" and row["compile"] is compiled
        # tokens per step: the overrides this test passed
        assert row["tokens_per_step"] == MICRO * SEQ * ACCUM
        assert cells["micro-batch"] == f"{MICRO} x {SEQ}"
        # every step ran and was recorded: warm-up, timed, the memory step; all losses finite
        assert len(row["losses"]) == WARMUP + STEPS + 1 and all(math.isfinite(v) for v in row["losses"])
        assert len(row["step_ms_all"]) == STEPS
        assert row["step_ms"] == pytest.approx(statistics.median(row["step_ms_all"]))
        tokens_per_s = MICRO * SEQ * ACCUM / (row["step_ms"] / 1000)
        assert row["tokens_per_s"] == pytest.approx(tokens_per_s)
        assert cells["tokens/s"] == f"{tokens_per_s:,.0f}" and cells["step (ms)"] == f"{row['step_ms']:,.1f}"
        assert row["flops_per_token"] == expected_flops_per_token(qtype)
        tflops = expected_flops_per_token(qtype) * tokens_per_s / 1e12
        assert row["tflops"] == pytest.approx(tflops) and float(cells["TFLOP/s"]) == pytest.approx(tflops, rel=5e-3)
        # no peak for a CPU: no MFU, said so in the verdict
        assert row["mfu"] is None and cells["MFU"] == "–"
        assert "cpu: MFU not defined" in row["notes"]
        # peak memory: at least the fp32 parameters and AdamW's two moments, printed in GiB
        floor = 3 * 4 * parameter_count(qtype)
        assert floor <= row["peak_memory_bytes"] < row["capacity_bytes"]
        assert gib_cell(cells["peak memory"]) == pytest.approx(row["peak_memory_bytes"] / 2**30, rel=5e-3)
        assert 0 <= row["data_share"] < 1
        assert row["data_share"] == pytest.approx(row["data_ms"] / row["step_ms"])
        assert cells["data (%)"] == f"{100 * row['data_share']:.2g}%"
        if compiled:
            # dynamo traced the blocks (so the zeros mean something): no break, no recompilation
            assert row["compiled_graphs"] >= 1 and row["compile_backend"] == "aot_eager"
            # every registered type is a shipped one here (the test-only types below are registered per test)
            assert row["graph_breaks"] == 0 and row["recompiles"] == 0, row["graph_break_reasons"]
            assert cells["graph breaks"] == str(row["graph_breaks"]) and cells["recompiles"] == str(row["recompiles"])
        else:
            assert row["graph_breaks"] is None and row["recompiles"] is None
            assert cells["graph breaks"] == cells["recompiles"] == "–"
            assert "compile off" in row["notes"]
        # the verdict printed is the verdict of the figures in the JSON
        problems, notes = judge(Row(**{k: v for k, v in row.items()}))
        assert (problems, notes) == (row["problems"], row["notes"])
        assert cells["verdict"].startswith(row["verdict"]) and row["verdict"] == ("; ".join(problems) or "ok")
    assert data["thresholds"]["mfu_min"] == gpu_check.MFU_MIN
    assert out.count("| query |") == 1
    ok = sum(not r["problems"] for r in rows)
    assert f"{ok} of {len(rows)} rows ok" in out.splitlines()[-1]


# ----- the counters: injected graph breaks and recompilations are seen ------------------------------


@pytest.fixture
def misbehaving_query_types() -> Iterator[None]:
    """Two test-only query types: one with a graph break, one that changes a traced Python int every call."""
    before = dict(QUERY_TYPES)

    @register_query("my_graph_break")
    class GraphBreakQuery(LinearQuery):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = self.w_q(x)
            torch._dynamo.graph_break()
            return q

    @register_query("my_recompiling")
    class RecompilingQuery(LinearQuery):
        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1  # a Python int dynamo guards on: a new value fails the guard
            return self.w_q(x) * (1.0 + 0.0 * self.calls)

    try:
        yield
    finally:
        QUERY_TYPES.clear()
        QUERY_TYPES.update(before)


@pytest.mark.integration  # trains a few steps per row under dynamo
@pytest.mark.usefixtures("misbehaving_query_types")
def test_graph_breaks_and_recompilations_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*TINY, "--device", "cpu", "--training.compile=true", "--compile-backend", "aot_eager",
            "--query-types", "linear,my_graph_break,my_recompiling", "--steps", "2", "--warmup", "1"]
    out, data = run_check(argv, tmp_path, capsys)
    linear, breaking, recompiling = data["rows"]
    assert linear["graph_breaks"] == 0 and linear["recompiles"] == 0
    assert breaking["graph_breaks"] >= 1 and any("graph_break()" in r for r in breaking["graph_break_reasons"])
    assert breaking["problems"][0].startswith(f"{breaking['graph_breaks']} graph break")
    assert "graph break in my_graph_break: " in out
    # steps 2.. each see a new value of the counter
    assert recompiling["recompiles"] >= 1 and recompiling["graph_breaks"] == 0
    assert any(p.startswith(f"{recompiling['recompiles']} recompilation") for p in recompiling["problems"])
    assert "look at: " in out and "my_graph_break" in out.splitlines()[-1]


@pytest.mark.integration  # trains a few steps per row under dynamo
def test_a_variant_row_runs_the_same_step_its_own_way_and_is_compared_with_the_plain_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """model-compile traces the whole model as one graph (the plain row: one per kind of block, one for the loss)."""
    argv = [*TINY, "--device", "cpu", "--training.compile=true", "--compile-backend", "aot_eager",
            "--query-types", "linear", "--variants", "model-compile", "--steps", "2", "--warmup", "1"]
    out, data = run_check(argv, tmp_path, capsys)
    plain, whole = data["rows"]
    assert (plain["variant"], whole["variant"]) == (None, "model-compile")
    assert plain["compiled_graphs"] == 2 and whole["compiled_graphs"] == 1
    assert whole["graph_breaks"] == 0 and whole["recompiles"] == 0
    assert whole["vs_bf16"] == pytest.approx(whole["tokens_per_s"] / plain["tokens_per_s"])
    assert whole["losses"] == pytest.approx(plain["losses"], rel=1e-5)  # the same steps, traced another way
    assert "| linear [model-compile] |" in out
    assert f"{whole['vs_bf16']:.3f}x the plain row's tokens/s" in whole["notes"]


# ----- out of memory, the memory estimate ----------------------------------------------------------


def test_smaller_micro_batch_keeps_the_tokens_per_step() -> None:
    for micro, accum in [(12, 40), (7, 3), (16, 1), (2, 5)]:
        tokens, seen = micro * accum, []
        while (nxt := gpu_check.smaller_micro_batch(micro, accum)) is not None:
            assert nxt[0] <= micro // 2 and nxt[0] * nxt[1] == tokens
            micro, accum = nxt
            seen.append(micro)
        assert micro == 1 and seen == sorted(seen, reverse=True)
    assert gpu_check.smaller_micro_batch(12, 40) == (6, 80)
    assert gpu_check.smaller_micro_batch(1, 4) is None


def out_of_memory() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory (simulated)")


def out_of_memory_while_compiling() -> BaseException:
    """What inductor raises when its autotuning runs out of memory: the OOM wrapped by dynamo."""
    return torch._dynamo.exc.BackendCompilerFailed(lambda *a: None, out_of_memory(), None)


@pytest.mark.integration  # builds Trainers
@pytest.mark.parametrize("error", [out_of_memory, out_of_memory_while_compiling])
def test_out_of_memory_retries_with_a_smaller_micro_batch(error: Any, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    step = gpu_check.Variant.step

    def step_that_fits_only_one_sequence(self: gpu_check.Variant) -> None:
        if self.cfg.training.micro_batch_size > 1:
            raise error()
        step(self)

    monkeypatch.setattr(gpu_check.Variant, "step", step_that_fits_only_one_sequence)
    argv = [*TINY, "--device", "cpu", "--query-types", "linear", "--steps", "1", "--warmup", "1"]
    _, data = run_check(argv, tmp_path, capsys)
    (row,) = data["rows"]
    assert row["out_of_memory_at"] == [MICRO] and row["micro_batch_size"] == 1
    assert row["grad_accum_steps"] == ACCUM * MICRO and row["tokens_per_step"] == MICRO * SEQ * ACCUM
    assert any(f"micro-batch {MICRO} ran out of memory: used 1 x {SEQ}" in n for n in row["notes"])

    def never_fits(self: gpu_check.Variant) -> None:
        raise error()

    monkeypatch.setattr(gpu_check.Variant, "step", never_fits)
    _, data = run_check(argv, tmp_path, capsys)
    (row,) = data["rows"]
    assert row["out_of_memory_at"] == [MICRO, 1] and row["tokens_per_s"] is None
    assert row["verdict"].startswith(f"out of memory at micro-batch 1 x {SEQ}")


@pytest.mark.integration  # builds Trainers
def test_a_compiler_that_fails_is_the_row_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    apply_compile = gpu_check.apply_compile

    def no_compiler_here(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(gpu_check, "apply_compile",
                        lambda model, fullgraph, backend: apply_compile(model, fullgraph, no_compiler_here))
    argv = [*TINY, "--device", "cpu", "--training.compile=true", "--query-types", "linear,identity",
            "--steps", "1", "--warmup", "1"]
    out, data = run_check(argv, tmp_path, capsys)
    assert [r["query_type"] for r in data["rows"]] == ["linear", "identity"]  # the check went on
    for row in data["rows"]:
        assert row["verdict"].startswith(
            "compile failed (backend 'no_compiler_here' raised RuntimeError: no working C++ compiler found)")
        assert row["tokens_per_s"] is None
    assert "0 of 2 rows ok" in out


@pytest.fixture
def fake_estimator(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """An estimate_memory that returns 1 MiB (unlike any real peak, so the ratio is visible); records its calls."""
    calls: list[tuple[Any, ...]] = []

    def estimate_memory(*args: Any) -> Any:
        calls.append(args)
        return types.SimpleNamespace(total=2**20)

    monkeypatch.setattr(gpu_check, "estimate_memory", estimate_memory)
    return calls


@pytest.mark.integration  # builds a Trainer
def test_the_estimate_is_shown_next_to_the_peak_with_the_ratio(
    fake_estimator: list[tuple[Any, ...]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out, data = run_check([*TINY, "--device", "cpu", "--query-types", "linear", "--steps", "1", "--warmup", "1"],
                          tmp_path, capsys)
    (row,) = data["rows"]
    assert row["estimate_bytes"] == 2**20 and row["estimate_ratio"] == pytest.approx(row["peak_memory_bytes"] / 2**20)
    (cells,) = table_rows(out)
    assert cells["estimate"] == f"{2**20 / 2**30:.3g} GiB ({row['estimate_ratio']:.2f}x)"
    assert f"estimate: {2**20 / 2**30:.3g} GiB" in out
    cfg, args, world, device_type = fake_estimator[-1]
    assert (cfg.model.query.type, world, device_type) == ("linear", 1, "cpu") and args.n_layers == 1


def test_a_failing_estimate_is_n_a_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def estimate_memory(*args: Any) -> Any:
        raise RuntimeError("no fake kernel for this op")

    monkeypatch.setattr(gpu_check, "estimate_memory", estimate_memory)
    cfg = load_job_config([*TINY, "--training.device=cpu"])
    assert gpu_check.memory_estimate(cfg, "cpu") == (
        None, "the memory estimate failed (RuntimeError: no fake kernel for this op)")


# ----- the verdict, on synthetic figures -----------------------------------------------------------

GIB = 2**30


def healthy_gpu_row(**changes: Any) -> Row:
    """A bf16 compiled row with every figure comfortably inside the thresholds."""
    row = Row(query_type="residual_mlp", float8=False, device="cuda", precision="bf16 autocast", compile=True,
              compile_backend="inductor", micro_batch_size=12, seq_len=1024, grad_accum_steps=40,
              tokens_per_step=491_520, step_ms=1000.0, tokens_per_s=491_520.0, mfu=gpu_check.MFU_TARGET + 0.05,
              peak_memory_bytes=10 * GIB, capacity_bytes=80 * GIB, data_ms=1.0, data_share=0.001, compiled_graphs=1,
              graph_breaks=0, recompiles=0, losses=[10.9, 10.8, 10.7])
    return replace(row, **changes)


def test_a_healthy_row_is_ok() -> None:
    assert judge(healthy_gpu_row()) == ([], [])


@pytest.mark.parametrize("changes, expected", [
    ({"mfu": 0.21}, f"MFU 21.0% < {100 * gpu_check.MFU_MIN:g}%"),
    ({"mfu": 0.21, "compile": False, "graph_breaks": None, "recompiles": None},
     "): compile is off: set --training.compile=true"),
    ({"graph_breaks": 2, "graph_break_reasons": ["Data-dependent branching"]},
     "2 graph breaks: Data-dependent branching"),
    ({"recompiles": 3}, "3 recompilations after step 1"),
    ({"peak_memory_bytes": int(31.2 * GIB), "capacity_bytes": 32 * GIB},
     "peak 31.2 GiB of 32 GiB: lower training.micro_batch_size"),
    ({"data_share": 0.05, "data_ms": 50.0}, "data loading 5.0% of the step (50 of 1e+03 ms) > 1%"),
    ({"losses": [10.9, float("nan"), float("inf")]}, "loss not finite at step(s) 2, 3"),
    ({"error": "out of memory at micro-batch 1 x 1024: lower training.seq_len"}, "out of memory at micro-batch 1"),
])
def test_each_problem_gives_its_reason(changes: dict[str, Any], expected: str) -> None:
    problems, _ = judge(healthy_gpu_row(**changes))
    assert len(problems) == 1 and expected in problems[0], problems


def test_thresholds_are_the_boundaries() -> None:
    at = healthy_gpu_row(peak_memory_bytes=int(gpu_check.MEMORY_SHARE_MAX * 80 * GIB))
    assert judge(at)[0] == []
    over = healthy_gpu_row(peak_memory_bytes=int(gpu_check.MEMORY_SHARE_MAX * 80 * GIB) + 1)
    assert judge(over)[0][0].startswith("peak ")
    assert judge(healthy_gpu_row(mfu=gpu_check.MFU_MIN))[0] == []
    assert judge(healthy_gpu_row(mfu=gpu_check.MFU_MIN - 0.001))[0][0].startswith("MFU ")
    assert judge(healthy_gpu_row(data_share=gpu_check.DATA_SHARE_MAX))[0] == []


@pytest.mark.parametrize("changes, note", [
    ({"mfu": None, "device": "cpu"}, "cpu: MFU not defined"),
    ({"mfu": None}, "MFU unknown: pass --metrics.peak_tflops"),
    ({"mfu": (gpu_check.MFU_MIN + gpu_check.MFU_TARGET) / 2}, "under the project's 45% target"),
    ({"float8": True, "mfu": 0.1, "vs_bf16": 1.25}, "MFU against the bf16 peak"),
    ({"float8": True, "vs_bf16": 1.25}, "1.25x the bf16 row's tokens/s"),
    ({"out_of_memory_at": [24], "micro_batch_size": 12, "grad_accum_steps": 80}, "micro-batch 24 ran out of memory"),
])
def test_notes_do_not_fail_a_row(changes: dict[str, Any], note: str) -> None:
    problems, notes = judge(healthy_gpu_row(**changes))
    assert problems == [] and any(note in n for n in notes), notes


def test_float8_rows_are_compared_with_their_bf16_row() -> None:
    bf16 = healthy_gpu_row(tokens_per_s=100_000.0)
    f8 = healthy_gpu_row(float8=True, tokens_per_s=120_000.0)
    other = healthy_gpu_row(query_type="linear", float8=True, tokens_per_s=90_000.0)  # no bf16 partner
    gpu_check.finish_verdicts([bf16, f8, other])
    assert f8.vs_bf16 == pytest.approx(1.2) and other.vs_bf16 is None and bf16.vs_bf16 is None
    assert [r.verdict for r in (bf16, f8, other)] == ["ok", "ok", "ok"]


# ----- the header on a (simulated) GPU ------------------------------------------------------------


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """torch.cuda answering as one GPU whose name and capability the test sets."""
    gpu: dict[str, Any] = {"name": "NVIDIA H100 80GB HBM3", "capability": (9, 0)}

    def props(_device: Any = None) -> types.SimpleNamespace:
        major, minor = gpu["capability"]
        return types.SimpleNamespace(major=major, minor=minor, total_memory=80 * GIB, name=gpu["name"])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _device=None: gpu["name"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _device=None: gpu["capability"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: gpu["capability"] >= (8, 0))
    return gpu


def header_for(argv: list[str]) -> str:
    opts = gpu_check.parse_args(argv)
    device = gpu_check.resolve_device(opts.device)
    config_args, specs, (_, float8_line) = gpu_check.plan_rows(opts, device)
    info = gpu_check.describe_device(device, specs[0].cfg)
    return gpu_check.format_header(info, specs[0].cfg, opts, config_args, float8_line, "estimate: n/a (test)")


def test_the_gpu_header_names_the_peak_and_float8(fake_gpu: dict[str, Any]) -> None:
    from torchnlq.parallel.device_figures import PEAK_BF16_TFLOPS

    header = header_for([])  # the default profile
    h100 = dict(PEAK_BF16_TFLOPS)["H100"]
    assert "device: NVIDIA H100 80GB HBM3, compute capability 9.0, 80 GiB" in header
    assert f"peak bf16: {h100:g} TFLOP/s dense (torchnlq.parallel.device_figures.PEAK_BF16_TFLOPS entry 'H100')" in header
    assert "float8: a row per query type" in header
    assert "profile: gpt_small, bf16 autocast, compile (inductor" in header and "micro-batch 12 x 1024" in header
    opts = gpu_check.parse_args([])
    _, specs, _ = gpu_check.plan_rows(opts, torch.device("cuda", 0))
    assert [(s.query_type, s.float8) for s in specs] == [
        ("linear", False), ("linear", True), ("residual_mlp", False), ("residual_mlp", True)]

    fake_gpu.update(name="NVIDIA A100-SXM4-80GB", capability=(8, 0))
    header = header_for(["--metrics.peak_tflops=300"])
    assert "peak bf16: 300 TFLOP/s dense (--metrics.peak_tflops)" in header
    assert "float8: not run: this device is NVIDIA A100-SXM4-80GB (compute capability 8.0)" in header

    fake_gpu.update(name="Some Future GPU", capability=(12, 0))
    header = header_for(["--no-float8"])
    assert "peak bf16: unknown: pass --metrics.peak_tflops" in header
    assert "float8: not run (--no-float8)" in header


# ----- the command line ----------------------------------------------------------------------------


def test_query_type_lists() -> None:
    parse = gpu_check.parse_args
    assert parse(["--query-types", "linear", "identity", "cfg.toml"]).query_types == ["linear", "identity"]
    assert parse(["--query-types", "linear", "identity", "cfg.toml"]).config_args == ["cfg.toml"]
    assert parse(["--query-types=linear,residual", "--steps", "2"]).query_types == ["linear", "residual"]
    cpu = torch.device("cpu")
    # the default: linear, residual_mlp and the config's own type
    _, specs, _ = gpu_check.plan_rows(parse([*TINY, "--model.query.type=identity"]), cpu)
    assert [s.query_type for s in specs] == ["linear", "residual_mlp", "identity"]
    _, specs, _ = gpu_check.plan_rows(parse([*TINY, "--query-types", "all"]), cpu)
    assert [s.query_type for s in specs] == list(QUERY_TYPES)
    # --device cpu without a config: the debug model
    config_args, _, _ = gpu_check.plan_rows(parse(["--device", "cpu"]), cpu)
    assert config_args == [str(REPO / gpu_check.CPU_SMOKE_CONFIG)]


def test_help_prints_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(gpu_check.main, ["--help"]) == 0
    out = capsys.readouterr().out
    assert "python -m benchmarks.gpu_check" in out and "--query-types" in out and "--device cpu" in out


@pytest.mark.parametrize("argv, fragment", [
    ([], "no CUDA device is visible"),
    (["--device", "cuda"], "for the CPU smoke mode run: "),
    (["--device", "cpu", "--query-types", "quadratic"], "--query-types: unknown 'quadratic'"),
    (["--device", "cpu", "--query-types", "residual-mlp"], "did you mean 'residual_mlp'?"),
    (["--device", "cpu", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["--device", "cpu", "--steps", "two"], "argument --steps: invalid int value: 'two'"),
    (["--device", "cpu", "--steps"], "argument --steps: expected one argument"),
    (["--device", "cpu", "--query-types"], "argument --query-types: expected at least one argument"),
    (["--device", "cpu", "--json"], "argument --json: expected one argument"),
    (["--device", "cpu", "--warmup", "0"], "--warmup must be at least 1"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--device", "cpu", "--compile-backend", "tvm"], "argument --compile-backend: invalid choice: 'tvm'"),
    (["--device", "cpu", "--json", "{tmp}"], "is a folder"),
    (["--device", "cpu", "--json", "{tmp}/no/such/out.json"], "does not exist"),
    (["nowhere.toml", "--device", "cpu"], "config file 'nowhere.toml' not found"),
    (["--device", "cpu", "--model.query.typo=1"], "unknown key 'model.query.typo'"),
    (["--device", "cpu", "--query-types", "linear", "--model.query.fuse_kv=true"], "model.query.fuse_kv"),
    (["--device", "cpu", "--variants", "graph-mode"], "--variants: unknown 'graph-mode'"),
    (["--device", "cpu", "--variants", "cudnn-attention"], "--variants cudnn-attention needs CUDA"),
])
def test_mistakes_are_one_line_and_write_nothing(argv: list[str], fragment: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert run_cli(gpu_check.main, argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert fragment in captured.err and "Traceback" not in captured.err
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []
    if not argv or argv[0] == "--device" and argv[1] == "cuda":
        assert "python -m benchmarks.gpu_check train_configs/debug_model.toml --device cpu" in captured.err
