"""Scaling suites and their fit: validation loss against training compute, per query type.

A suite's ``[scaling]`` table (docs/experiments.md, "Scaling") expands into a grid of model sizes x query
types x seeds, each run's token budget from a rule (tokens per parameter, Chinchilla's 20 by default, or one
budget per size) and its learning rate and schedule from a rule stated in the same table. ``fit_scaling.py``
reads the finished runs and fits, per query type, a power law with a floor

    L(C) = E + A * (C / C0) ** -alpha        C: training FLOPs (the model's own count x tokens seen)

by least squares (``scipy.optimize.curve_fit``), with the spread of the same fit made on each seed's runs alone
as its uncertainty; it reports the exponents, the loss predicted at a compute the user names and where, if
anywhere, the query types' curves cross.
"""

from __future__ import annotations

import math
import statistics
import typing
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchnlq.config.job_config import option
from torchnlq.config.manager import load_table
from torchnlq.errors import UserError
from torchnlq.models.counts import num_params

SIZE_KEYS = ("flavor", "n_layers", "dim", "n_heads")
LR_KEYS = ("base", "at_dim", "exponent")
#: Chinchilla's compute-optimal ratio (Hoffmann et al. 2022): about 20 training tokens per parameter.
CHINCHILLA_TOKENS_PER_PARAMETER = 20.0


# ----- the suite side: a [scaling] table -> runs --------------------------------------------------------------


@dataclass(frozen=True)
class ScalingRun:
    """One run of a scaling grid: its arm (the query type), its folder name and the overrides that make it."""

    arm: str
    name: str
    overrides: tuple[str, ...]


def _size_label(size: dict[str, Any]) -> str:
    if "flavor" in size:
        return str(size["flavor"])
    return f"L{size['n_layers']}d{size['dim']}" + (f"h{size['n_heads']}" if "n_heads" in size else "")


def _positive(where: str, value: Any, kind: type = float) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)
    if not ok or (kind is int and not isinstance(value, int)):
        raise UserError(f"{where} must be a positive {'integer' if kind is int else 'number'}, got {value!r}")
    return value


@dataclass(frozen=True)
class ScalingTable:
    """A suite's ``[scaling]`` table: the grid and its rules (docs/experiments.md, "Scaling")."""

    sizes: list[object] = option([], "Model sizes: flavor names or {n_layers = N, dim = D} tables (n_heads "
                                 "optional).")
    query_types: list[str] = option(["linear", "residual_mlp"], "The query types compared at every size.")
    seeds: list[int] | None = option(None, "training.seed of each run (default: the config's; one run per size).")
    tokens_per_parameter: float = option(CHINCHILLA_TOKENS_PER_PARAMETER, "The token budget of a size: this many "
                                         "tokens per non-embedding parameter.", min=0, min_exclusive=True)
    tokens: list[int] | None = option(None, "Instead: one token budget per size.", min=1)
    lr: object = option(None, "optimizer.lr of a run: a number, or base * (at_dim / dim) ** exponent given as "
                        "{base, at_dim, exponent} (base: one number, or one per query type).")
    warmup_fraction: float = option(0.1, "Warmup steps as a fraction of a run's steps.", min=0, max=1,
                                    max_exclusive=True)


