"""The comparison's figures, after the paper's: loss curves (Figure 1), relative improvement (Figure 2).

Needs matplotlib (``pip install -e '.[plots]'``). A seed group is drawn as the mean of its runs (with a
±1 std band from two seeds on).
"""

from __future__ import annotations

import io
import itertools
import math
import re
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torchnlq.experiments.compare import Group, RunData

NO_MATPLOTLIB = "No plots: matplotlib is not installed (pip install -e '.[plots]' adds it)."
X_AXES = ("steps", "tokens")
X_LABELS = {"steps": "optimizer step", "tokens": "training tokens"}
# The cross-entropy the trainer logs is in nats per token; a byte tokenizer's token is one byte.
UNITS = {"byte": "nats per byte"}
DEFAULT_UNIT = "nats per token"
# The training loss is averaged over at least 2 logged points either side (a window of ~1/10 of a longer run).
SMOOTH_MIN_HALF_WIDTH = 2


def mean_curve(curves: list[dict[float, float]]) -> tuple[list[float], list[float], list[float]]:
    """(x, mean, std) over the x positions every curve has; std is 0 for a single curve."""
    xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    means = [statistics.fmean(c[x] for c in curves) for x in xs]
    stds = [statistics.stdev([c[x] for c in curves]) if len(curves) > 1 else 0.0 for x in xs]
    return xs, means, stds


def smooth(values: list[float], half_width: int) -> list[float]:
    """Centred moving average over ``2 * half_width + 1`` points (the logged training loss is one noisy batch per
    point). Near the ends the window shrinks to stay centred, so a falling loss is not pulled up or down there."""
    sums = [0.0, *itertools.accumulate(values)]
    out = []
    for i in range(len(values)):
        h = min(half_width, i, len(values) - 1 - i)
        out.append((sums[i + h + 1] - sums[i - h]) / (2 * h + 1))
    return out


def relative_improvement(base: dict[float, float], other: dict[float, float]) -> tuple[list[float], list[float]]:
    """100 (L_base − L)/L_base at ``other``'s x positions inside the baseline's range (L_base interpolated)."""
    bx = sorted(base)
    xs = [x for x in sorted(other) if bx and bx[0] <= x <= bx[-1]]
    at = np.interp(xs, bx, [base[x] for x in bx]) if xs else []
    return xs, [100.0 * (float(b) - other[x]) / float(b) for x, b in zip(xs, at)]


def tokens_per_step(run: RunData) -> int:
    """Training tokens of one optimizer step of ``run`` (all ranks); a UserError when its records lack a factor."""
    from torchnlq.errors import UserError

    training = run.config.get("training", {})
    factors: dict[str, Any] = {k: training.get(k) for k in ("seq_len", "micro_batch_size", "grad_accum_steps")}
    factors["world_size"] = run.info.get("world_size")
    missing = [k for k, v in factors.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if missing:
        where = "run_info.json" if missing == ["world_size"] else "config.toml / run_info.json"
        raise UserError(f"run '{run.name}' records no {', '.join(missing)} ({where} in {run.path}), so its steps "
                        "cannot be turned into tokens; plot against steps (--x steps)")
    return factors["seq_len"] * factors["micro_batch_size"] * factors["grad_accum_steps"] * factors["world_size"]


def _on_axis(curve: dict[int, float], scale: int) -> dict[float, float]:
    """A curve keyed by step, re-keyed by the x axis (``scale`` = 1 for steps, tokens per step for tokens)."""
    return {step * scale: v for step, v in curve.items()}


def arm_label(group: Group, is_base: bool, band: str | None) -> str:
    """A group's legend entry: its name, "baseline" unless the name says it already, what the line is and what
    its band is (``band``, drawn from two seeds on)."""
    notes = [] if not is_base or "baseline" in re.findall(r"[a-z]+", group.name.lower()) else ["baseline"]
    n = len(group.runs)
    notes.append("1 seed" if n == 1 else f"mean of {n} seeds" + (f", {band}" if band else ""))
    return f"{group.name} ({', '.join(notes)})"


def _zoom(values: list[tuple[float, float]], last_x: float) -> tuple[float, float]:
    """y-limits that ignore the first 10% of the x axis, where early losses would flatten everything else
    (-1..1 without values: runs that never overlap have no relative improvement to draw)."""
    late = [v for s, v in values if s >= 0.1 * last_x] or [v for _, v in values] or [-1.0, 1.0]
    lo, hi = min(late), max(late)
    pad = 0.05 * (hi - lo) or 0.01 * max(abs(hi), 1e-3)
    return lo - pad, hi + pad


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only: no display needed), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def png(fig: Any) -> bytes:
    """A figure as PNG bytes (at 100 dpi), closed afterwards; laid out tight unless it lays itself out."""
    import matplotlib.pyplot as plt

    if fig.get_layout_engine() is None:  # the weight-dynamics figures lay themselves out (constrained)
        fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def plot_comparison(groups: list[Group], base: Group, x: str = "steps") -> tuple[dict[str, bytes], str]:
    """loss_curves.png, relative_improvement.png, the weight-dynamics plots and (with optimizer groups of their
    own) learning_rates.png as PNG bytes by name; (plots, note)."""
    if pyplot() is None:
        return {}, NO_MATPLOTLIB
    plots = {"loss_curves.png": png(draw_loss_curves(groups, base, x)),
             "relative_improvement.png": png(draw_relative_improvement(groups, base, x))}
    # The (matrix, statistic) pairs any run logged (metrics.weight_dynamics_interval).
    for matrix, stat in sorted({(m.group(2), m.group(3)) for g in groups for r in g.runs for tag in r.weights
                                if (m := _WEIGHT_TAG.match(tag))}):
        plots[f"weights_{matrix}_{stat}.png"] = png(draw_weight_dynamics(groups, matrix, stat, x))
    if any(tag.startswith("lr/") for g in groups for tag in g.runs[0].lrs):  # groups of their own (Muon, patterns)
        plots["learning_rates.png"] = png(draw_learning_rates(groups, x))
    if any(r.downstream for g in groups for r in g.runs):  # tasks scored in the loop ([downstream])
        plots["downstream.png"] = png(draw_downstream(groups, x))
    return plots, ""


