"""The moe family's block: the dense pre-norm block whose MLP, in the MoE layers, is routed experts.

``x + attn(ln_1(x))``, then ``x + ffn(ln_2(x))`` with ffn a :class:`MoEFeedForward` in the layers
:func:`is_moe_layer` names (Qwen3-MoE's rule: index + 1 a multiple of ``moe.every``, from ``moe.first_dense``)
and the dense MLP in the others. Every query type works in it: the attention is the dense family's.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn as nn

from ..args import ModelArgs
from ..dense.block import Block
from ..layers import MLP
from .experts import GroupedExperts
from .router import AddToGradient, Router


def is_moe_layer(args: ModelArgs, layer: int) -> bool:
    """Whether block ``layer`` routes its tokens to experts."""
    return layer >= args.moe.first_dense and (layer + 1) % args.moe.every == 0


def expert_hidden(args: ModelArgs) -> int:
    """Each expert's hidden size: ``moe.expert_hidden``, else the model's MLP width."""
    return args.moe.expert_hidden if args.moe.expert_hidden is not None else args.mlp_hidden


class MoEFeedForward(nn.Module):
    """The router, the routed experts and the optional shared experts (one SwiGLU MLP every token passes)."""

    component: ClassVar[str] = "mlp"  # parameter roles (models/roles.py): the shared experts; routed ones apart

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        cfg, hidden = args.moe, expert_hidden(args)
        self.router = Router(args.dim, cfg, 1.0 / args.width_multiplier)
        self.experts = GroupedExperts(args.dim, hidden, cfg.n_experts, cfg.top_k)
        self.shared = MLP(args, hidden=cfg.n_shared_experts * hidden) if cfg.n_shared_experts else None
        #: What the router's training losses are scaled by in backward (the trainer sets 1 / accumulation steps,
        #: as it divides the language-model loss: models/moe/balance.py, set_router_loss_scale).
        self.router_loss_scale = 1.0

    def init_weights(self, init_std: float, residual_std: float) -> None:
        """Router, experts, shared experts, in that order."""
        self.router.init_weights(init_std)
        self.experts.init_weights(init_std, residual_std)
        if self.shared is not None:
            self.shared.init_weights(init_std, residual_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        experts, weights, router_loss = self.router(tokens)
        out = self.experts(tokens, experts, weights).view_as(x)
        if self.shared is not None:
            out = out + self.shared(x)
        if router_loss is not None:
            out = AddToGradient.apply(out, router_loss, self.router_loss_scale)
        return out


class MoEBlock(Block):
    """Pre-norm block whose MLP is an :class:`MoEFeedForward` in the MoE layers."""

    def build_mlp(self, args: ModelArgs, layer: int) -> nn.Module:
        return MoEFeedForward(args) if is_moe_layer(args, layer) else MLP(args)
