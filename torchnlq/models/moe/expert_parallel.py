"""Expert parallelism: an MoE's experts split over the data-parallel processes, each token sent to its experts'
process and back by all-to-all (``parallelism.expert_parallel``): the moe family's parallelize hook
(models/moe/runtime.py), applied to the model on the meta device before FSDP.

Each process holds ``n_experts / world`` consecutive experts of every MoE layer: their weights become DTensors
sharded on the expert dimension (a checkpoint holds every expert once and loads on any number of processes; FSDP
leaves them alone). A layer's forward then (1) sorts its tokens' assignments by expert, (2) tells every process
how many rows it will get for each of its experts (an all-to-all of the counts), (3) sends the rows (an
autograd-aware all-to-all), (4) computes its own experts on what it got, and (5) sends the results back, where
each token's top_k outputs are combined as without parallelism. Every process's loss is the mean over its own
tokens and FSDP averages the other gradients over the processes, so an expert's gradient, the sum of every
process's share, is divided by the process count too: the run's numbers are one process's (to rounding).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from ..errors import ConfigError
from .experts import GroupedExperts

WEIGHTS = ("gate_proj", "up_proj", "down_proj")


class ScaleGradient(torch.autograd.Function):
    """``x`` unchanged; its gradient times ``factor`` (on the path, not a hook on the parameter: materialising a
    meta model replaces its parameters, and their hooks with them)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad * ctx.factor, None


def grouped_experts(model: nn.Module) -> Iterator[GroupedExperts]:
    """Every MoE layer's experts."""
    return (module for module in model.modules() if isinstance(module, GroupedExperts))


def check_expert_split(n_experts: int, world: int) -> None:
    """ConfigError unless ``n_experts`` splits evenly over ``world`` processes (each holds n_experts / world)."""
    if n_experts % world:
        raise ConfigError(f"parallelism.expert_parallel splits each layer's {n_experts} experts over {world} "
                          "processes: model.moe.n_experts must be a multiple of the process count; change it or "
                          "the number of processes")


def apply_expert_parallel(model: nn.Module, mesh: DeviceMesh) -> set[nn.Parameter]:
    """Split every MoE layer's experts over the processes of the 1-D ``mesh`` and route their forward through the
    all-to-all dispatch, in place (before FSDP, on the meta model); the expert parameters, for FSDP to ignore."""
    world = mesh.size()
    params: set[nn.Parameter] = set()
    for experts in grouped_experts(model):
        check_expert_split(experts.n_experts, world)
        for name in WEIGHTS:
            full = getattr(experts, name)
            local = torch.empty((full.shape[0] // world, *full.shape[1:]), dtype=full.dtype, device=full.device)
            sharded = nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=full.shape,
                                                      stride=full.stride()), requires_grad=full.requires_grad)
            setattr(experts, name, sharded)
            params.add(sharded)
        experts.forward = types.MethodType(_dispatching_forward(mesh.get_group(), world), experts)
    return params


def _dispatching_forward(group: dist.ProcessGroup, world: int):  # noqa: ANN202 - a bound forward
    """GroupedExperts.forward over the experts of every process (the module doc's five steps)."""

    def forward(self: GroupedExperts, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        order, rows, counts = self.dispatch(x, experts)
        local = self.n_experts // world
        send = counts.view(world, local)  # rows for each process's experts
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)  # recv[r, j]: rows process r sends to my expert j
        send_sizes, recv_sizes, blocks = send.sum(1).tolist(), recv.sum(1).tolist(), recv.flatten().tolist()
        got = dist_fn.all_to_all_single(rows.new_empty(sum(recv_sizes), rows.shape[1]), rows, recv_sizes,
                                        send_sizes, group=group)
        # From (source process, expert) order to (expert, source process): each expert's rows together.
        by_source = got.split(blocks)
        by_expert = torch.cat([by_source[r * local + j] for j in range(local) for r in range(world)])
        # The experts' gradients: every process's tokens' share, divided as FSDP divides the others' (module doc).
        weights_local = [ScaleGradient.apply(getattr(self, name).to_local(), 1 / world) for name in WEIGHTS]
        out = self.compute(by_expert, recv.sum(0), None, *weights_local)
        pieces = out.split([blocks[r * local + j] for j in range(local) for r in range(world)])
        back = torch.cat([pieces[j * world + r] for r in range(world) for j in range(local)])
        returned = dist_fn.all_to_all_single(rows.new_empty(rows.shape[0], back.shape[1]), back, send_sizes,
                                             recv_sizes, group=group)
        return self.combine(returned, order, weights)

    return forward
