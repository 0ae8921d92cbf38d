"""The µP coordinate check: how each layer kind's output scale moves with the width, under sp and mup.

For each width, the config's model (``model.dim`` set to the width, ``model.mup_base_width`` to the first width)
takes a few optimizer steps at a constant learning rate on a fixed random batch; before each step a forward
without gradients records the mean absolute value of each kind of layer's output, averaged over the blocks:

- ``embedding``: the blocks' input (token and position embeddings, times µP's input multiplier);
- ``query``: the query branch f(X) of a query with one (the paper's), else the query Q(X);
- ``attention``: the attention's output; ``mlp``: the MLP's (or the experts'); ``logits``.

Under µP these stop moving with the width once the updates dominate the init (flat lines); under the standard
parametrization the logits and attention grow with it. The slope of log2(mean |x|) against log2(width) at the last
step says it in one number per kind (docs/mup.md shows the table and plot; tests/test_mup_coord_check.py asserts
it at small widths).

    python -m benchmarks.coord_check [CONFIG] [--widths 64,128,256,512,1024] [--steps 4] [--lr 0.01]
                                     [--batch 8] [--seq 64] [--plot coord_check.png] [--section.key=value ...]
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections import defaultdict
from collections.abc import Iterator

import torch
import torch.nn as nn

from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.config.job_config import JobConfig
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.models.family import build_model
from torchnlq.models.layers import Attention
from torchnlq.models.query import ResidualBranch, claims
from torchnlq.train.optim import build_optimizer, set_lr
from torchnlq.train.preflight import check_job_config

KINDS = ("embedding", "query", "attention", "mlp", "logits")
PARAMETRIZATIONS = ("sp", "mup")
#: (parametrization, width) -> kind -> the mean |x| before each step.
Coordinates = dict[tuple[str, int], dict[str, list[float]]]


def _recorder(model: nn.Module, into: dict[str, list[float]]) -> list[torch.utils.hooks.RemovableHandle]:
    """Forward hooks that append each kind's mean |output| (per module; averaged by the caller) into ``into``."""

    def keep(kind: str, value: torch.Tensor) -> None:
        into[kind].append(value.detach().abs().mean().item())

    def on_attention(module: Attention, inputs: tuple, output: torch.Tensor) -> None:
        # The query from the attention's input: a fused query never calls its own forward.
        query = module.query
        keep("query", query.residual_branch(inputs[0]) if claims(query, ResidualBranch) else query(inputs[0]))
        keep("attention", output)

    handles = [model.layers[0].register_forward_pre_hook(lambda module, inputs: keep("embedding", inputs[0]))]
    for module in model.modules():
        if isinstance(module, Attention):
            handles.append(module.register_forward_hook(on_attention))
    for block in model.layers:
        handles.append(block.mlp.register_forward_hook(lambda m, i, out: keep("mlp", out)))
    return handles


def widths_config(cfg: JobConfig, parametrization: str, width: int, base: int) -> JobConfig:
    """``cfg`` at ``width`` under ``parametrization`` (µP's base width ``base``), checked as a run would be."""
    cfg = copy.deepcopy(cfg)
    cfg.model.dim, cfg.model.parametrization = width, parametrization
    cfg.model.mup_base_width = base if parametrization == "mup" else None
    cfg.model.mlp_hidden = None  # the MLP follows the width (its ratio)
    return cfg