def expand_scaling(where: str, raw: Any, load: Callable[[list[str]], tuple[Any, Any]]) -> list[ScalingRun]:
    """The runs of a ``[scaling]`` table; ``load(overrides)`` returns the (JobConfig, ModelArgs) of the suite's
    config with those overrides, so the budget follows each size's own parameter count. Mistakes are one line."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: [scaling] must be a table (sizes, query_types, seeds, ...)")
    table = load_table(ScalingTable, where, "scaling", raw)
    if not table.sizes:
        raise UserError(f"{where}: [scaling] sizes must be a non-empty list of {{n_layers, dim}} tables or "
                        "flavor names")
    sizes = [{"flavor": s} if isinstance(s, str) else s for s in table.sizes]
    for i, size in enumerate(sizes):
        if not isinstance(size, dict) or not (set(size) <= set(SIZE_KEYS)) or not ({"flavor"} <= set(size) or
                                                                              {"n_layers", "dim"} <= set(size)):
            raise UserError(f"{where}: [scaling] sizes[{i}] = {size!r}: give a flavor name or "
                            "{n_layers = N, dim = D} (n_heads optional)")
    query_types, seeds, budgets, ratio = table.query_types, table.seeds, table.tokens, table.tokens_per_parameter
    if not query_types or seeds == []:
        raise UserError(f"{where}: [scaling] query_types and seeds must be non-empty lists")
    if "tokens" in raw and "tokens_per_parameter" in raw:
        raise UserError(f"{where}: [scaling] gives tokens_per_parameter and tokens; the budget comes from one rule")
    if budgets is not None and len(budgets) != len(sizes):
        raise UserError(f"{where}: [scaling] tokens must list one budget per size ({len(sizes)}), got {budgets!r}")
    warmup, lr_rule = table.warmup_fraction, table.lr
    if lr_rule is not None and not isinstance(lr_rule, (int, float, dict)):
        raise UserError(f"{where}: [scaling] lr must be a number or {{base, at_dim, exponent}}, got {lr_rule!r}")
    if isinstance(lr_rule, dict) and (set(lr_rule) - set(LR_KEYS) or not {"base", "at_dim"} <= set(lr_rule)):
        raise UserError(f"{where}: [scaling] lr = {lr_rule!r}: give base and at_dim (exponent optional, default 1): "
                        "lr = base * (at_dim / dim) ** exponent")
    bases = lr_rule.get("base") if isinstance(lr_rule, dict) else None
    if isinstance(bases, dict) and set(bases) != set(query_types):
        raise UserError(f"{where}: [scaling] lr.base names {sorted(bases)}; give one base per query type "
                        f"({', '.join(query_types)}) or one number for all")

    runs = []
    for index, size in enumerate(sizes):
        size_args = [f"--model.{k}={v}" for k, v in size.items()]
        # One budget per size, from the first query type's parameters: every query type sees the same tokens.
        cfg, args = load([*size_args, f"--model.query.type={query_types[0]}"])
        params = num_params(args, non_embedding=True)
        tokens = budgets[index] if budgets is not None else ratio * params
        steps = max(1, math.ceil(tokens / cfg.training.tokens_per_step()))
        schedule = [f"--training.steps={steps}", f"--lr_schedule.warmup_steps={round(warmup * steps)}",
                    f"--lr_schedule.decay_steps={steps}"]
        for query in query_types:
            rule = [f"--optimizer.lr={_rule_lr(where, lr_rule, query, args.dim):.6g}"] if lr_rule is not None else []
            for seed in seeds or [cfg.training.seed]:
                name = f"{query}_{_size_label(size)}" + (f"_seed{seed}" if seeds else "")
                runs.append(ScalingRun(query, name, (*size_args, f"--model.query.type={query}",
                                                     f"--training.seed={seed}", *schedule, *rule)))
    return runs


def _rule_lr(where: str, rule: Any, query: str, dim: int) -> float:
    """The learning rate of ``query`` at width ``dim``: a number, or base (one, or per query type) x
    (at_dim / dim) ** exponent."""
    if not isinstance(rule, dict):
        return _positive(f"{where}: [scaling] lr", rule)
    base = rule["base"][query] if isinstance(rule["base"], dict) else rule["base"]
    exponent = rule.get("exponent", 1.0)
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)) or not math.isfinite(exponent):
        raise UserError(f"{where}: [scaling] lr.exponent must be a number, got {exponent!r}")
    lr = _positive(f"{where}: [scaling] lr.base", base) * (_positive(f"{where}: [scaling] lr.at_dim", rule["at_dim"])
                                                            / dim) ** exponent
    return _positive(f"{where}: [scaling] lr", lr)


# ----- the fit -------------------------------------------------------------------------------------------------

#: The fit's bounds on alpha (docs/experiments.md, "Scaling"): a loss that falls with compute (alpha > 0; the lower
#: bound keeps the power finite) and no faster than C^-5, far beyond any measured language-model exponent (0.05-0.5).
ALPHA_BOUNDS = (1e-4, 5.0)
#: The law's three parameters: with as many runs as this the fit is exactly determined.
N_PARAMETERS = 3
#: A parameter this close to a bound (relative to its scale: the losses for E and A, 1 for alpha) is on it.
ON_BOUND_TOLERANCE = 1e-6


def power_law(c: np.ndarray, e: float, a: float, alpha: float) -> np.ndarray:
    """E + A * c ** -alpha (c: compute over the fit's reference C0)."""
    return e + a * np.power(c, -alpha)


@dataclass
class Point:
    """One run at its last validation: training FLOPs, validation loss, seed."""

    run: str
    query_type: str
    seed: Any
    flops: float
    loss: float


class Bound(typing.NamedTuple):
    """A parameter the fit left on one of its bounds: the runs do not determine it."""

    name: str  # E, A or alpha
    value: float
    side: str  # lower or upper

    def __str__(self) -> str:
        return f"{self.name} = {self.value:.4g}, its {self.side} bound{_BOUND_MEANINGS.get((self.name, self.side), '')}"


#: What a parameter on a bound says about the runs.
_BOUND_MEANINGS = {("E", "lower"): " (no floor above zero)",
                   ("E", "upper"): " (the lowest loss measured: the runs show no floor below it)",
                   ("A", "lower"): " (a flat curve)",
                   ("alpha", "lower"): " (the loss does not fall with compute)"}


@dataclass(frozen=True)
class LawFit:
    """A least-squares fit of ``L = E + A (C / C0) ** -alpha`` and what it can say.

    ``dof`` is the runs less the three parameters (0: exactly determined, no run left over to test the law);
    ``on_bounds`` the parameters the fit left on a bound; ``covariance_estimable`` is False where scipy could not
    estimate the parameters' covariance (no degrees of freedom, or directions the runs do not constrain).
    """

    e: float
    a: float
    alpha: float
    dof: int
    on_bounds: tuple[Bound, ...] = ()
    covariance_estimable: bool = True

    @property
    def params(self) -> tuple[float, float, float]:
        """(E, A, alpha)."""
        return self.e, self.a, self.alpha

    @property
    def exact(self) -> bool:
        """As many runs as parameters: no run is left over to test the law."""
        return self.dof == 0


def fit_power_law(flops: Sequence[float], losses: Sequence[float], c0: float) -> LawFit:
    """Least-squares (E, A, alpha) of ``L = E + A (C / c0) ** -alpha``, bounded to E in [0, min L], A >= 0 and alpha
    in :data:`ALPHA_BOUNDS`, with the degrees of freedom, the parameters on a bound and whether the covariance could
    be estimated (scipy's OptimizeWarning about the covariance becomes that flag, not a line on stderr)."""
    from scipy.optimize import OptimizeWarning, curve_fit

    c = np.asarray(flops, dtype=np.float64) / c0
    y = np.asarray(losses, dtype=np.float64)
    budgets = len(set(c.tolist()))
    if budgets < N_PARAMETERS:
        raise UserError(f"a power law with a floor has 3 parameters: it needs runs at 3 or more compute budgets, got "
                        f"{budgets}")
    lowest, highest = float(y.min()), float(y.max())
    lower, upper = (0.0, 0.0, ALPHA_BOUNDS[0]), (lowest, np.inf, ALPHA_BOUNDS[1])
    start = (0.5 * lowest, max(highest - 0.5 * lowest, 1e-3), 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)  # read from the covariance itself below
        try:
            params, covariance = curve_fit(power_law, c, y, p0=start, bounds=(lower, upper), maxfev=20000)
        except RuntimeError as e:  # no convergence
            raise UserError(f"the power-law fit did not converge ({e}); more budgets or seeds may help") from None
    scales = (max(lowest, 1e-12), max(highest, 1e-12), 1.0)  # E and A in units of the losses, alpha of 1
    on_bounds = tuple(
        Bound(name, bound, side)
        for name, value, low, high, scale in zip(("E", "A", "alpha"), params, lower, upper, scales)
        for bound, side in ((low, "lower"), (high, "upper"))
        if math.isfinite(bound) and abs(value - bound) <= ON_BOUND_TOLERANCE * scale
    )
    return LawFit(float(params[0]), float(params[1]), float(params[2]), dof=len(y) - N_PARAMETERS,
                  on_bounds=on_bounds, covariance_estimable=bool(np.isfinite(covariance).all()))


def _dof_words(dof: int) -> str:
    return f"{dof} degree{'' if dof == 1 else 's'} of freedom"


@dataclass
class Fit:
    """One query type's fitted law, its runs, and the same fit per seed (the spread of its parameters)."""

    query_type: str
    law: LawFit
    c0: float
    points: list[Point] = field(default_factory=list)
    seed_fits: list[tuple[float, float, float]] = field(default_factory=list)  # (e, a, alpha) per seed

    def loss_at(self, flops: float) -> float:
        """The fitted loss at ``flops``."""
        return float(power_law(np.asarray(flops / self.c0), *self.law.params))

    def spread(self, index: int) -> float | None:
        """The sample standard deviation over the seed fits of parameter ``index`` (0: E, 2: alpha); None below 2."""
        values = [f[index] for f in self.seed_fits]
        return statistics.stdev(values) if len(values) > 1 else None

    def loss_spread_at(self, flops: float) -> float | None:
        """The sample standard deviation of the seed fits' losses at ``flops``; None below 2 seeds."""
        values = [float(power_law(np.asarray(flops / self.c0), *f)) for f in self.seed_fits]
        return statistics.stdev(values) if len(values) > 1 else None

    @property
    def measured(self) -> tuple[float, float]:
        """The smallest and largest training compute of its runs."""
        return min(p.flops for p in self.points), max(p.flops for p in self.points)

    def checks(self) -> list[str]:
        """What the fit can and cannot say, in short words (the table's cell)."""
        law = self.law
        words = [_dof_words(law.dof) + (" (exactly determined)" if law.exact else "")]
        words += [f"{bound.name} on its {bound.side} bound" for bound in law.on_bounds]
        return words + ([] if law.covariance_estimable else ["covariance not estimable"])

    def notes(self, allow_exact: bool) -> list[str]:
        """The same as sentences for the report, each saying what it means for the fit's figures."""
        law = self.law
        runs = f"{len(self.points)} runs for {N_PARAMETERS} parameters"
        if law.exact:
            shown = ("its prediction and crossings are shown as asked (--allow-exact-fits)" if allow_exact else
                     "its prediction and crossings are not shown (--allow-exact-fits shows them)")
            out = [f"{runs}: the fit is exactly determined ({_dof_words(0)}): no run is left over to test the law; "
                   f"{shown}. More budgets or seeds would test it."]
        else:
            out = [f"{runs}: {_dof_words(law.dof)}."]
        out += [f"{bound}: the runs do not determine it, and the other parameters and the predictions depend on "
                "where the bound lies." for bound in law.on_bounds]
        if not law.covariance_estimable and not law.exact:  # an exact fit never has one: said above
            out.append("the parameters' covariance cannot be estimated (too few runs, or directions the runs do "
                       "not constrain): the fit gives no uncertainty of its own.")
        return out


def fit_query_type(points: list[Point], c0: float) -> Fit:
    """One query type's fit on all its points, and the same fit per seed (for seeds with 3+ budgets)."""
    fit = Fit(points[0].query_type, fit_power_law([p.flops for p in points], [p.loss for p in points], c0), c0, points)
    seeds = sorted({str(p.seed) for p in points})
    if len(seeds) > 1:
        for seed in seeds:
            own = [p for p in points if str(p.seed) == seed]
            if len({p.flops for p in own}) >= N_PARAMETERS:
                fit.seed_fits.append(fit_power_law([p.flops for p in own], [p.loss for p in own], c0).params)
    return fit


def crossings(first: Fit, second: Fit, lo: float, hi: float) -> list[float]:
    """Every compute in [lo, hi] where the two fitted curves meet (a log-spaced search, each refined by brentq)."""
    from scipy.optimize import brentq

    grid = np.geomspace(lo, hi, 2001)
    gap = [first.loss_at(c) - second.loss_at(c) for c in grid]
    found = []
    for i in range(len(grid) - 1):
        if gap[i] == 0.0:
            found.append(float(grid[i]))
        elif gap[i] * gap[i + 1] < 0:
            found.append(float(brentq(lambda c: first.loss_at(c) - second.loss_at(c), grid[i], grid[i + 1])))
    return found


# ----- reading runs, the report ------------------------------------------------------------------------------


def run_points(paths: list[str | Path], allow_different_data: bool = False) -> list[Point]:
    """Each finished run's last validation loss and its training FLOPs (flops_per_token x tokens seen there)."""
    from torchnlq.experiments.compare import check_same_data, expand_paths, load_run
    from torchnlq.experiments.compare_plots import tokens_per_step

    runs = [load_run(p) for p in expand_paths(list(paths))]
    if not allow_different_data:
        check_same_data(runs)
    points = []
    for run in runs:
        per_token = run.info.get("flops_per_token")
        if not isinstance(per_token, int) or isinstance(per_token, bool) or per_token < 1:
            raise UserError(f"run '{run.name}' records no flops_per_token in {run.path / 'run_info.json'}; it was "
                            "written by an older torchnlq: resume it once to rewrite the file")
        step = max(run.val)
        points.append(Point(run.name, str(run.info.get("query_type")), run.seed,
                            float(per_token) * tokens_per_step(run) * step, run.val[step]))
    return points


def fit_all(points: list[Point]) -> list[Fit]:
    """One fit per query type (in order of first appearance), all with one reference compute (the smallest)."""
    c0 = min(p.flops for p in points)
    kinds = list(dict.fromkeys(p.query_type for p in points))
    return [fit_query_type([p for p in points if p.query_type == kind], c0) for kind in kinds]


def _pm(value: float, spread: float | None, spec: str) -> str:
    return format(value, spec) + (f" ± {format(spread, spec)}" if spread is not None else "")


def report(fits: list[Fit], at_flops: float | None, allow_exact: bool = False) -> str:
    """The Markdown report: one row per query type (with what its fit can say), the notes in words, a row per run,
    then where the curves cross. An exactly determined fit's prediction and crossings are left out unless
    ``allow_exact``."""
    lo = min(f.measured[0] for f in fits)
    hi = max(f.measured[1] for f in fits)
    target = at_flops or hi
    beyond = " (beyond the largest run: extrapolated)" if target > hi else ""
    lines = [f"| query | runs | seeds | alpha | E (floor) | A | loss at {target:.3g} FLOPs{beyond} | fit |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for f in fits:
        seeds = len({str(p.seed) for p in f.points})
        predicted = (_pm(f.loss_at(target), f.loss_spread_at(target), ".4f") if allow_exact or not f.law.exact
                     else "not shown: exactly determined")
        lines.append(f"| {f.query_type} | {len(f.points)} | {seeds} | {_pm(f.law.alpha, f.spread(2), '.3f')} | "
                     f"{_pm(f.law.e, f.spread(0), '.4f')} | {f.law.a:.4f} | {predicted} | {'; '.join(f.checks())} |")
    lines += ["", f"Fit: L(C) = E + A (C / C0) ** -alpha, C0 = {fits[0].c0:.4g} FLOPs (the smallest run), least "
              "squares over every run of a query type, within the bounds E in [0, the lowest loss], A >= 0, alpha in "
              f"[{ALPHA_BOUNDS[0]:g}, {ALPHA_BOUNDS[1]:g}]; ± is the sample standard deviation of the same fit made "
              "on each seed's runs alone (from two seeds with three or more budgets each).", ""]
    lines += [f"- {f.query_type}: {note}" for f in fits for note in f.notes(allow_exact)]
    lines += ["", "| run | query | seed | training FLOPs | val loss |", "| --- | --- | --- | ---: | ---: |"]
    lines += [f"| {p.run} | {p.query_type} | {p.seed} | {p.flops:.6g} | {p.loss:.4f} |"
              for f in fits for p in sorted(f.points, key=lambda p: p.flops)]
    lines.append("")
    span = (lo, max(hi, target))
    for i, first in enumerate(fits):
        for second in fits[i + 1:]:
            lines.append(_crossing_line(first, second, span, allow_exact))
    return "\n".join(lines)


def _crossing_line(first: Fit, second: Fit, span: tuple[float, float], allow_exact: bool) -> str:
    """Where two query types' curves meet within ``span``, each meeting said to be inside or outside the compute
    their runs measured (one size's runs differ a little in compute between query types: the range is both's),
    and which is lower at the span's end."""
    pair = f"{first.query_type} and {second.query_type}"
    exact = [f.query_type for f in (first, second) if f.law.exact]
    if exact and not allow_exact:
        return (f"- {pair}: where they cross is not shown: the fit of {' and '.join(exact)} is exactly determined "
                "(as many runs as parameters); --allow-exact-fits shows it.")
    measured = (min(first.measured[0], second.measured[0]), max(first.measured[1], second.measured[1]))
    meet = [f"{c:.4g} FLOPs" + ("" if measured[0] <= c <= measured[1] else
                                f" (outside the runs' range, {measured[0]:.3g} to {measured[1]:.3g} FLOPs: "
                                "an extrapolation)")
            for c in crossings(first, second, *span)]
    where = (f"cross at {' and '.join(meet)}" if meet else
             f"do not cross between {span[0]:.3g} and {span[1]:.3g} FLOPs")
    end = span[1]
    lower = first if first.loss_at(end) < second.loss_at(end) else second
    extrapolated = " (extrapolated)" if end > measured[1] else ""
    caveat = f" (from the exactly determined fit of {' and '.join(exact)})" if exact else ""
    return (f"- {pair} {where}; at {end:.3g} FLOPs{extrapolated} {lower.query_type} is lower by "
            f"{abs(first.loss_at(end) - second.loss_at(end)):.4f}{caveat}.")


def plot(fits: list[Fit], at_flops: float | None, allow_exact: bool = False) -> bytes | None:
    """scaling.png: each query type's runs and fitted curve, loss against compute (log x); None without matplotlib.
    An exactly determined curve is drawn only between its runs (unless ``allow_exact``), and says so."""
    from torchnlq.experiments.compare_plots import png, pyplot

    plt = pyplot()
    if plt is None:
        return None
    lo = min(p.flops for f in fits for p in f.points)
    hi = max([p.flops for f in fits for p in f.points] + ([at_flops] if at_flops else []))
    grid = np.geomspace(lo, hi, 200)
    fig, ax = plt.subplots(figsize=(8, 5))
    for index, f in enumerate(fits):
        color = f"C{index}"
        ax.scatter([p.flops for p in f.points], [p.loss for p in f.points], color=color, s=16)
        own = grid if allow_exact or not f.law.exact else np.geomspace(*f.measured, 200)
        ax.plot(own, [f.loss_at(c) for c in own], color=color, lw=1.6,
                label=f"{f.query_type}: E + A C^-{f.law.alpha:.3f}, E = {f.law.e:.3f}"
                      + (" (exactly determined)" if f.law.exact else ""))
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (the model's count x tokens)")
    ax.set_ylabel("validation loss at the run's end")
    ax.set_title("Loss against compute, per query type")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return png(fig)


def main(argv: list[str]) -> int:
    """fit_scaling.py: read the runs, fit, write scaling.md (and scaling.png with matplotlib), print the report."""
    from torchnlq.cli import ArgumentParser
    from torchnlq.experiments.compare import check_out_folder, expand_paths
    from torchnlq.files import OwnedFolder

    p = ArgumentParser(prog="fit_scaling.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="finished run folders, or a scaling suite's dump folder")
    p.add_argument("--at-flops", type=float, default=None,
                   help="also predict each query type's loss at this training compute (FLOPs)")
    p.add_argument("--out", default="scaling", help="folder for scaling.md and scaling.png")
    p.add_argument("--allow-different-data", action="store_true", help="fit runs with different data fingerprints")
    p.add_argument("--allow-exact-fits", action="store_true",
                   help="also print the predicted loss and the crossings of a query type whose fit is exactly "
                        "determined (3 runs for 3 parameters: no run is left over to test the law)")
    args = p.parse_args(argv)
    if args.at_flops is not None and not (math.isfinite(args.at_flops) and args.at_flops > 0):
        raise UserError(f"--at-flops must be a positive number of FLOPs, got {args.at_flops}")
    check_out_folder(args.out, expand_paths(list(args.runs)))
    fits = fit_all(run_points(args.runs, args.allow_different_data))
    body = report(fits, args.at_flops, args.allow_exact_fits)
    text = f"# Scaling: validation loss against training compute\n\n{body}\n"
    image = plot(fits, args.at_flops, args.allow_exact_fits)
    files = {"scaling.md": text.encode()} | ({"scaling.png": image} if image else {})
    folder = OwnedFolder(Path(args.out))
    folder.check(list(files))
    written = [folder.write(name, data) for name, data in files.items()]
    print(text)
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


def cli() -> int:
    """Entry point of scripts/fit_scaling.py: user errors are one line with exit code 2."""
    from torchnlq.cli import run_cli

    return run_cli(main)
