"""Scaling suites and the loss-against-compute fit (torchnlq/experiments/scaling.py, issue 34.1).

The fit is checked on synthetic points drawn from L(C) = E + A (C/C0)^-alpha written out here, with a known
exponent; the crossing against the curves' difference solved by hand; a [scaling] table's runs against the
budget rule (tokens = ratio x the model's non-embedding parameters) computed from the model built here; and a
tiny scaling suite end to end on the synthetic corpus: its fit against one made here from the runs' own logged
losses and compute written out (6 N + 12 L H hd T FLOPs per token).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO_ROOT

from torchnlq.errors import UserError
from torchnlq.experiments.scaling import Fit, LawFit, Point, crossings, fit_all, fit_power_law
from torchnlq.experiments.suite import load_suite
from torchnlq.models.counts import num_params
from torchnlq.models import build_model


def law(c: float, e: float, a: float, alpha: float, c0: float = 1e9) -> float:
    return e + a * (c / c0) ** -alpha


def test_the_fit_recovers_a_known_exponent_and_floor() -> None:
    flops = [1e9 * 2**k for k in range(8)]
    losses = [law(c, 1.7, 2.5, 0.34) for c in flops]
    fit = fit_power_law(flops, losses, 1e9)
    assert fit.params == pytest.approx((1.7, 2.5, 0.34), rel=1e-4)
    assert (fit.dof, fit.on_bounds, fit.covariance_estimable) == (8 - 3, (), True)
    # with noise of 0.2% the exponent stays within a few percent
    rng = np.random.default_rng(0)
    noisy = [loss * (1 + 0.002 * rng.standard_normal()) for loss in losses]
    assert fit_power_law(flops, noisy, 1e9).alpha == pytest.approx(0.34, rel=0.1)


def test_seeds_give_the_spread_and_the_curves_cross_where_their_difference_vanishes() -> None:
    flops = [1e9 * 2**k for k in range(6)]
    points = []
    for seed, wiggle in ((1, 0.000), (2, 0.004), (3, -0.004)):
        points += [Point(f"lin{seed}-{c:g}", "linear", seed, c, law(c, 1.8, 2.0, 0.30) + wiggle) for c in flops]
        points += [Point(f"res{seed}-{c:g}", "residual_mlp", seed, c, law(c, 1.6, 2.4, 0.28) + wiggle)
                   for c in flops]
    linear, residual = fit_all(points)
    assert (linear.query_type, residual.query_type) == ("linear", "residual_mlp")
    assert len(linear.seed_fits) == 3 and linear.spread(2) is not None and linear.spread(2) > 0
    # The two laws written out meet where 1.8 + 2.0 x^-0.30 = 1.6 + 2.4 x^-0.28 (x = C / 1e9), by bisection here.
    lo, hi = 1.0, 1e6
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if (1.8 + 2.0 * mid**-0.30) - (1.6 + 2.4 * mid**-0.28) < 0:  # linear still lower: the meeting is further
            lo = mid
        else:
            hi = mid
    meet = crossings(linear, residual, 1e9, 1e15)
    assert len(meet) == 1 and meet[0] == pytest.approx(1e9 * lo, rel=0.05)
    assert crossings(linear, residual, 1e9, 1e9 * lo / 10) == []  # not within a range that ends before it


def test_fewer_than_three_budgets_is_one_line() -> None:
    with pytest.raises(UserError, match="needs runs at 3 or more compute budgets, got 2"):
        fit_power_law([1e9, 2e9, 2e9], [3.0, 2.9, 2.91], 1e9)


# ----- what a fit can say: degrees of freedom, bounds, covariance, crossings outside the measured range ---------

@pytest.mark.parametrize("losses, bound", [
    ([3.0, 2.5, 2.0, 1.5], "E on its lower bound"),  # equal steps per 4x compute: no floor above zero fits
    ([5.0, 2.0, 2.0, 2.0], "alpha on its upper bound"),  # all of the fall in the first step: as steep as allowed
    ([2.0, 2.0, 2.0, 2.0], "alpha on its lower bound"),  # no fall at all
    ([2.0, 2.1, 2.2, 2.3], "E on its upper bound"),  # the loss rises: the floor is the lowest loss
])
def test_a_parameter_the_runs_do_not_determine_is_named_on_its_bound(losses: list[float], bound: str) -> None:
    flops = [1e9 * 4**k for k in range(len(losses))]
    fit = fit_all([Point(f"r{k}", "linear", 1, c, loss) for k, (c, loss) in enumerate(zip(flops, losses))])[0]
    assert bound in fit.checks() and fit.law.dof == 1
    assert fit_all([Point(f"r{k}", "linear", 1, 1e9 * 4**k, law(1e9 * 4**k, 1.8, 2.0, 0.3)) for k in range(4)]
                   )[0].checks() == ["1 degree of freedom"]  # a law inside the bounds: nothing on one


def write_fit_run(root: Path, name: str, query: str, flops_per_token: int, loss: float, seed: int = 1) -> None:
    """A finished run folder as fit_scaling.py reads it: one validation at step 1, so its training compute is
    flops_per_token x the default config's tokens per step."""
    from torch.utils.tensorboard import SummaryWriter

    from torchnlq.config.manager import load_job_config
    from torchnlq.config.render import to_toml

    run = root / name
    run.mkdir(parents=True)
    cfg = load_job_config([f"--job.name={name}", f"--model.query.type={query}", f"--training.seed={seed}"])
    (run / "config.toml").write_text(to_toml(cfg))
    (run / "run_info.json").write_text(json.dumps({
        "name": name, "step": 1, "steps": 1, "finished": True, "query_type": query, "non_embedding_params": 1000,
        "flops_per_token": flops_per_token, "world_size": 1, "batch_fingerprint": "aaaa",
        "validation_fingerprint": "vvvv"}))
    writer = SummaryWriter(str(run / "tb"))
    writer.add_scalar("loss/val", loss, 1)
    writer.close()


