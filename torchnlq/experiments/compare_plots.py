"""The comparison's two figures, after the paper's: loss curves (Figure 1) and relative improvement (Figure 2).

Needs matplotlib (``pip install -e '.[plots]'``); without it :func:`plot_comparison`
writes nothing and returns a note saying so, and the tables still come out.
A group of seeds is drawn as the mean over its runs (with a ±1 std band on the
validation curve), at the steps all of its runs logged.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchnlq.experiments.compare import Group

NO_MATPLOTLIB = "No plots: matplotlib is not installed (pip install -e '.[plots]' adds it)."


def mean_curve(curves: list[dict[int, float]]) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std) over the steps every curve has; std is 0 for a single curve."""
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    means = [statistics.fmean(c[s] for c in curves) for s in steps]
    stds = [statistics.stdev([c[s] for c in curves]) if len(curves) > 1 else 0.0 for s in steps]
    return steps, means, stds


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the logged training loss is one noisy batch per point)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def relative_improvement(base: dict[int, float], other: dict[int, float]) -> tuple[list[int], list[float]]:
    """100 (L_base − L)/L_base at the steps both curves have."""
    steps = sorted(set(base) & set(other))
    return steps, [100.0 * (base[s] - other[s]) / base[s] for s in steps]


def _zoom(values: list[tuple[int, float]], last_step: int) -> tuple[float, float] | None:
    """y-limits that ignore the first 10% of steps, where early losses would flatten everything else."""
    late = [v for s, v in values if s >= 0.1 * last_step] or [v for _, v in values]
    if not late:
        return None
    lo, hi = min(late), max(late)
    pad = 0.05 * (hi - lo) or 0.01 * max(abs(hi), 1e-3)
    return lo - pad, hi + pad


def plot_comparison(groups: list[Group], base: Group, out: Path) -> tuple[list[Path], str]:
    """Write loss_curves.png and relative_improvement.png into ``out``; returns (paths, note)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return [], NO_MATPLOTLIB

    colors = plt.get_cmap("tab10").colors
    val_curves = {g.name: mean_curve([r.val for r in g.runs]) for g in groups}
    last_step = max(s[-1] for s, _, _ in val_curves.values() if s)

    fig, ax = plt.subplots(figsize=(8, 5))
    points: list[tuple[int, float]] = []
    for i, g in enumerate(groups):
        color = colors[i % len(colors)]
        steps, mean, std = val_curves[g.name]
        label = f"{g.name} (n={len(g.runs)})" if len(g.runs) > 1 else g.name
        ax.plot(steps, mean, color=color, lw=1.6, label=label)
        if len(g.runs) > 1:
            ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=color, alpha=0.15, lw=0)
        tsteps, tmean, _ = mean_curve([r.train for r in g.runs if r.train])
        if tsteps:
            ax.plot(tsteps, smooth(tmean, max(1, len(tmean) // 40)), color=color, lw=1.0, ls="--", alpha=0.7)
        points += list(zip(steps, mean))
    if (limits := _zoom(points, last_step)) is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Validation (solid, ±1 std over seeds) and training (dashed, smoothed) loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    curves_png = out / "loss_curves.png"
    fig.savefig(curves_png, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    base_steps, base_mean, _ = val_curves[base.name]
    base_curve = dict(zip(base_steps, base_mean))
    points = []
    for i, g in enumerate(groups):
        if g is base:
            continue
        steps, mean, _ = val_curves[g.name]
        rs, rel = relative_improvement(base_curve, dict(zip(steps, mean)))
        ax.plot(rs, rel, color=colors[i % len(colors)], lw=1.6, marker=".", ms=3, label=g.name)
        points += list(zip(rs, rel))
    ax.axhline(0.0, color="black", lw=0.8)
    if (limits := _zoom(points + [(last_step, 0.0)], last_step)) is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel("step")
    ax.set_ylabel("relative improvement over baseline (%)")
    ax.set_title(f"(L_base − L)/L_base of the validation loss; baseline {base.name}")
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=8)
    fig.tight_layout()
    rel_png = out / "relative_improvement.png"
    fig.savefig(rel_png, dpi=100)
    plt.close(fig)
    return [curves_png, rel_png], ""
