"""The layers every family's blocks share: norms, the KV cache, causal attention with a registry query, the MLP.

Attention takes the query from the query registry (models/query.py); keys and values stay one linear
projection (the paper). The cache protocol is transformers' own (``get_seq_length()``, ``update(k, v,
layer_idx)``), so that :class:`KVCache` (sampling) and a transformers ``Cache`` (the Hugging Face wrapper)
both drive the same forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from .args import ModelArgs
from .mup import attention_scale
from .query import FusableQuery, QueryProjection, build_query, claims
from .rope import adjacent_order, apply_rotary, apply_rotary_adjacent

RopeTables = tuple[torch.Tensor, torch.Tensor]


def build_norm(args: ModelArgs, width: int) -> nn.Module:
    """The block's norm over ``width`` channels: LayerNorm (bias only under model.bias) or RMSNorm."""
    if args.norm == "rms":
        return nn.RMSNorm(width, eps=args.norm_eps)
    return nn.LayerNorm(width, eps=args.norm_eps, bias=args.bias)


class Cache(Protocol):
    """What attention asks of a KV cache: transformers' ``Cache`` interface, which :class:`KVCache` implements."""

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions written so far (in layer ``layer_idx``)."""

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values ``[B, H_kv, T, hd]`` of layer ``layer_idx``; return all so far."""


class KVCache:
    """Keys and values of every layer for incremental decoding (inference only), in buffers of ``max_len``.

    Buffers ``[batch, n_kv_heads, max_len, head_dim]`` are allocated on a layer's first write, in the keys'
    device and dtype (so bf16 autocast gets a bf16 cache).
    """

    def __init__(self, n_layers: int, max_len: int) -> None:
        self.max_len = max_len
        self.lengths = [0] * n_layers
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    @classmethod
    def for_model(cls, model: nn.Module) -> KVCache:
        """An empty cache sized to the model's context (max_seq_len)."""
        return cls(model.args.n_layers, model.args.max_seq_len)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions written in layer ``layer_idx``."""
        return self.lengths[layer_idx]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key``, ``value`` ([B, H_kv, T, hd]) after the layer's positions; return its keys/values so far."""
        start, end = self.lengths[layer_idx], self.lengths[layer_idx] + key.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; cannot write positions {start}..{end - 1}")
        shape = (key.shape[0], key.shape[1], self.max_len, key.shape[3])
        buf = self.keys[layer_idx]
        if buf is None or buf.shape != shape or buf.dtype != key.dtype or buf.device != key.device:
            if start > 0:
                raise ValueError("KV cache written with another batch size, dtype or device; reset() it first")
            self.keys[layer_idx], self.values[layer_idx] = key.new_zeros(shape), value.new_zeros(shape)
        self.keys[layer_idx][:, :, start:end] = key
        self.values[layer_idx][:, :, start:end] = value
        self.lengths[layer_idx] = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def reset(self) -> None:
        """Forget every position (keeps the buffers for reuse)."""
        self.lengths = [0] * len(self.lengths)