def draw_downstream(groups: list[Group], x: str = "steps") -> Any:
    """Each multiple-choice task's length-normalised accuracy over training, a line per group (its seeds' mean), one
    panel per task."""
    import matplotlib.pyplot as plt

    scales = _scales(groups, x)
    tasks = list(dict.fromkeys(task for g in groups for r in g.runs for task in r.downstream))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for index, g in enumerate(groups):
            xs, mean, _ = mean_curve([_on_axis(r.downstream[task], scales[id(r)]) for r in g.runs
                                      if task in r.downstream])
            if xs:
                ax.plot(xs, mean, color=f"C{index}", lw=1.6, marker=".", label=g.name)
        _label(ax, x, ylabel="acc_norm", title=f"{task}: length-normalised accuracy")
        ax.legend(fontsize=8)
    return fig


def draw_learning_rates(groups: list[Group], x: str = "steps") -> Any:
    """Each optimizer group's learning rate over training, a line per group of each arm (its first seed: seeds
    share the schedule); runs with the paper's two groups show their one ``lr``."""
    import matplotlib.pyplot as plt

    scales = _scales(groups, x)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for index, g in enumerate(groups):
        run = g.runs[0]
        tags = sorted(t for t in run.lrs if t.startswith("lr/")) or ["lr"]
        for tag_index, tag in enumerate(tags):
            points = sorted(_on_axis(run.lrs.get(tag, {}), scales[id(run)]).items())
            label = g.name if tag == "lr" else f"{g.name}: {tag.removeprefix('lr/')}"
            ax.plot([p for p, _ in points], [v for _, v in points], color=f"C{index}", lw=1.4, label=label,
                    linestyle=("-", "--", ":", "-.")[tag_index % 4])
    _label(ax, x, ylabel="learning rate", title="Learning rate per optimizer group")
    ax.legend(fontsize=8)
    return fig


_WEIGHT_TAG = re.compile(r"^weights/layer(\d+)/(\w+)/(\w+)$")
WEIGHT_STAT_LABELS = {
    "sigma_max": "largest singular value σ₁",
    "effective_rank": "effective rank exp(H(σ/Σσ))",
    "stable_rank": "stable rank ‖W‖²_F / σ₁²",
    "drift": "drift ‖W − W₀‖_F / ‖W₀‖_F",
}


