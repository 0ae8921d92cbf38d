"""The moe family's runtime hooks (:class:`~torchnlq.models.runtime.FamilyRuntime`): what training does with
an MoE model's routers and experts, asked of the model rather than of its classes.

Once per step: :func:`clear_step_statistics` before the forward passes; :func:`finish_step` after the optimizer's
update (the statistics summed over the processes by the ``reduce`` the caller gives, then DeepSeek-V3's
auxiliary-loss-free bias moved toward the mean load); :func:`step_statistics` for the logs (each layer's expert
loads, router entropy and losses). :func:`set_router_loss_scale` matches the router losses' gradient to the loss
the trainer backpropagates (divided by its accumulation steps). Expert parallelism is the family's parallelize
hook (models/moe/expert_parallel.py). For a model without routers all of them do nothing.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..runtime import FamilyRuntime, Reduce
from .block import MoEFeedForward
from .expert_parallel import apply_expert_parallel, check_expert_split
from .experts import GroupedExperts
from .router import Router


def routers(model: nn.Module) -> Iterator[tuple[int, Router]]:
    """(block index, router) of every MoE layer, in block order."""
    for index, block in enumerate(getattr(model, "layers", [])):
        for module in block.modules():
            if isinstance(module, Router):
                yield index, module


def set_router_loss_scale(model: nn.Module, scale: float) -> None:
    """The gradient the routers' losses get (1 / the accumulation steps of the loss they ride beside)."""
    for module in model.modules():
        if isinstance(module, MoEFeedForward):
            module.router_loss_scale = scale


@torch.no_grad()
def clear_step_statistics(model: nn.Module) -> None:
    """Zero what the routers count over a step (before its first forward)."""
    for _, router in routers(model):
        router.tokens_per_expert.zero_()
        router.sums.zero_()


@torch.no_grad()
def finish_step(model: nn.Module, reduce: Callable[[torch.Tensor], None] | None = None) -> None:
    """After the update: the step's statistics summed over the processes (``reduce``, an in-place all-reduce), then
    each router's bias moved by ``bias_update_rate`` toward the mean load (sign(mean - load): DeepSeek-V3)."""
    found = [router for _, router in routers(model)]
    if not found:
        return
    if reduce is not None:  # one collective for every router of the model
        flat = torch.cat([torch.cat((r.tokens_per_expert, r.sums)) for r in found])
        reduce(flat)
        for router, part in zip(found, flat.split([r.tokens_per_expert.numel() + r.sums.numel() for r in found])):
            router.tokens_per_expert.copy_(part[: router.n_experts])
            router.sums.copy_(part[router.n_experts:])
    for router in found:
        if router.bias_update_rate:
            load = router.tokens_per_expert
            router.expert_bias.add_(router.bias_update_rate * torch.sign(load.mean() - load))


def step_statistics(model: nn.Module) -> list[tuple[int, str, float]]:
    """(block index, statistic, value) of the last step: ``load/<e>`` (expert e's share of the routed tokens),
    ``load_max``, ``load_min``, ``entropy`` (of the router's distribution, in nats, mean over tokens), and the
    router's ``aux_loss`` and ``z_loss`` (mean over its forward passes; those that are on)."""
    stats = []
    for index, router in routers(model):
        forwards, tokens, entropy, aux, z = router.sums.tolist()
        if not tokens:
            continue
        share = router.tokens_per_expert / router.tokens_per_expert.sum()
        stats += [(index, f"load/{e}", value) for e, value in enumerate(share.tolist())]
        stats += [(index, "load_max", share.max().item()), (index, "load_min", share.min().item()),
                  (index, "entropy", entropy / tokens)]
        if router.aux_loss_coef:
            stats.append((index, "aux_loss", aux / forwards))
        if router.z_loss_coef:
            stats.append((index, "z_loss", z / forwards))
    return stats


def _even_split_forward(self: GroupedExperts, x: torch.Tensor, experts: torch.Tensor,
                        weights: torch.Tensor) -> torch.Tensor:
    """GroupedExperts.forward with every expert given its even share of the rows (fake tensors carry no routing)."""
    order, rows, _ = self.dispatch(x, experts)
    sizes = [len(order) // self.n_experts + (e < len(order) % self.n_experts) for e in range(self.n_experts)]
    return self.combine(self.compute(rows, torch.tensor(sizes), sizes, self.gate_proj, self.up_proj,
                                     self.down_proj), order, weights)


class MoERuntime(FamilyRuntime):
    """The moe family's hooks: router statistics and balancing each step, router losses' scale, expert parallelism,
    and an even split of the tokens over the experts on fake tensors."""

    statistics_tag = "moe"
    parallelism_options = ("expert_parallel",)

    def set_loss_scale(self, model: nn.Module, scale: float) -> None:
        set_router_loss_scale(model, scale)

    def start_step(self, model: nn.Module) -> None:
        clear_step_statistics(model)

    def finish_step(self, model: nn.Module, reduce: Reduce) -> None:
        finish_step(model, reduce)

    def step_statistics(self, model: nn.Module) -> list[tuple[int, str, float]]:
        return step_statistics(model)

    def check_parallelism(self, args: Any, cfg: Any, world: int | None) -> None:
        p = cfg.parallelism
        if not p.expert_parallel:
            return
        if p.dp_replicate > 1 or cfg.training.compile:
            why = "HSDP (parallelism.dp_replicate > 1)" if p.dp_replicate > 1 else "training.compile"
            raise ConfigError(f"parallelism.expert_parallel splits the experts over every process of one FSDP "
                              f"group, in eager mode: not with {why}; drop one of the two")
        if world is not None:
            check_expert_split(args.moe.n_experts, world)

    def parallelize(self, model: nn.Module, mesh: Any, parallelism: Any) -> set[nn.Parameter]:
        return apply_expert_parallel(model, mesh) if parallelism.expert_parallel else set()

    @contextlib.contextmanager
    def on_fake_tensors(self, model: nn.Module) -> Iterator[None]:
        experts = [m for m in model.modules() if isinstance(m, GroupedExperts)]
        for module in experts:
            module.forward = types.MethodType(_even_split_forward, module)
        try:
            yield
        finally:
            for module in experts:
                del module.forward  # the class's own forward again