def measure(cfg: JobConfig, steps: int, lr: float, tokens: torch.Tensor) -> dict[str, list[float]]:
    """Each kind's mean |output| before each of ``steps`` AdamW/Muon steps of ``cfg``'s model at ``lr``."""
    args = check_job_config(cfg)
    torch.manual_seed(cfg.training.seed)
    with torch.device("cpu"):
        model = build_model(args).train()
    optimizer = build_optimizer(cfg.optimizer, model, "cpu")
    set_lr(optimizer, lr)
    series: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(steps):
        seen: dict[str, list[float]] = defaultdict(list)
        handles = _recorder(model, seen)
        with torch.no_grad():
            seen["logits"].append(model(tokens).abs().mean().item())
        for handle in handles:
            handle.remove()
        for kind in KINDS:
            series[kind].append(sum(seen[kind]) / len(seen[kind]))
        model(tokens[:, :-1], targets=tokens[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return series


def coord_check(cfg: JobConfig, widths: list[int], steps: int, lr: float, batch: int, seq: int) -> Coordinates:
    """The coordinates of ``cfg`` at every width under both parametrizations (µP's base: the first width)."""
    args = check_job_config(widths_config(cfg, "sp", widths[0], widths[0]))
    tokens = torch.randint(0, args.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    return {(p, w): measure(widths_config(cfg, p, w, widths[0]), steps, lr, tokens)
            for p in PARAMETRIZATIONS for w in widths}


def slope(widths: list[int], values: list[float]) -> float:
    """The least-squares slope of log2(value) against log2(width)."""
    xs, ys = [math.log2(w) for w in widths], [math.log2(max(v, 1e-30)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def slopes(coords: Coordinates, widths: list[int], step: int = -1) -> dict[str, dict[str, float]]:
    """parametrization -> kind -> the slope at ``step`` (the last by default)."""
    return {p: {kind: slope(widths, [coords[p, w][kind][step] for w in widths]) for kind in KINDS}
            for p in PARAMETRIZATIONS}


def table(coords: Coordinates, widths: list[int]) -> Iterator[str]:
    """The Markdown tables: mean |x| per width at the last step, and the slopes."""
    yield "| parametrization | kind | " + " | ".join(f"d={w}" for w in widths) + " | slope |"
    yield "| --- | --- | " + " | ".join("---" for _ in widths) + " | --- |"
    fitted = slopes(coords, widths)
    for p in PARAMETRIZATIONS:
        for kind in KINDS:
            cells = " | ".join(f"{coords[p, w][kind][-1]:.3g}" for w in widths)
            yield f"| {p} | {kind} | {cells} | {fitted[p][kind]:+.2f} |"


def plot(coords: Coordinates, widths: list[int], steps: int, path: str) -> None:
    """The mup package's figure: a panel per kind and parametrization, x = width, a line per step."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install 'torchnlq[plots]'") from None
    fig, axes = plt.subplots(2, len(KINDS), figsize=(3.2 * len(KINDS), 6), sharex=True)
    for row, p in enumerate(PARAMETRIZATIONS):
        for col, kind in enumerate(KINDS):
            ax = axes[row][col]
            for step in range(steps):
                ax.plot(widths, [coords[p, w][kind][step] for w in widths], marker="o", label=f"step {step}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{p}: {kind}", fontsize=9)
            if row == 1:
                ax.set_xlabel("width")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m benchmarks.coord_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="64,128,256,512,1024", help="comma-separated widths; the first is "
                        "µP's base width")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps recorded")
    parser.add_argument("--lr", type=float, default=1e-2, help="the constant learning rate of every width")
    parser.add_argument("--batch", type=int, default=8, help="sequences in the fixed batch")
    parser.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--plot", default=None, help="write the figure (PNG) here")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.coord_check``: the tables, and the plot with --plot."""
    opts, config_args = build_parser().parse_known_args(argv)
    try:
        widths = sorted({int(w) for w in opts.widths.split(",") if w.strip()})
    except ValueError:
        raise UserError(f"--widths {opts.widths!r}: give whole numbers, e.g. --widths 64,128,256") from None
    if len(widths) < 2 or min(widths) < 8 or opts.steps < 1 or opts.lr <= 0 or min(opts.batch, opts.seq) < 1:
        raise UserError("--widths needs two or more widths of at least 8, --steps, --batch and --seq at least 1, "
                        "--lr above 0")
    cfg = load_job_config(config_args)
    coords = coord_check(cfg, widths, opts.steps, opts.lr, opts.batch, min(opts.seq, cfg.training.seq_len))
    print("\n".join(table(coords, widths)))
    if opts.plot:
        plot(coords, widths, opts.steps, opts.plot)
        print(f"plot: {opts.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
