"""compare_runs on synthetic run folders: seed groups, the last common step, hand-computed numbers, refusals, plots.

The plots are checked through their matplotlib figure objects (axis labels, legend entries, titles,
line data), after rendering them to PNG with the Agg backend, not through pixels.
"""

from __future__ import annotations

import csv
import json
import io
import math
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.runs import branch, make_run

from torchnlq.cli import run_cli
from torchnlq.errors import UserError
from torchnlq.experiments.compare import compare_runs, main
from torchnlq.experiments.compare_plots import relative_improvement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def f32(x: float) -> float:
    """TensorBoard stores scalars as float32: expected values go through the same rounding."""
    return float(np.float32(x))


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

    # The one config key that differs between the arms (wide's model.mlp_hidden) gets a column; the seed and
    # checkpoint.interval (bookkeeping) do not, nor the keys the fixed columns show.
    assert wide["model.mlp_hidden"] == "600" and base["model.mlp_hidden"] == res["model.mlp_hidden"] == ""
    assert not any(key.startswith(("training.", "checkpoint.", "optimizer.", "model.query")) for key in base)

    table = (out / "comparison.md").read_text()
    assert "| weight decay | model.mlp_hidden | val loss @ 200 |" in table
    assert (f"| res | 3 | residual_mlp | 1,064 | 0.003 | 3e-05 | 0.03125 | unset | {lr:.4f} ± {sr:.4f} | +3.33% ± "
            in table)
    assert f"| base | 3 | linear | 1,000 | 0.0006 | 6e-05 | 0.1 | unset | {lb:.4f} ± {sb:.4f} | 0 (baseline) |" in table
    assert "| wide | 1 | linear | 1,000 | 0.0006 | 6e-05 | 0.1 | 600 | " in table
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
    assert run_cli(main, [str(a), str(b), "--baseline", "a", "--step", "20"]) == 2  # a never validated at 20
    assert run_cli(main, [str(a), str(b), "--baseline", "a", "--step", "10", "--tokens", "100"]) == 2
    assert run_cli(main, [str(a), str(b), "--baseline", "a", "--tokens", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 5 and all(line.startswith("error: ") for line in err)
    assert "step 20 is not a validation step of every run" in err[2]
    assert "give --step or --tokens, not both" in err[3] and "--tokens must be a positive" in err[4]


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


# ---------------------------------------------------------------- the figures, as objects


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch):
    """The figures compare_runs draws, kept open (plt.close recorded instead) in the order they are saved."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept: list = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        real_close(fig)


def texts(fig) -> list[str]:
    """Every title, axis label and legend entry of a figure."""
    out = []
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        if ax.get_legend() is not None:
            out += [t.get_text() for t in ax.get_legend().get_texts()]
    return out


def legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def repeated_word(text: str) -> str | None:
    """A word written twice in a row ("baseline baseline", "baseline (baseline"), or None."""
    m = re.search(r"\b(\w+)\W+\1\b", text, flags=re.IGNORECASE)
    return m.group(0) if m else None


def line(ax, label: str):
    return next(ln for ln in ax.get_lines() if ln.get_label() == label)


def test_loss_plot_says_units_line_styles_and_seeds(runs: Path, tmp_path: Path, figures: list) -> None:
    out = tmp_path / "cmp"
    assert run_cli(main, [str(runs), "--baseline", "base_seed1337", "--out", str(out)]) == 0
    for png in ("loss_curves.png", "relative_improvement.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # rendered (Agg)
    curves, rel = figures
    ax = curves.axes[0]
    with (runs / "base_seed1337" / "config.toml").open("rb") as f:
        assert tomllib.load(f)["data"]["tokenizer"] == "gpt2"  # so the unit is nats per token
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("optimizer step", "loss (nats per token)")
    assert ax.get_title() == "Validation and training loss"
    assert legend(curves) == [
        "base (baseline, mean of 3 seeds, ±1 std)", "res (mean of 3 seeds, ±1 std)", "wide (1 seed)",
        "solid: validation loss", "dashed: training loss (centred mean over ~1/10 of the run)",
    ]
    # The solid line is the validation mean, by hand; the dashed one the training loss (val + 0.1 here).
    base = line(ax, "base (baseline, mean of 3 seeds, ±1 std)")
    assert base.get_linestyle() == "-" and list(base.get_xdata()) == [100, 200]
    assert list(base.get_ydata()) == pytest.approx([statistics.fmean(f32(v) for v in (3.5, 3.6, 3.4)),
                                                    statistics.fmean(f32(v) for v in (3.0, 3.1, 2.9))])
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--" and ln.get_color() == base.get_color()]
    assert len(dashed) == 1 and dashed[0].get_ydata()[0] == pytest.approx(base.get_ydata()[0] + 0.1, abs=1e-6)
    assert len(ax.collections) == 2  # ±1 std bands for base and res only: wide has one seed

    rax = rel.axes[0]
    assert (rax.get_xlabel(), rax.get_ylabel()) == ("optimizer step", "improvement over base (% of its loss)")
    assert legend(rel) == ["res (mean of 3 seeds, ±1 s.e.)", "wide (1 seed)"]
    lb = statistics.fmean(f32(v) for v in (3.0, 3.1, 2.9))
    lr = statistics.fmean(f32(v) for v in (2.90, 2.95, 2.85))
    assert line(rax, "res (mean of 3 seeds, ±1 s.e.)").get_ydata()[-1] == pytest.approx(100 * (lb - lr) / lb)
    # res's band at step 200 is ± the standard error of the difference of the means, relative to L_base.
    sb, sr = (statistics.stdev(f32(v) for v in vals) for vals in ((3.0, 3.1, 2.9), (2.90, 2.95, 2.85)))
    se = 100 * math.sqrt(sr**2 / 3 + sb**2 / 3) / lb
    (band,) = rax.collections
    edge = sorted(y for x, y in band.get_paths()[0].vertices if x == 200)
    assert (edge[0], edge[-1]) == pytest.approx((100 * (lb - lr) / lb - se, 100 * (lb - lr) / lb + se))
    assert rax.get_ylim()[0] <= edge[0] and edge[-1] <= rax.get_ylim()[1]  # the band is not clipped
    assert [t.get_text() for t in rax.texts] == [
        "one seed: no error estimate (wide); a difference this size may be seed noise"]
    for text in texts(curves) + texts(rel):
        assert repeated_word(text) is None, text


def test_token_axis_byte_units_and_a_baseline_named_baseline(tmp_path: Path, figures: list) -> None:
    shape = ("--data.tokenizer=byte", "--training.seq_len=64", "--training.micro_batch_size=4",
             "--training.grad_accum_steps=3")
    for seed, losses in ((1, (2.0, 1.5)), (2, (2.2, 1.7))):
        make_run(tmp_path / "suite", f"baseline_seed{seed}", {100: losses[0], 200: losses[1]}, *shape, seed=seed,
                 world_size=2)
    make_run(tmp_path / "suite", "nlq", {100: 1.9, 200: 1.4}, *shape, query="residual_mlp", world_size=2)
    out = tmp_path / "cmp"
    assert run_cli(main, [str(tmp_path / "suite"), "--baseline", "baseline_seed1", "--out", str(out),
                          "--x", "tokens"]) == 0
    curves, rel = figures
    per_step = 64 * 4 * 3 * 2  # seq_len x micro_batch_size x grad_accum_steps x world_size
    ax = curves.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("training tokens", "loss (nats per byte)")
    assert legend(curves)[:2] == ["baseline (mean of 2 seeds, ±1 std)", "nlq (1 seed)"]
    assert list(line(ax, "baseline (mean of 2 seeds, ±1 std)").get_xdata()) == [100 * per_step, 200 * per_step]
    rax = rel.axes[0]
    assert (rax.get_xlabel(), rax.get_ylabel()) == ("training tokens", "improvement over baseline (% of its loss)")
    nlq = line(rax, "nlq (1 seed)")
    assert list(nlq.get_xdata()) == [100 * per_step, 200 * per_step]
    assert list(nlq.get_ydata()) == pytest.approx([100 * (2.1 - f32(1.9)) / 2.1, 100 * (1.6 - f32(1.4)) / 1.6],
                                                  rel=1e-6)
    for text in texts(curves) + texts(rel):
        assert repeated_word(text) is None, text


def test_single_seed_arms_get_no_band_and_no_std_wording(tmp_path: Path, figures: list) -> None:
    a = make_run(tmp_path, "a", {10: 3.0, 20: 2.5})
    b = make_run(tmp_path, "b", {10: 2.9, 20: 2.4}, "--model.mlp_hidden=600")
    assert run_cli(main, [str(a), str(b), "--baseline", "a", "--out", str(tmp_path / "cmp")]) == 0
    curves, rel = figures
    assert not curves.axes[0].collections
    assert legend(curves)[:2] == ["a (baseline, 1 seed)", "b (1 seed)"]
    assert not any("std" in t for t in texts(curves) + texts(rel))
    assert not rel.axes[0].collections  # no band: a one-seed difference has no error estimate, and says so
    assert [t.get_text() for t in rel.axes[0].texts] == [
        "one seed: no error estimate (baseline a); a difference this size may be seed noise"]


def test_training_curves_are_smoothed_and_inside_the_y_range(tmp_path: Path, figures: list) -> None:
    """A noisy training loss is drawn smoothed (its total variation far below the logged one's, yet following
    the trend), and the y range holds it although it lies well above the validation loss."""
    steps = np.arange(1, 201)
    trend = 3.0 + 2.0 * np.exp(-steps / 40)
    noisy = trend + np.random.default_rng(0).normal(0.0, 0.2, steps.size)
    a = make_run(tmp_path, "a", {50: 2.0, 100: 1.9, 150: 1.85, 200: 1.8},
                 train={int(s): float(v) for s, v in zip(steps, noisy)})
    assert run_cli(main, [str(a), "--baseline", "a", "--out", str(tmp_path / "cmp")]) == 0
    ax = figures[0].axes[0]
    (dashed,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    xs, ys = np.asarray(dashed.get_xdata()), np.asarray(dashed.get_ydata())
    assert list(xs) == list(steps)

    def total_variation(values: np.ndarray) -> float:
        return float(np.abs(np.diff(values)).sum())

    assert total_variation(ys) < 0.15 * total_variation(noisy)
    # Smoothed, not flattened: it follows the falling loss (the logged points stray from it by up to 0.6).
    assert np.abs(ys - trend)[20:-20].max() < 0.15
    low, high = ax.get_ylim()
    late = ys[xs >= 0.1 * xs[-1]]  # the first tenth (the steep start) may leave the zoomed range
    assert low <= late.min() and late.max() <= high and low <= 1.8


def test_relative_improvement_interpolates_the_baseline_between_its_points() -> None:
    xs, rel = relative_improvement({100: 3.0, 200: 2.0}, {50: 2.0, 150: 2.4, 200: 1.9, 300: 1.0})
    assert xs == [150, 200]  # 50 and 300 lie outside the baseline's points
    assert rel == pytest.approx([100 * (2.5 - 2.4) / 2.5, 100 * (2.0 - 1.9) / 2.0])


def test_token_axis_mistakes_are_one_line_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = make_run(tmp_path, "a", {10: 3.0})
    b = make_run(tmp_path, "b", {10: 2.9}, "--model.mlp_hidden=600", world_size=None)
    out = tmp_path / "cmp"
    assert run_cli(main, [str(a), str(b), "--baseline", "a", "--out", str(out), "--x", "tokens"]) == 2
    assert run_cli(main, [str(a), str(b), "--baseline", "a", "--out", str(out), "--x", "epochs"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(e.startswith("error: ") for e in err)
    assert "run 'b' records no world_size" in err[0] and "--x steps" in err[0]
    assert "invalid choice: 'epochs'" in err[1]
    assert not out.exists()


def test_weight_dynamics_get_one_figure_per_statistic_with_a_line_per_layer(tmp_path: Path, figures: list) -> None:
    """Runs that logged weights/layer{i}/{matrix}/{stat} get weights_{matrix}_{stat}.png: a panel per arm."""
    from torch.utils.tensorboard import SummaryWriter

    root = tmp_path / "suite"
    logged = {}
    for name, query in (("base", "linear"), ("res", "residual_mlp")):
        run = make_run(root, name, {100: 3.0, 200: 2.5}, query=query)
        matrices = ["w_q"] if query == "linear" else ["w1", "w2"]
        writer = SummaryWriter(str(run / "tb"))
        for step in (100, 200):
            for layer in range(3):
                for m in matrices:
                    value = layer + step / 1000
                    writer.add_scalar(f"weights/layer{layer}/{m}/drift", value, step)
                    logged[(name, m, layer, step)] = value
        writer.close()
    out = tmp_path / "cmp"
    assert run_cli(main, [str(root), "--baseline", "base", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.glob("weights_*.png"))
    assert names == ["weights_w1_drift.png", "weights_w2_drift.png", "weights_w_q_drift.png"]
    w_q = next(f for f in figures if f._suptitle is not None and "w_q" in f._suptitle.get_text())
    panels = [ax for ax in w_q.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["base"]  # only the arm that has a W_Q
    lines = panels[0].get_lines()
    assert len(lines) == 3  # a line per layer
    for layer, ln in enumerate(lines):
        assert list(ln.get_ydata()) == [f32(logged[("base", "w_q", layer, s)]) for s in (100, 200)]
    assert "drift" in panels[0].get_ylabel() and "layer" in [ax.get_ylabel() for ax in w_q.axes]


def test_learning_rates_plot_draws_each_group_of_each_arm() -> None:
    """learning_rates.png: a line per optimizer group (lr/<name>) of each arm's first seed, the values as logged;
    an arm with the paper's two groups draws its one lr."""
    pytest.importorskip("matplotlib")
    from torchnlq.experiments.compare import Group, RunData
    from torchnlq.experiments.compare_plots import draw_learning_rates, plot_comparison

    def run(name: str, lrs: dict[str, dict[int, float]]) -> RunData:
        return RunData(Path(name), name, {"training": {"seed": 1}}, {}, {10: 3.0, 20: 2.5}, {}, {}, lrs)

    muon = run("muon", {"lr": {1: 1e-3, 2: 2e-3}, "lr/muon": {1: 1e-3, 2: 2e-3}, "lr/query_mlp": {1: 2e-3, 2: 4e-3}})
    adamw = run("adamw", {"lr": {1: 1e-3, 2: 2e-3}})
    groups = [Group("adamw", [adamw]), Group("muon", [muon])]
    ax = draw_learning_rates(groups).axes[0]
    drawn = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}
    assert drawn == {"adamw": ([1, 2], [1e-3, 2e-3]), "muon: muon": ([1, 2], [1e-3, 2e-3]),
                     "muon: query_mlp": ([1, 2], [2e-3, 4e-3])}
    assert "learning_rates.png" in plot_comparison(groups, groups[0])[0]
    assert "learning_rates.png" not in plot_comparison([groups[0]], groups[0])[0]  # the paper's groups only