def draw_weight_dynamics(groups: list[Group], matrix: str, stat: str, x: str = "steps") -> Any:
    """One statistic of one query matrix over training: a panel per group (its first seed), a line per layer."""
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    shown = [g for g in groups
             if any(_WEIGHT_TAG.match(t) and t.endswith(f"/{matrix}/{stat}") for t in g.runs[0].weights)]
    scales = _scales(groups, x)
    fig, axes = plt.subplots(1, len(shown), figsize=(4.5 * len(shown) + 1, 4), squeeze=False, sharey=True,
                             layout="constrained")
    layers = sorted({int(m.group(1)) for g in shown for t in g.runs[0].weights
                     if (m := _WEIGHT_TAG.match(t)) and m.group(2) == matrix and m.group(3) == stat})
    norm = Normalize(vmin=min(layers), vmax=max(max(layers), min(layers) + 1))
    cmap = plt.get_cmap("viridis")
    for ax, g in zip(axes[0], shown):
        run = g.runs[0]
        for layer in layers:
            curve = run.weights.get(f"weights/layer{layer}/{matrix}/{stat}")
            if curve:
                points = sorted(_on_axis(curve, scales[id(run)]).items())
                ax.plot([p for p, _ in points], [v for _, v in points], color=cmap(norm(layer)), lw=1.2)
        seeds = f" (seed {run.seed})" if len(g.runs) > 1 else ""
        ax.set_title(f"{g.name}{seeds}", fontsize=10)
        _label(ax, x)
    axes[0][0].set_ylabel(WEIGHT_STAT_LABELS.get(stat, stat))
    fig.suptitle(f"{matrix}: {WEIGHT_STAT_LABELS.get(stat, stat)} per layer")
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes[0].tolist(), fraction=0.03)
    bar.set_label("layer")
    return fig


def _scales(groups: list[Group], x: str) -> dict[int, int]:
    """id(run) -> its factor from steps to the x axis."""
    return {id(r): (tokens_per_step(r) if x == "tokens" else 1) for g in groups for r in g.runs}


def _val_curves(groups: list[Group], scales: dict[int, int]) -> dict[str, tuple[list[float], list[float], list[float]]]:
    return {g.name: mean_curve([_on_axis(r.val, scales[id(r)]) for r in g.runs]) for g in groups}


def _label(ax: Any, x: str, **labels: str) -> None:
    """The x axis's label and ticks, ``labels`` (ylabel, title) and the grid of one panel."""
    ax.set(xlabel=X_LABELS[x], **labels)
    ax.grid(alpha=0.3)
    if x == "tokens":  # 1.2M rather than 1200000 or an offset label in the corner
        from matplotlib.ticker import EngFormatter

        ax.xaxis.set_major_formatter(EngFormatter(sep=""))


def trunks(groups: list[Group]) -> set[str]:
    """Names of the groups other runs branched from (their ``initialized_from`` is a checkpoint of its runs)."""
    sources = [Path(r.info["initialized_from"]).resolve() for g in groups for r in g.runs
               if isinstance(r.info.get("initialized_from"), str)]
    return {g.name for g in groups if any(src.is_relative_to(r.path.resolve()) for r in g.runs for src in sources)}


