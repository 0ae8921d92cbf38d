"""Weight dynamics of the query (the paper's future work: "weight dynamics analysis"), per layer.

For every block's query matrices (``QueryProjection.matrices()``: W_Q, W1, W2 of the built-in types): σ_max,
effective rank (Roy & Vetterli, 2007), stable rank and drift, plus their means (docs/monitoring.md). Under FSDP
every rank calls :func:`weight_stats` together.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn as nn

from torchnlq.config.every import Every
from torchnlq.models.query import QueryProjection


def whole_fp32(weight: torch.Tensor) -> torch.Tensor:
    """The whole tensor in fp32 (a DTensor shard is all-gathered: a collective on every rank)."""
    if hasattr(weight, "full_tensor"):
        weight = weight.full_tensor()
    return weight.detach().float()


def with_means(prefix: str, rows: list[tuple[int, str, float]]) -> dict[str, float]:
    """``{prefix}/layer{i}/{key}`` for each (i, key, value) row, then ``{prefix}/mean/{key}``: the mean over layers."""
    out: dict[str, float] = {}
    collected: dict[str, list[float]] = defaultdict(list)
    for index, key, value in rows:
        out[f"{prefix}/layer{index}/{key}"] = value
        collected[key].append(value)
    return out | {f"{prefix}/mean/{key}": sum(values) / len(values) for key, values in collected.items()}


def spectrum_stats(weight: torch.Tensor) -> dict[str, float]:
    """σ_max, effective rank (exp of the entropy of σ/Σσ) and stable rank of one matrix."""
    sigma = torch.linalg.svdvals(weight.double())
    total = sigma.sum().item()
    if total == 0.0:
        return {"sigma_max": 0.0, "effective_rank": 0.0, "stable_rank": 0.0}
    p = sigma / total
    p = p[p > 0]
    entropy = -(p * p.log()).sum().item()
    top = sigma[0].item()
    return {
        "sigma_max": top,
        "effective_rank": math.exp(entropy),
        "stable_rank": (sigma.square().sum() / top**2).item(),
    }


def query_matrices(model: nn.Module) -> list[tuple[int, dict[str, torch.Tensor]]]:
    """(block index, {matrix name: weight parameter}) for every block's query, in block order."""
    queries = [m for m in model.modules() if isinstance(m, QueryProjection)]
    found = []
    for index, query in enumerate(queries):
        weights = {name: linear.weight for name, linear in query.matrices().items()}
        if weights:
            found.append((index, weights))
    return found


def initial_matrices(model: nn.Module) -> dict[tuple[int, str], torch.Tensor]:
    """A CPU fp32 copy of every query matrix (the reference of ``drift``), keyed by (block, name)."""
    return {(i, name): whole_fp32(w).cpu().clone()
            for i, weights in query_matrices(model) for name, w in weights.items()}


@torch.no_grad()
def weight_stats(model: nn.Module, initial: dict[tuple[int, str], torch.Tensor] | None = None) -> dict[str, float]:
    """``{"weights/layer{i}/{w}/{stat}": value, "weights/mean/{w}/{stat}": value}`` for the query matrices."""
    rows = []
    for index, weights in query_matrices(model):
        for name, param in weights.items():
            weight = whole_fp32(param)
            stats = spectrum_stats(weight)
            reference = (initial or {}).get((index, name))
            if reference is not None:
                base = reference.norm().item()
                change = (weight.cpu() - reference).norm().item()
                stats["drift"] = change / base if base > 0 else change
            rows += [(index, f"{name}/{stat}", value) for stat, value in stats.items()]
    return with_means("weights", rows)


class WeightDynamics:
    """When to log :func:`weight_stats` (0: never), and ``initial``: the step-0 matrices ``drift`` compares with."""

    def __init__(self, interval: int, initial: dict[tuple[int, str], torch.Tensor] | None) -> None:
        self.schedule = Every(interval)
        self.initial = initial

    def run(self, model: nn.Module) -> dict[str, float]:
        """The statistics now (all ranks call this together)."""
        return weight_stats(model, self.initial)