def test_branched_decays_compare_at_their_last_validation_with_the_trunk_drawn_beneath(tmp_path: Path) -> None:
    from torchnlq.experiments.compare import load_run
    from torchnlq.experiments.compare_plots import trunks

    stable = make_run(tmp_path, "stable", {1000: 3.2, 2000: 3.0, 3000: 2.9, 4000: 2.85}, "--lr_schedule.name=wsd")
    short = branch(tmp_path, "decay30", stable, 2000, {2000: 3.0, 2300: 2.7})
    long = branch(tmp_path, "decay50", stable, 2000, {2000: 3.0, 2500: 2.6})
    # They share the branch point only, where every branch is still its trunk: each is read at its own end.
    compare_runs([stable, short, long], stable, tmp_path / "cmp")
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "every run is compared at its own last validation" in md and "| step | val loss @ last validation |" in md
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO((tmp_path / "cmp" / "runs.csv").read_text()))}
    assert {n: (int(r["step"]), pytest.approx(float(r["val_loss"]))) for n, r in rows.items()} == {
        "stable": (4000, 2.85), "decay30": (2300, 2.7), "decay50": (2500, 2.6)}
    # (L_base - L) / L_base, the stable run's end as the baseline
    table = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| decay")}
    assert f"{100 * (2.85 - 2.6) / 2.85:+.2f}%" in table["decay50"]
    assert "- decay30: started from" in md and "- decay50: started from" in md
    assert trunks([_group(load_run(p)) for p in (stable, short, long)]) == {"stable"}
    # Two branches alone: the same, without the trunk.
    compare_runs([short, long], short, tmp_path / "cmp2")
    assert "val loss @ last validation" in (tmp_path / "cmp2" / "comparison.md").read_text()