class Attention(nn.Module):
    """Causal self-attention of block ``layer``: registry query, one linear K,V projection, SDPA, out-projection."""

    #: Parameter roles (models/roles.py): K, V and the out-projection; the query and its bias apart, the QK-norms.
    component: ClassVar[str] = "attention_kv_out"
    child_components: ClassVar[dict[str, str]] = {"query": "attention_query", "q_bias": "attention_query",
                                                  "q_norm": "norms", "k_norm": "norms"}

    def __init__(self, args: ModelArgs, layer: int = 0) -> None:
        super().__init__()
        self.layer_idx = layer
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        #: Whether a :class:`~torchnlq.models.query.FusableQuery` shares the K,V matmul. Who wraps the query or
        #: the projections (float8, the diagnostics' hooks) turns it off; the model never looks at what wrapped it.
        self.fuse_projections = True
        self.query: QueryProjection = build_query(args.query, args.dim, args.n_heads, args.head_dim, args.norm_eps,
                                                  layer, args.n_layers)
        # A GPT-2 model's query bias (model.bias), added to whatever the query type computes.
        self.q_bias = nn.Parameter(torch.empty(args.q_dim)) if args.bias else None
        # K and V stay linear (the paper); one matmul for both, K rows first.
        self.kv = nn.Linear(args.dim, 2 * args.kv_dim, bias=args.bias)
        self.proj = nn.Linear(args.q_dim, args.dim, bias=args.bias)
        # QK-norm: one RMSNorm per side over head_dim, shared by the heads (OLMo-2, Qwen3).
        self.q_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps) if args.qk_norm else None
        self.k_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps) if args.qk_norm else None
        #: SDPA's score scale: its default 1/sqrt(head_dim) (None), or µP's (models/mup.py).
        self.score_scale = attention_scale(args)

    def init_weights(self, init_std: float, residual_std: float) -> None:
        """Query and K,V at init_std; the out-projection feeds the residual stream, so residual_std."""
        self.query.init_weights(init_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()
        nn.init.normal_(self.kv.weight, mean=0.0, std=init_std)
        nn.init.normal_(self.proj.weight, mean=0.0, std=residual_std)
        for bias in (self.q_bias, self.kv.bias, self.proj.bias):
            if bias is not None:
                nn.init.zeros_(bias)

    def forward(self, x: torch.Tensor, rope: RopeTables | None = None, cache: Cache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of ``x`` [B, T, dim] over itself and what ``cache`` holds.

        ``mask`` (boolean, broadcastable to [B, H, T, past + T], True = may attend) is given by the decoder
        whenever the rule is not plain causal from position 0: several new tokens after cached ones, a padded batch.
        Without it, T > 1 new tokens attend causally among themselves and one new token to every cached one.
        """
        batch, seq_len, _ = x.shape
        # Eager, without a cache, a query that is its projection (linear), no QK-norm: Q's and K's rows come in
        # adjacent_order and RoPE rotates them as complex pairs (q·k is the same function; docs/performance.md).
        # Not compiled: inductor fuses the rotate-half form into one kernel, and has no complex kernels.
        adjacent = (rope is not None and cache is None and self.fuse_projections and self.q_norm is None
                    and self.q_bias is None and not torch.compiler.is_compiling()
                    and claims(self.query, FusableQuery) and type(self.query).projection_is_query)
        q, kv = self._project(x, fuse=self.fuse_projections and cache is None, adjacent=adjacent)
        if self.q_bias is not None:
            q = q + self.q_bias
        k, v = kv.split(self.n_kv_heads * self.head_dim, dim=-1)
        # Heads as [B, T, H, hd]: the norms and the rotation run on this contiguous layout, then
        # [B, H, T, hd] for SDPA and the cache.
        q = q.view(batch, seq_len, self.n_heads, self.head_dim)
        k = k.view(batch, seq_len, self.n_kv_heads, self.head_dim)
        v = v.view(batch, seq_len, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            rotate = apply_rotary_adjacent if adjacent else apply_rotary
            q, k = rotate(q, *rope), rotate(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        # Default scale 1/sqrt(head_dim) on q as produced by the query (already halved by the
        # queries that contain X, under model.query.half_scale: the paper's 1/(2 sqrt(head_dim))).
        # enable_gqa lets query head h read kv head h // (n_heads / n_kv_heads), the same
        # grouping as repeat_interleave, without materialising the copies.
        gqa = self.n_kv_heads != self.n_heads
        if mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa, scale=self.score_scale)
        else:
            # Without a cache, one token attends to itself either way: a constant True, not a SymBool under
            # compile's dynamic shapes (SDPA takes a bool only).
            y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or seq_len > 1, enable_gqa=gqa,
                                               scale=self.score_scale)
        return self.proj(y.transpose(1, 2).reshape(batch, seq_len, self.n_heads * self.head_dim))

    def _project(self, x: torch.Tensor, fuse: bool, adjacent: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(the query ``[B, T, q_dim]``, K and V ``[B, T, 2 kv_dim]``) of X.

        With ``fuse``, a :class:`~torchnlq.models.query.FusableQuery` shares the K,V matmul: X·[W | W_K | W_V]
        once (nanoGPT's ``c_attn``), the parameters staying where they are. Not when decoding (``fuse`` false with
        a cache): there the copy of the weights would cost more than one matmul saves. Measured:
        docs/performance.md, "Around the model".
        """
        if not (fuse and claims(self.query, FusableQuery)):
            return self.query(x), self.kv(x)
        projection = self.query.fused_projection()
        weight = torch.cat((projection.weight, self.kv.weight))
        if adjacent:  # Q's and K's rows in adjacent_order (V's as they are), for apply_rotary_adjacent
            q_rows = adjacent_order(self.n_heads, self.head_dim, weight.device)
            k_rows = adjacent_order(self.n_kv_heads, self.head_dim, weight.device) + projection.out_features
            v_rows = torch.arange(projection.out_features + self.n_kv_heads * self.head_dim, weight.shape[0],
                                  device=weight.device)
            weight = weight.index_select(0, torch.cat((q_rows, k_rows, v_rows)))
        # split, not slicing: its backward is one cat of the two gradients, where slices' zero-fill a full copy each.
        projected, kv = F.linear(x, weight).split([projection.out_features, self.kv.out_features], dim=-1)
        if self.kv.bias is not None:
            kv = kv + self.kv.bias
        return self.query.from_projection(x, projected), kv


def attention_modules(model: nn.Module) -> Iterator[Attention]:
    """Every :class:`Attention` of ``model``, in module order."""
    return (m for m in model.modules() if isinstance(m, Attention))


def set_fused_projections(model: nn.Module, enabled: bool) -> None:
    """Let (or stop) the queries of ``model`` share the K,V matmul: off while something must see each Linear run
    (float8's replaced linears, forward hooks on the queries)."""
    for attention in attention_modules(model):
        attention.fuse_projections = enabled


class MLP(nn.Module):
    """Linear(dim, hidden) -> GELU -> Linear(hidden, dim); with ``mlp_activation = "swiglu"`` the gated
    ``proj(silu(gate(x)) * fc(x))`` (Llama's w2(silu(w1 x) * w3 x): gate = w1, fc = w3, proj = w2).

    GELU is the exact erf form, or GPT-2's tanh form with ``gelu_tanh``. ``hidden`` overrides args.mlp_hidden
    (an MoE's shared expert).
    """

    component: ClassVar[str] = "mlp"  # parameter roles (models/roles.py)

    def __init__(self, args: ModelArgs, hidden: int | None = None) -> None:
        super().__init__()
        hidden = args.mlp_hidden if hidden is None else hidden
        self.fc = nn.Linear(args.dim, hidden, bias=args.bias)
        self.gate = nn.Linear(args.dim, hidden, bias=args.bias) if args.mlp_activation == "swiglu" else None
        self.proj = nn.Linear(hidden, args.dim, bias=args.bias)
        self.approximate = "tanh" if args.mlp_activation == "gelu_tanh" else "none"

    def init_weights(self, init_std: float, residual_std: float) -> None:
        """Up-projection (and gate) at init_std; the down-projection feeds the residual stream, so residual_std;
        biases 0."""
        nn.init.normal_(self.fc.weight, mean=0.0, std=init_std)
        if self.gate is not None:
            nn.init.normal_(self.gate.weight, mean=0.0, std=init_std)
        nn.init.normal_(self.proj.weight, mean=0.0, std=residual_std)
        for linear in (self.fc, self.gate, self.proj):
            if linear is not None and linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.proj(F.silu(self.gate(x)) * self.fc(x))
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))