def fit_scaling(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """``fit_scaling.py ARGV`` as its __main__ runs it: (stdout, stderr with every warning shown as a line)."""
    from torchnlq.cli import run_cli
    from torchnlq.experiments.scaling import main

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_cli(main, argv) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err + "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)


def row_of(report: str, first_cell: str) -> list[str]:
    return [cell.strip() for cell in next(line for line in report.splitlines()
                                          if line.startswith(f"| {first_cell} |")).split("|")[1:-1]]


TOKENS_PER_STEP = 8 * 256  # the default config's micro_batch_size x seq_len (grad_accum_steps 1)


def test_three_runs_per_query_type_are_an_exact_fit_that_predicts_only_when_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The issue's case: three budgets per query type, three parameters. The report says so in words, shows no
    prediction and no crossing, and scipy's covariance warning never reaches stderr."""
    runs = tmp_path / "runs"
    for k in range(3):  # compute x = 1, 4, 16 (units of the smallest run)
        write_fit_run(runs, f"linear_{k}", "linear", 1000 * 4**k, law(4**k, 1.8, 2.0, 0.3, c0=1.0))
        write_fit_run(runs, f"residual_{k}", "residual_mlp", 1000 * 4**k, (3.0, 2.5, 2.0)[k])  # E -> 0
    out, err = fit_scaling([str(runs), "--out", str(tmp_path / "fit"), "--at-flops", str(64 * 1000 * TOKENS_PER_STEP)],
                           capsys)
    assert err == ""
    linear, residual = row_of(out, "linear"), row_of(out, "residual_mlp")
    assert linear[6] == residual[6] == "not shown: exactly determined"
    assert linear[7] == "0 degrees of freedom (exactly determined); covariance not estimable"
    assert residual[7] == "0 degrees of freedom (exactly determined); E on its lower bound; covariance not estimable"
    assert "- residual_mlp: E = 0, its lower bound (no floor above zero): the runs do not determine it" in out
    assert "where they cross is not shown: the fit of linear and residual_mlp is exactly determined" in out
    assert "cross at" not in out and "is lower by" not in out
    assert (tmp_path / "fit" / "scaling.md").read_text() in out

    out, err = fit_scaling([str(runs), "--out", str(tmp_path / "fit2"), "--at-flops",
                            str(64 * 1000 * TOKENS_PER_STEP), "--allow-exact-fits"], capsys)
    assert err == ""
    # Three points of a law in the family: the exact fit is that law, so it predicts the law's own value at x = 64.
    assert float(row_of(out, "linear")[6]) == pytest.approx(law(64, 1.8, 2.0, 0.3, c0=1.0), abs=1e-4)
    assert "(from the exactly determined fit of linear and residual_mlp)" in out


@pytest.mark.parametrize("budgets, inside", [(8, True), (5, False)])
def test_many_runs_fit_the_law_that_made_them_and_a_crossing_says_whether_it_was_measured(
        tmp_path: Path, capsys: pytest.CaptureFixture, budgets: int, inside: bool) -> None:
    """Runs at 2^0 .. 2^(budgets-1) times the smallest compute from two laws written out here, which meet at
    x = 33.8 (solved by bisection below): inside the range of 8 budgets (up to 128), beyond that of 5 (up to 16)."""
    runs = tmp_path / "runs"
    for k in range(budgets):
        write_fit_run(runs, f"linear_{k}", "linear", 1000 * 2**k, law(2**k, 1.8, 2.0, 0.30, c0=1.0))
        write_fit_run(runs, f"residual_{k}", "residual_mlp", 1000 * 2**k, law(2**k, 1.6, 2.4, 0.28, c0=1.0))
    lo, hi = 1.0, 1e6
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if (1.8 + 2.0 * mid**-0.30) - (1.6 + 2.4 * mid**-0.28) < 0 else (lo, mid)
    at = 1000 * 1000 * TOKENS_PER_STEP  # x = 1000
    out, err = fit_scaling([str(runs), "--out", str(tmp_path / "fit"), "--at-flops", str(at)], capsys)
    assert err == ""
    for query, (e, a, alpha) in (("linear", (1.8, 2.0, 0.30)), ("residual_mlp", (1.6, 2.4, 0.28))):
        row = row_of(out, query)
        assert [float(row[3]), float(row[4]), float(row[5])] == pytest.approx([alpha, e, a], abs=2e-3)
        assert float(row[6]) == pytest.approx(law(1000, e, a, alpha, c0=1.0), abs=2e-3)
        assert row[7] == f"{budgets - 3} degrees of freedom"
        assert f"- {query}: {budgets} runs for 3 parameters: {budgets - 3} degrees of freedom." in out
    line = next(line for line in out.splitlines() if line.startswith("- linear and residual_mlp cross at "))
    meet = float(line.split("cross at ")[1].split(" FLOPs")[0])
    assert meet == pytest.approx(lo * 1000 * TOKENS_PER_STEP, rel=0.01)
    assert ("outside the runs' range" in line) is not inside
    gap = (1.8 + 2.0 * 1000**-0.30) - (1.6 + 2.4 * 1000**-0.28)  # at x = 1000, beyond both ranges
    assert f"at 2.05e+09 FLOPs (extrapolated) residual_mlp is lower by {gap:.4f}." in line


def write_suite(tmp_path: Path, scaling: str, extra: str = "") -> Path:
    suite = tmp_path / "scaling.toml"
    suite.write_text(f'name = "s"\ndump_folder = "{tmp_path / "runs"}"\nconfig = "{REPO_ROOT}/train_configs/'
                     f'debug_model.toml"\nbaseline = "linear"\n'
                     f'overrides = ["--data.path={tmp_path / "data"}", "--training.device=cpu", '
                     f'"--metrics.query_diagnostics_interval=0", "--validation.sequences=16"]\n{extra}'
                     f"[scaling]\n{scaling}")
    return suite


def test_a_scaling_table_expands_into_sizes_times_query_types_times_seeds_with_their_budgets(tmp_path: Path) -> None:
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.preflight import check_job_config

    suite = load_suite(write_suite(tmp_path, 'sizes = [{n_layers = 1, dim = 16, n_heads = 2}, "debug"]\n'
                                             "seeds = [1, 2]\ntokens_per_parameter = 5\n"
                                             "lr = {base = 4e-3, at_dim = 16, exponent = 0.5}\nwarmup_fraction = 0.2\n"))
    assert [r.name for r in suite.runs][:4] == ["linear_L1d16h2_seed1", "linear_L1d16h2_seed2",
                                                "residual_mlp_L1d16h2_seed1", "residual_mlp_L1d16h2_seed2"]
    assert len(suite.runs) == 8 and suite.baseline == "linear_L1d16h2_seed1" and suite.scaling
    import torch

    for run in suite.runs:
        cfg = load_job_config(run.argv())
        # The budget of a size: the first query type's (linear) parameters, for every query type.
        args = check_job_config(load_job_config([*run.argv(), "--model.query.type=linear"]))
        with torch.device("meta"):
            model = build_model(args)
        embedding = sum(p.numel() for n, p in model.named_parameters() if n in ("tok_emb.weight", "pos_emb.weight"))
        non_embedding = sum(p.numel() for p in model.parameters()) - embedding
        tokens_per_step = cfg.training.micro_batch_size * cfg.training.seq_len * cfg.training.grad_accum_steps
        assert cfg.training.steps == math.ceil(5 * non_embedding / tokens_per_step), run.name
        assert cfg.lr_schedule.decay_steps == cfg.training.steps
        assert cfg.lr_schedule.warmup_steps == round(0.2 * cfg.training.steps)
        assert cfg.optimizer.lr == pytest.approx(4e-3 * (16 / args.dim) ** 0.5, rel=1e-5)
        assert cfg.training.seed == int(run.name[-1]) and cfg.model.query.type in run.name


@pytest.mark.parametrize("scaling, fragment", [
    ("sizes = []\n", "sizes must be a non-empty list"),
    ("sizes = [{layers = 2}]\n", "sizes[0] = {'layers': 2}: give a flavor name or"),
    ('sizes = ["debug"]\ntokens_per_parameter = 0\n', "scaling.tokens_per_parameter must be > 0, got 0"),
    ('sizes = ["debug"]\ntokens = [1, 2]\n', "tokens must list one budget per size (1)"),
    ('sizes = ["debug"]\nlr = {base = 1e-3}\n', "give base and at_dim"),
    ('sizes = ["debug"]\nwarmup_fraction = 1.0\n', "scaling.warmup_fraction must be < 1, got 1.0"),
    ('sizes = ["debug"]\nquery_types = ["quadratic"]\n', "model.query.type: unknown 'quadratic'"),
    ('sizes = ["debug"]\nbudget = 3\n', "unknown key 'scaling.budget' (known: lr, query_types"),
    ('sizes = [{n_layers = 1, dim = 30, n_heads = 4}]\n', "model.n_heads=4 does not divide model.dim=30"),
])
def test_scaling_table_mistakes_are_one_line(tmp_path: Path, scaling: str, fragment: str) -> None:
    with pytest.raises(UserError) as caught:
        load_suite(write_suite(tmp_path, scaling))
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.integration  # trains six tiny runs through run_suite.py
def test_a_tiny_scaling_suite_runs_and_its_fit_matches_one_made_from_the_logged_losses(tmp_path: Path) -> None:
    from scipy.optimize import OptimizeWarning, curve_fit
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchnlq.cli import run_cli
    from torchnlq.experiments.suite_run import main as suite_main

    suite = write_suite(tmp_path, 'sizes = [{n_layers = 1, dim = 16, n_heads = 2}, {n_layers = 1, dim = 32, '
                                  'n_heads = 2}, {n_layers = 2, dim = 32, n_heads = 2}]\ntokens_per_parameter = 4\n',
                        extra="")
    assert run_cli(suite_main, [str(suite)]) == 0
    report = (tmp_path / "runs" / "scaling.md").read_text()
    points: dict[str, list[tuple[float, float]]] = {}
    for run in sorted((tmp_path / "runs").glob("*_L*")):
        config = json.loads((run / "run_info.json").read_text())
        toml = (run / "config.toml").read_text()
        n_layers, dim = (int(v) for v in (_value(toml, "n_layers"), _value(toml, "dim")))
        acc = EventAccumulator(str(run / "tb"))
        acc.Reload()
        val = {e.step: e.value for e in acc.Scalars("loss/val")}
        step = max(val)
        # 6 N + 12 L H hd T per token: N = the blocks' parameters and the (tied) head, written out for this block
        # (two LayerNorms without bias, K and V 2 d^2, the out-projection d^2, a GELU MLP of 4 d, the query's d^2
        # and, for the residual MLP, its two norms).
        query = config["query_type"]
        per_block = 2 * dim + 2 * dim * dim + dim * dim + 8 * dim * dim + dim * dim + (2 * dim if query == "residual_mlp"
                                                                                         else 0)
        n = n_layers * per_block + dim + 320 * dim  # ln_f, and the head (the byte vocabulary padded to 320)
        flops = (6 * n + 12 * n_layers * dim * 128) * 16 * 128 * step
        row = next(line for line in report.splitlines() if line.startswith(f"| {run.name} |"))
        assert float(row.split("|")[4]) == pytest.approx(flops, rel=1e-5), row
        points.setdefault(query, []).append((flops, val[step]))
    c0 = min(c for pts in points.values() for c, _ in pts)
    for query, pts in points.items():
        c = np.array([p[0] for p in pts]) / c0
        y = np.array([p[1] for p in pts])
        with warnings.catch_warnings():  # three sizes, three parameters: scipy says no covariance, the fit says so
            warnings.simplefilter("ignore", OptimizeWarning)
            (e, a, alpha), _ = curve_fit(lambda x, e, a, al: e + a * x**-al, c, y, p0=(0.5 * y.min(), 1.0, 0.3),
                                         bounds=([0, 0, 1e-4], [y.min(), np.inf, 5.0]), maxfev=20000)
        row = next(line for line in report.splitlines() if line.startswith(f"| {query} |")).split("|")
        assert float(row[4]) == pytest.approx(alpha, abs=2e-3) and float(row[5]) == pytest.approx(e, abs=2e-3), row
        assert "0 degrees of freedom (exactly determined)" in row[8] and "not shown" in row[7], row


def _value(toml: str, key: str) -> str:
    """A key's value in the [model] section of a resolved config.toml."""
    model = toml.split("[model]")[1].split("\n[")[0]
    return next(line.split("=")[1].strip() for line in model.splitlines() if line.startswith(f"{key} ="))


def test_fit_fields_are_what_the_report_reads() -> None:
    fit = Fit("linear", LawFit(1.5, 2.0, 0.3, dof=2), 1e9)
    assert fit.loss_at(1e9 * 32) == pytest.approx(law(1e9 * 32, 1.5, 2.0, 0.3))
    assert fit.spread(2) is None and fit.loss_spread_at(1e12) is None


def test_the_dry_run_budget_is_flops_over_the_cards_peak_at_the_measured_mfu(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture) -> None:
    from torchnlq.cli import run_cli
    from torchnlq.config.manager import load_job_config
    from torchnlq.experiments.suite_run import main as suite_main
    from torchnlq.train.preflight import check_job_config

    path = write_suite(tmp_path, 'sizes = [{n_layers = 1, dim = 16, n_heads = 2}, "debug"]\ntokens = [500_000_000_000, 2_000_000_000_000]\n')
    assert run_cli(suite_main, [str(path), "--dry-run"]) == 0
    table = capsys.readouterr().out.split("# budget")[1]
    total_5090 = 0.0
    for run in load_suite(path).runs:
        cfg = load_job_config(run.argv())
        args = check_job_config(cfg)
        tokens = cfg.training.steps * 16 * 128
        # 6 N + 12 L H hd T FLOPs per token (N with the tied head), 40% of the card's dense bf16 peak
        n = num_params(args, non_embedding=True) + args.vocab_size * args.dim
        flops = (6 * n + 12 * args.n_layers * args.dim * 128) * tokens
        hours = {"5090": flops / (0.40 * 209.5e12) / 3600, "H100": flops / (0.40 * 989e12) / 3600}
        total_5090 += hours["5090"]
        row = next(line for line in table.splitlines() if line.startswith(f"| {run.name} |")).split("|")
        assert int(row[3].replace(",", "")) == tokens and float(row[4]) == pytest.approx(flops, rel=1e-2)
        assert float(row[5].replace(",", "")) == pytest.approx(hours["5090"], rel=5e-3)
        assert float(row[6].replace(",", "")) == pytest.approx(hours["H100"], rel=5e-3)
        assert "fits: RTX 5090, H100 SXM" in row[7]
    total = next(line for line in table.splitlines() if line.startswith("| total |")).split("|")
    assert float(total[5].replace(",", "")) == pytest.approx(total_5090, rel=5e-3)
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