def draw_loss_curves(groups: list[Group], base: Group, x: str = "steps") -> Any:
    """The loss-curve figure (matplotlib Figure): validation solid, training dashed, one colour per group; a run
    others branched from (a stable phase) is the trunk, thick and grey beneath its branches."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colors = plt.get_cmap("tab10").colors
    scales = _scales(groups, x)
    val_curves = _val_curves(groups, scales)
    last_x = max((s[-1] for s, _, _ in val_curves.values() if s), default=0)

    fig, ax = plt.subplots(figsize=(8, 5))
    points: list[tuple[float, float]] = []
    any_train = False
    trunk_names = trunks(groups)
    for i, g in enumerate(groups):
        trunk = g.name in trunk_names
        color = "0.45" if trunk else colors[i % len(colors)]
        xs, mean, std = val_curves[g.name]
        label = arm_label(g, g is base, band="±1 std") + (" (trunk)" if trunk else "")
        ax.plot(xs, mean, color=color, lw=3.0 if trunk else 1.6, zorder=1 if trunk else 2, label=label)
        if len(g.runs) > 1:
            ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=color, alpha=0.15, lw=0)
        txs, tmean, _ = mean_curve([_on_axis(r.train, scales[id(r)]) for r in g.runs if r.train])
        if txs:
            any_train = True
            smoothed = smooth(tmean, max(SMOOTH_MIN_HALF_WIDTH, len(tmean) // 20))  # a window of ~1/10 of the run
            ax.plot(txs, smoothed, color=color, lw=1.0, ls="--", alpha=0.7)
            points += list(zip(txs, smoothed))  # the y range shows the training curves too, not only validation
        points += list(zip(xs, mean))
    ax.set_ylim(*_zoom(points, last_x))  # every group has a validation point (at the compared step)
    # The loss's unit from the runs' data.tokenizer: nats per token, or nats per byte for the byte tokenizer.
    tokenizers = sorted({str(r.config.get("data", {}).get("tokenizer", "")) for g in groups for r in g.runs})
    units = {UNITS.get(t, DEFAULT_UNIT) for t in tokenizers}
    if len(units) > 1:
        units = {", ".join(f"{UNITS.get(t, DEFAULT_UNIT)} for {t or 'unnamed'}" for t in tokenizers)}
    _label(ax, x, ylabel=f"loss ({units.pop()})",
           title="Validation and training loss" if any_train else "Validation loss")
    # Colours name the groups; these entries say what the two line styles are.
    handles, labels = ax.get_legend_handles_labels()
    styles = [(Line2D([], [], color="black", lw=1.6), "solid: validation loss")]
    if any_train:
        styles.append((Line2D([], [], color="black", lw=1.0, ls="--"),
                       "dashed: training loss (centred mean over ~1/10 of the run)"))
    ax.legend(handles + [h for h, _ in styles], labels + [t for _, t in styles], fontsize=8)
    return fig


def draw_relative_improvement(groups: list[Group], base: Group, x: str = "steps") -> Any:
    """The relative-improvement figure (matplotlib Figure): 100 (L_base − L)/L_base of each group's mean, with a
    ±1 standard-error band where both sides have two seeds or more, and a visible note for arms that have none."""
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10").colors
    val_curves = _val_curves(groups, _scales(groups, x))
    last_x = max((s[-1] for s, _, _ in val_curves.values() if s), default=0)
    base_xs, base_mean, base_std = val_curves[base.name]
    base_curve = dict(zip(base_xs, base_mean))

    fig, ax = plt.subplots(figsize=(8, 4))
    points: list[tuple[float, float]] = []
    unestimated = []
    for i, g in enumerate(groups):
        if g is base:
            continue
        xs, mean, std = val_curves[g.name]
        rx, rel = relative_improvement(base_curve, dict(zip(xs, mean)))
        color = colors[i % len(colors)]
        with_error = len(g.runs) > 1 and len(base.runs) > 1
        label = arm_label(g, False, band="±1 s.e." if with_error else None)
        ax.plot(rx, rel, color=color, lw=1.6, marker=".", ms=3, label=label)
        points += list(zip(rx, rel))
        if not with_error:
            unestimated.append(g.name)
            continue
        # The standard error of the difference of the two means, as in the table (comparison.md).
        spread = dict(zip(xs, std))
        base_at = zip(np.interp(rx, base_xs, base_std), np.interp(rx, base_xs, base_mean))
        se = [100 * math.sqrt(spread[p] ** 2 / len(g.runs) + b_std ** 2 / len(base.runs)) / b_mean
              for p, (b_std, b_mean) in zip(rx, base_at)]
        low, high = [r - e for r, e in zip(rel, se)], [r + e for r, e in zip(rel, se)]
        ax.fill_between(rx, low, high, color=color, alpha=0.15, lw=0)
        points += list(zip(rx, low)) + list(zip(rx, high))
    ax.axhline(0.0, color="black", lw=0.8)
    if unestimated:  # a one-seed difference of a percent or two may be seed noise: say so on the figure
        who = f"baseline {base.name}" if len(base.runs) == 1 else ", ".join(unestimated)
        ax.text(0.01, 0.02, f"one seed: no error estimate ({who}); a difference this size may be seed noise",
                transform=ax.transAxes, fontsize=8, color="dimgray", bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})
    ax.set_ylim(*_zoom(points + [(last_x, 0.0)], last_x))
    _label(ax, x, ylabel=f"improvement over {base.name} (% of its loss)",
           title="Relative improvement of the validation loss, (L_base − L)/L_base")
    if points:
        ax.legend(fontsize=8)
    return fig
