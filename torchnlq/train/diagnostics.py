"""Per-layer statistics of residual queries Q(X) = X + f(X) (scaled), on one batch.

Per layer with a residual branch: ``f_ratio`` (mean over tokens of ‖f(x_t)‖ / ‖x_t‖), ``cos_q_x``
(mean cos(Q(x_t), x_t)) and the query's norm gains, plus their means (docs/monitoring.md).
They are computed in forward hooks inside the real forward, so they work whatever wraps the blocks
(FSDP's parameters are only whole during their block's forward); compiled code runs eagerly here.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from torchnlq.models.query import QueryProjection

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def residual_queries(model: nn.Module) -> list[tuple[int, QueryProjection]]:
    """(layer index, query) for every query with a residual branch, in layer order (index from ``layers.<i>.``)."""
    found: list[tuple[int, QueryProjection]] = []
    queries = [(n, m) for n, m in model.named_modules() if isinstance(m, QueryProjection)]
    for position, (name, module) in enumerate(queries):
        if not module.has_residual_branch:
            continue  # no f(X): linear, identity
        match = _LAYER_INDEX.search(name)
        found.append((int(match.group(1)) if match else position, module))
    return sorted(found, key=lambda item: item[0])


def _gain(norm: nn.Module) -> float:
    """Mean of a norm's gain vector."""
    weight = norm.weight
    if hasattr(weight, "full_tensor"):  # a DTensor shard outside FSDP's unsharded window
        weight = weight.full_tensor()
    return weight.detach().float().mean().item()


def layer_stats(query: QueryProjection, x: torch.Tensor, q: torch.Tensor) -> dict[str, float]:
    """The statistics of one query, given its input ``x`` and output ``q`` ([..., dim])."""
    f = query.residual_branch(x).float()
    x, q = x.float(), q.float()
    x_norm = x.norm(dim=-1)
    ratio = f.norm(dim=-1) / x_norm.clamp_min(torch.finfo(torch.float32).tiny)
    stats = {
        "f_ratio": ratio.mean().item(),
        "cos_q_x": F.cosine_similarity(q, x, dim=-1).mean().item(),
    }
    for key, norm in query.norm_gains().items():
        stats[key] = _gain(norm)
    return stats


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode for the duration, then every module's own flag back (not just the root's)."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


def _eager() -> contextlib.AbstractContextManager:
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


@torch.no_grad()
def query_diagnostics(model: nn.Module, tokens: torch.Tensor) -> dict[str, float]:
    """``{"query/layer{i}/<stat>": value, "query/mean/<stat>": value}`` from one forward of ``tokens`` [B, T]."""
    queries = residual_queries(model)
    if not queries:
        return {}
    per_layer: dict[int, dict[str, float]] = {}

    def hook_for(index: int):
        def hook(module: QueryProjection, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            per_layer[index] = layer_stats(module, args[0], output)
        return hook

    handles = [query.register_forward_hook(hook_for(index)) for index, query in queries]
    try:
        with _eval_mode(model), _eager():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()

    out: dict[str, float] = {}
    collected: dict[str, list[float]] = defaultdict(list)
    for index in sorted(per_layer):
        for stat, value in per_layer[index].items():
            out[f"query/layer{index}/{stat}"] = value
            collected[stat].append(value)
    for stat, values in collected.items():
        out[f"query/mean/{stat}"] = sum(values) / len(values)
    return out


class QueryDiagnostics:
    """When to log :func:`query_diagnostics` (0: never), and on which tokens; all ranks :meth:`run` together."""

    def __init__(self, interval: int, tokens: torch.Tensor) -> None:
        self.interval, self.tokens = interval, tokens

    def due(self, step: int, last: bool) -> bool:
        """Whether to log the statistics after ``step``."""
        return self.interval > 0 and (last or step % self.interval == 0)

    def run(self, model: nn.Module, device: torch.device, autocast: Callable[[], contextlib.AbstractContextManager]) -> dict[str, float]:
        """The statistics of ``model`` on this object's tokens (see :func:`query_diagnostics`)."""
        with autocast():
            return query_diagnostics(model, self.tokens.to(device))
