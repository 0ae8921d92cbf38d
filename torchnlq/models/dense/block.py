"""The dense family's block: pre-norm, ``x + attn(norm(x))`` then ``x + mlp(norm(x))``.

GPT-2's block by default (LayerNorms, a GELU MLP, no biases unless ``model.bias``); Llama's with RMSNorm and
SwiGLU; Qwen3's with QK-norm as well (the flavors set these: models/dense/flavors.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..args import ModelArgs
from ..layers import MLP, Attention, Cache, RopeTables, build_norm


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, args: ModelArgs, layer: int = 0) -> None:
        super().__init__()
        self.ln_1 = build_norm(args, args.dim)
        self.attn = Attention(args, layer)
        self.ln_2 = build_norm(args, args.dim)
        self.mlp = self.build_mlp(args, layer)

    def build_mlp(self, args: ModelArgs, layer: int) -> nn.Module:
        """The block's feed-forward part (a family whose blocks differ only there overrides this)."""
        return MLP(args)

    def init_weights(self, init_std: float, residual_std: float) -> None:
        """Re-initialise this block in a fixed order: ln_1, attn, ln_2, mlp."""
        self.ln_1.reset_parameters()
        self.attn.init_weights(init_std, residual_std)
        self.ln_2.reset_parameters()
        self.mlp.init_weights(init_std, residual_std)

    def forward(self, x: torch.Tensor, rope: RopeTables | None = None, cache: Cache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope, cache, mask)
        return x + self.mlp(self.ln_2(x))
