"""Does the best learning rate move with the width? The table and plot of a finished LR-by-width suite.

Reads every run folder of a suite whose runs differ in ``model.parametrization``, ``model.dim`` and
``optimizer.lr`` (suites/mup_lr_transfer_tiny.toml): each run's last validation loss (run_info.json) and its
settings (config.toml). For each parametrization it prints the loss at each width and learning rate, the best
learning rate per width, and its drift across the widths in steps of the grid (Tensor Programs V's figure 1 in
numbers); ``--plot`` draws loss against log2(lr), a line per width, a panel per parametrization.

    python -m benchmarks.lr_transfer outputs/suites/mup_lr_transfer_tiny [--plot docs/img/mup_lr_transfer_tiny.png]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: (parametrization, width, lr) -> the last validation loss.
Losses = dict[tuple[str, int, float], float]


def read_suite(folder: Path) -> Losses:
    """The finished runs of ``folder``, by their settings (unfinished and unreadable runs are left out)."""
    losses: Losses = {}
    for run in sorted(p for p in folder.iterdir() if (p / "run_info.json").is_file()):
        info = json.loads((run / "run_info.json").read_text(encoding="utf-8"))
        if not info.get("finished") or info.get("last_val_loss") is None:
            continue
        config = tomllib.loads((run / "config.toml").read_text(encoding="utf-8"))
        key = (config["model"].get("parametrization", "sp"), config["model"]["dim"], config["optimizer"]["lr"])
        losses[key] = info["last_val_loss"]
    if not losses:
        raise UserError(f"{folder} holds no finished run with a validation loss; run the suite first "
                        "(python scripts/run_suite.py suites/mup_lr_transfer_tiny.toml)")
    return losses


def best_lrs(losses: Losses, parametrization: str) -> dict[int, float]:
    """width -> the learning rate of its lowest loss."""
    widths = sorted({w for p, w, _ in losses if p == parametrization})
    return {w: min((lr for p, ww, lr in losses if p == parametrization and ww == w),
                   key=lambda lr: losses[parametrization, w, lr]) for w in widths}


def drift(losses: Losses, parametrization: str) -> tuple[float, float]:
    """(the best LR's shift from the narrowest to the widest width, the largest shift between neighbouring
    widths), in steps of the grid (log2 units divided by the grid's log2 spacing)."""
    lrs = sorted({lr for _, _, lr in losses})
    spacing = min(math.log2(b / a) for a, b in zip(lrs, lrs[1:])) if len(lrs) > 1 else 1.0
    best = list(best_lrs(losses, parametrization).values())
    steps = [math.log2(b / a) / spacing for a, b in zip(best, best[1:])]
    return sum(steps), max((abs(s) for s in steps), default=0.0)


def table(losses: Losses) -> Iterator[str]:
    """Per parametrization: the losses (the best of each width in bold), the best LR and the drift."""
    lrs = sorted({lr for _, _, lr in losses})
    for p in sorted({p for p, _, _ in losses}, key=lambda p: p != "sp"):
        best = best_lrs(losses, p)
        yield f"**{p}**: best lr per width {', '.join(f'{w}: {lr:g}' for w, lr in best.items())}; drift " \
              f"{drift(losses, p)[0]:+g} grid steps narrowest to widest (largest between neighbours " \
              f"{drift(losses, p)[1]:g})"
        yield ""
        yield "| width | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |"
        yield "| --- | " + " | ".join("---" for _ in lrs) + " |"
        for w in best:
            cells = [f"**{losses[p, w, lr]:.4f}**" if lr == best[w] else
                     (f"{losses[p, w, lr]:.4f}" if (p, w, lr) in losses else "") for lr in lrs]
            yield f"| {w} | " + " | ".join(cells) + " |"
        yield ""


def plot(losses: Losses, path: str) -> None:
    """Loss against log2(lr), a line per width, a panel per parametrization."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install 'torchnlq[plots]'") from None
    params = sorted({p for p, _, _ in losses}, key=lambda p: p != "sp")
    fig, axes = plt.subplots(1, len(params), figsize=(5 * len(params), 3.8), sharey=True, squeeze=False)
    for ax, p in zip(axes[0], params):
        for w in sorted({w for pp, w, _ in losses if pp == p}):
            points = sorted((lr, loss) for (pp, ww, lr), loss in losses.items() if pp == p and ww == w)
            ax.plot([math.log2(lr) for lr, _ in points], [loss for _, loss in points], marker="o", label=f"d={w}")
        ax.set_title(p)
        ax.set_xlabel("log2(learning rate)")
    axes[0][0].set_ylabel("validation loss")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.lr_transfer``."""
    parser = ArgumentParser(prog="python -m benchmarks.lr_transfer", description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", help="the suite's dump folder")
    parser.add_argument("--plot", default=None, help="write the figure (PNG) here")
    opts: argparse.Namespace = parser.parse_args(argv)
    folder = Path(opts.suite)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; give a suite's dump folder, e.g. "
                        "outputs/suites/mup_lr_transfer_tiny")
    losses = read_suite(folder)
    print("\n".join(table(losses)))
    if opts.plot:
        plot(losses, opts.plot)
        print(f"plot: {opts.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
