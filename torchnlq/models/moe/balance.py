"""What the training loop does with an MoE model's routers, asked of the model rather than of its classes.

Once per step: :func:`clear_step_statistics` before the forward passes; :func:`finish_step` after the optimizer's
update (the statistics summed over the processes by the ``reduce`` the caller gives, then DeepSeek-V3's
auxiliary-loss-free bias moved toward the mean load); :func:`step_statistics` for the logs (each layer's expert
loads, router entropy and losses). :func:`set_router_loss_scale` matches the router losses' gradient to the loss
the trainer backpropagates (divided by its accumulation steps). For a dense model all of them do nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn as nn

from .block import MoEFeedForward
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


def set_even_split(model: nn.Module, enabled: bool) -> None:
    """Route every expert its even share of the tokens (the memory estimate's fake tensors carry no routing)."""
    for module in model.modules():
        if isinstance(module, GroupedExperts):
            module.even_split = enabled


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
