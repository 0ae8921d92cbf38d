"""Per-layer statistics of residual queries Q(X) = X + f(X) (scaled), on one batch.

``f_ratio``, ``cos_q_x`` and the norm gains per layer, plus their means (docs/monitoring.md). Forward hooks
inside the real forward (run eagerly) see the weights whatever wraps the blocks (FSDP: only during the forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from torchnlq.config.every import Every
from torchnlq.models.layers import attention_modules, set_fused_projections
from torchnlq.models.query import QueryProjection, ResidualBranch, claims
from torchnlq.train.weight_dynamics import whole_fp32, with_means


def residual_queries(model: nn.Module) -> list[tuple[int, QueryProjection]]:
    """(layer index, query) for every query with a residual branch (:class:`~torchnlq.models.query.ResidualBranch`;
    not linear, identity: no f(X)), in layer order."""
    queries = [m for m in model.modules() if isinstance(m, QueryProjection)]  # one per block, in block order
    return [(index, query) for index, query in enumerate(queries) if claims(query, ResidualBranch)]


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
        stats[key] = whole_fp32(norm.weight).mean().item()  # a DTensor shard outside FSDP's unsharded window
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
    fused = [(attention, attention.fuse_projections) for attention in attention_modules(model)]
    set_fused_projections(model, False)  # the hooks must see each query's own forward run
    try:
        with _eval_mode(model), torch.compiler.set_stance("force_eager"):
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
        for attention, flag in fused:
            attention.fuse_projections = flag
    return with_means("query", [(i, stat, value) for i in sorted(per_layer) for stat, value in per_layer[i].items()])


class QueryDiagnostics:
    """When to log :func:`query_diagnostics` (0: never), and on which tokens; all ranks :meth:`run` together."""

    def __init__(self, interval: int, tokens: torch.Tensor) -> None:
        self.schedule, self.tokens = Every(interval), tokens

    def run(self, model: nn.Module, device: torch.device,
            autocast: Callable[[], contextlib.AbstractContextManager]) -> dict[str, float]:
        """The statistics of ``model`` on this object's tokens (see :func:`query_diagnostics`)."""
        with autocast():
            return query_diagnostics(model, self.tokens.to(device))