def test_runs_of_other_batch_sizes_compare_at_a_token_count(tmp_path: Path) -> None:
    # 8 x 256 = 2,048 tokens per step against 16 x 256 = 4,096: 40,960 tokens are steps 20 and 10.
    small = make_run(tmp_path, "small", {10: 3.5, 20: 3.1}, "--training.micro_batch_size=8",
                     "--training.seq_len=256")
    large = make_run(tmp_path, "large", {10: 3.2, 20: 2.9}, "--training.micro_batch_size=16",
                     "--training.seq_len=256")
    compare_runs([small, large], small, tmp_path / "cmp", tokens=40_960)
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO((tmp_path / "cmp" / "runs.csv").read_text()))}
    assert (rows["small"]["step"], rows["large"]["step"]) == ("20", "10")
    assert "val loss @ 40,960 tokens" in (tmp_path / "cmp" / "comparison.md").read_text()
    with pytest.raises(UserError, match="run 'large' has no validation at 20,480 tokens"):
        compare_runs([small, large], small, tmp_path / "cmp3", tokens=20_480)


def _group(run):  # noqa: ANN001, ANN202 - a one-run Group for trunks()
    from torchnlq.experiments.compare import Group

    return Group(run.name, [run])


@pytest.mark.parametrize("active", [None, 1000, 640])
def test_the_params_column_shows_active_parameters_where_they_differ(tmp_path: Path, active: int | None) -> None:
    """An MoE's run_info.json records fewer active than total non-embedding parameters: the table shows both; a
    dense run's (equal) or an older run's (no record of them) shows the total alone."""
    root = tmp_path / "suite"
    make_run(root, "base", {100: 3.0})
    run = make_run(root, "moe", {100: 2.9}, "--model.mlp_hidden=600")
    info = json.loads((run / "run_info.json").read_text())
    (run / "run_info.json").write_text(json.dumps(info | ({} if active is None else
                                                          {"active_non_embedding_params": active})))
    compare_runs([root], "base", tmp_path / "cmp")
    row = next(line for line in (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
               if line.startswith("| moe |"))
    cell = row.split(" | ")[3]
    assert cell == ("1,000 (active 640)" if active == 640 else "1,000"), row
