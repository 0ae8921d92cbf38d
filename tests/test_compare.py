"""compare_runs on synthetic run folders: seed groups, the last common step, hand-computed numbers, refusals, plots."""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.config.render import to_toml
from torchnlq.errors import UserError
from torchnlq.experiments.compare import compare_runs, main


def f32(x: float) -> float:
    """TensorBoard stores scalars as float32: expected values go through the same rounding."""
    return float(np.float32(x))


def make_run(root: Path, name: str, val: dict[int, float], *overrides: str, seed: int = 1337,
             batch_fp: str = "aaaa", val_fp: str = "vvvv", query: str = "linear") -> Path:
    """A run folder as the trainer leaves it: resolved config.toml, run_info.json, tb/ events."""
    from torch.utils.tensorboard import SummaryWriter

    run = root / name
    cfg = load_job_config([f"--job.name={name}", f"--training.seed={seed}", f"--model.query.type={query}", *overrides])
    run.mkdir(parents=True)
    (run / "config.toml").write_text(to_toml(cfg))
    (run / "run_info.json").write_text(json.dumps({
        "name": name, "step": max(val), "steps": max(val), "finished": True, "last_val_loss": val[max(val)],
        "query_type": query, "non_embedding_params": 1000 if query == "linear" else 1064,
        "batch_fingerprint": batch_fp, "validation_fingerprint": val_fp, "world_size": 1,
    }))
    writer = SummaryWriter(str(run / "tb"))
    for step, loss in val.items():
        writer.add_scalar("loss/val", loss, step)
        writer.add_scalar("loss/train", loss + 0.1, step)
    writer.close()
    return run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Baseline x3 seeds, residual x3 seeds (one has an extra, later validation), one single-seed arm."""
    root = tmp_path / "suite"
    base = {1337: (3.5, 3.0), 1338: (3.6, 3.1), 1339: (3.4, 2.9)}
    for seed, (a, b) in base.items():
        make_run(root, f"base_seed{seed}", {100: a, 200: b}, seed=seed)
    res = {1337: (3.3, 2.90), 1338: (3.4, 2.95), 1339: (3.2, 2.85)}
    for seed, (a, b) in res.items():
        val = {100: a, 200: b} | ({300: 2.5} if seed == 1339 else {})
        make_run(root, f"res_seed{seed}", val, "--optimizer.lr=3e-3", "--lr_schedule.min_lr=3e-5",
                 "--optimizer.weight_decay=0.03125", "--checkpoint.interval=7", seed=seed, query="residual_mlp")
    make_run(root, "wide", {100: 3.45, 200: 2.97}, "--model.mlp_hidden=600")
    return root


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as f:
        return {row["name"]: row for row in csv.DictReader(f)}


def test_table_numbers_by_hand(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    compare_runs([runs], "base_seed1337", out)
    rows = read_csv(out / "comparison.csv")
    assert list(rows) == ["base", "res", "wide"]  # seeds grouped (checkpoint.interval does not split them)

    base_vals = [f32(v) for v in (3.0, 3.1, 2.9)]  # step 200: the last step all runs validated at
    res_vals = [f32(v) for v in (2.90, 2.95, 2.85)]
    lb, sb = statistics.fmean(base_vals), statistics.stdev(base_vals)
    lr, sr = statistics.fmean(res_vals), statistics.stdev(res_vals)
    assert sb == pytest.approx(0.1, rel=1e-5) and sr == pytest.approx(0.05, rel=1e-5)

    base, res, wide = rows["base"], rows["res"], rows["wide"]
    assert base["baseline"] == "True" and base["runs"] == "3" and base["seeds"] == "1337 1338 1339"
    assert int(res["step"]) == 200
    assert float(base["val_loss_mean"]) == pytest.approx(lb) and float(base["val_loss_std"]) == pytest.approx(sb)
    assert float(res["val_loss_mean"]) == pytest.approx(lr) and float(res["val_loss_std"]) == pytest.approx(sr)
    assert float(res["rel_improvement_pct"]) == pytest.approx(100 * (lb - lr) / lb)  # 3.33%
    assert float(res["rel_improvement_se_pct"]) == pytest.approx(100 * math.sqrt(sr**2 / 3 + sb**2 / 3) / lb)
    assert float(base["rel_improvement_pct"]) == 0.0
    assert (res["query_type"], res["max_lr"], res["min_lr"], res["weight_decay"]) == ("residual_mlp", "0.003", "3e-05", "0.03125")
    assert res["non_embedding_params"] == "1064"
    assert float(wide["rel_improvement_pct"]) == pytest.approx(100 * (lb - f32(2.97)) / lb)
    assert wide["val_loss_std"] == "" and wide["rel_improvement_se_pct"] == ""  # one run: no spread

    table = (out / "comparison.md").read_text()
    assert "val loss @ 200" in table
    assert f"| res | 3 | residual_mlp | 1,064 | 0.003 | 3e-05 | 0.03125 | {lr:.4f} ± {sr:.4f} | +3.33% ± " in table
    assert f"| base | 3 | linear | 1,000 | 0.0006 | 6e-05 | 0.1 | {lb:.4f} ± {sb:.4f} | 0 (baseline) |" in table
    per_run = read_csv(out / "runs.csv")
    assert float(per_run["res_seed1339"]["val_loss"]) == pytest.approx(f32(2.85))


def test_chosen_step(runs: Path, tmp_path: Path) -> None:
    compare_runs([runs], "base_seed1337", tmp_path / "cmp", step=100)
    rows = read_csv(tmp_path / "cmp" / "comparison.csv")
    assert float(rows["base"]["val_loss_mean"]) == pytest.approx(statistics.fmean(f32(v) for v in (3.5, 3.6, 3.4)))
    with pytest.raises(UserError, match="step 300 is not a validation step of every run"):
        compare_runs([runs], "base_seed1337", tmp_path / "cmp", step=300)


def test_different_data_is_refused_unless_allowed(tmp_path: Path) -> None:
    a = make_run(tmp_path, "a", {10: 3.0})
    b = make_run(tmp_path, "b", {10: 2.9}, batch_fp="bbbb")
    with pytest.raises(UserError) as excinfo:
        compare_runs([a, b], a, tmp_path / "cmp")
    assert "different training batches" in str(excinfo.value) and "\n" not in str(excinfo.value)
    c = make_run(tmp_path, "c", {10: 2.9}, val_fp="wwww")
    with pytest.raises(UserError, match="different validation sequences"):
        compare_runs([a, c], a, tmp_path / "cmp")
    written = compare_runs([a, b, c], a, tmp_path / "cmp", allow_different_data=True)
    assert (tmp_path / "cmp" / "comparison.md") in written


def test_bad_inputs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = make_run(tmp_path, "a", {10: 3.0})
    (tmp_path / "empty").mkdir()
    assert run_cli(main, [str(tmp_path / "empty"), "--baseline", str(a)]) == 2
    assert run_cli(main, [str(a), "--baseline", "nobody"]) == 2
    b = make_run(tmp_path, "b", {20: 3.0})
    assert run_cli(main, [str(a), str(b), "--baseline", "a"]) == 2  # no common validation step
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
    assert "share no validation step" in err[2]


def test_plots_when_matplotlib_is_present(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    assert run_cli(main, [str(runs), "--baseline", str(runs / "base_seed1338"), "--out", str(tmp_path / "cmp")]) == 0
    assert "| res | 3 |" in capsys.readouterr().out
    for png in ("loss_curves.png", "relative_improvement.png"):
        data = (tmp_path / "cmp" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 300_000
    assert "![loss_curves](loss_curves.png)" in (tmp_path / "cmp" / "comparison.md").read_text()


def test_tables_without_matplotlib(runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    written = compare_runs([runs], "base_seed1337", tmp_path / "cmp")
    assert not list((tmp_path / "cmp").glob("*.png")) and len(written) == 3
    assert "No plots: matplotlib is not installed" in (tmp_path / "cmp" / "comparison.md").read_text()


def test_seed_groups_ignore_bookkeeping_but_not_initial_weights(tmp_path: Path) -> None:
    a = make_run(tmp_path, "a_seed1", {10: 3.0}, seed=1)
    b = make_run(tmp_path, "a_seed2", {10: 3.1}, "--checkpoint.interval=3", "--metrics.log_interval=5", seed=2)
    c = make_run(tmp_path, "a_seed3", {10: 3.2}, "--checkpoint.initial_load_path=/weights", seed=3)
    compare_runs([a, b, c], a, tmp_path / "cmp")
    rows = read_csv(tmp_path / "cmp" / "comparison.csv")
    assert list(rows) == ["a", "a_seed3"] and rows["a"]["runs"] == "2"
