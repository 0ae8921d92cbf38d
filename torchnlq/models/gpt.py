"""A pre-norm decoder (GPT-2 or Llama style) whose attention query comes from the query registry.

Pre-norm blocks ``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))``. The defaults are the paper's GPT-2
block: LayerNorms, a GELU MLP, learned absolute positions, no biases anywhere (``model.bias``
adds GPT-2's, for imported GPT-2 weights). The options make it a Llama-style block: RMSNorm,
the gated SwiGLU MLP, RoPE (with Llama 3's frequency scaling), QK-norm; one K,V projection
with optional GQA/MQA; the LM head optionally tied to the token embedding. Parallelism, logging
and files are applied from outside, block by block, through ``model.layers``; another block family
(``model.block``) replaces :class:`Block` with its own class (``torchnlq/models/registry.py``).

For sampling, ``forward(tokens, cache=KVCache(...))`` runs incrementally (a prompt once, then one
token per step). The Hugging Face wrapper (``torchnlq/interop/modeling_torchnlq.py``) drives the same
blocks with transformers' cache (anything with ``pos`` and ``update(k, v)``) and a padding mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .args import ModelArgs
from .config import PRENORM
from .lm_loss import HeadLoss
from .paper_init import init_like_paper
from .query import QueryProjection, build_query
from .rope import RotaryEmbedding, apply_rotary, rope_scaling

RopeTables = tuple[torch.Tensor, torch.Tensor]


def build_norm(args: ModelArgs, width: int) -> nn.Module:
    """The block's norm over ``width`` channels: LayerNorm (bias only under model.bias) or RMSNorm."""
    if args.norm == "rms":
        return nn.RMSNorm(width, eps=args.norm_eps)
    return nn.LayerNorm(width, eps=args.norm_eps, bias=args.bias)

class KVCache:
    """Keys and values of every layer for incremental decoding (inference only).

    ``pos`` is the number of positions already written (:meth:`GPT.forward` advances it). Buffers
    ``[batch, n_kv_heads, max_len, head_dim]`` are allocated on the first write, in the keys' device
    and dtype (so bf16 autocast gets a bf16 cache).
    """

    def __init__(self, n_layers: int, max_len: int) -> None:
        self.max_len = max_len
        self.pos = 0
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    @classmethod
    def for_model(cls, model: GPT) -> KVCache:
        """An empty cache sized to the model's context (max_seq_len)."""
        return cls(model.args.n_layers, model.args.max_seq_len)

    def layer(self, index: int) -> LayerKV:
        """The view one attention layer writes through."""
        return LayerKV(self, index)

    def reset(self) -> None:
        """Forget every position (keeps the buffers for reuse)."""
        self.pos = 0


class LayerKV:
    """One layer's slot in a :class:`KVCache`: append this step's K,V, get all K,V so far."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache = cache
        self.index = index

    @property
    def pos(self) -> int:
        """Positions written before this forward (the offset of its first token)."""
        return self.cache.pos

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([B, H_kv, T, hd]) at positions pos..pos+T-1; return keys/values 0..pos+T-1."""
        c, i = self.cache, self.index
        start, end = c.pos, c.pos + k.shape[2]
        if end > c.max_len:
            raise ValueError(f"KV cache holds {c.max_len} positions; cannot write positions {start}..{end - 1}")
        shape = (k.shape[0], k.shape[1], c.max_len, k.shape[3])
        buf = c.keys[i]
        if buf is None or buf.shape != shape or buf.dtype != k.dtype or buf.device != k.device:
            if start > 0:
                raise ValueError("KV cache written with another batch size, dtype or device; reset() it first")
            c.keys[i] = k.new_zeros(shape)
            c.values[i] = v.new_zeros(shape)
        c.keys[i][:, :, start:end] = k
        c.values[i][:, :, start:end] = v
        return c.keys[i][:, :, :end], c.values[i][:, :, :end]


class Attention(nn.Module):
    """Causal self-attention: registry query, one linear K,V projection, SDPA, out-projection."""

    def __init__(self, args: ModelArgs, layer: int = 0) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.query: QueryProjection = build_query(args.query, args.dim, args.n_heads, args.head_dim, args.norm_eps)
        self.query.for_layer(layer, args.n_layers)
        # A GPT-2 model's query bias (model.bias), added to whatever the query type computes.
        self.q_bias = nn.Parameter(torch.empty(args.q_dim)) if args.bias else None
        # K and V stay linear (the paper); one matmul for both, K rows first.
        self.kv = nn.Linear(args.dim, 2 * args.kv_dim, bias=args.bias)
        self.proj = nn.Linear(args.q_dim, args.dim, bias=args.bias)
        # QK-norm: one RMSNorm per side over head_dim, shared by the heads (OLMo-2, Qwen3).
        self.q_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps) if args.qk_norm else None
        self.k_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps) if args.qk_norm else None

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

    def forward(
        self, x: torch.Tensor, rope: RopeTables | None = None, cache: LayerKV | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``mask`` (boolean, broadcastable to [B, H, T, past + T], True = may attend) replaces the
        causal rule, for padded batches; it is applied after the cache has added this step's keys."""
        batch, seq_len, _ = x.shape
        q, kv = self._project(x, fuse=cache is None)
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
            q = apply_rotary(q, *rope)
            k = apply_rotary(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        # Default scale 1/sqrt(head_dim) on q as produced by the query (already halved by the
        # queries that contain X, under model.query.half_scale: the paper's 1/(2 sqrt(head_dim))).
        # enable_gqa lets query head h read kv head h // (n_heads / n_kv_heads), the same
        # grouping as repeat_interleave, without materialising the copies.
        gqa = self.n_kv_heads != self.n_heads
        if cache is None and mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif mask is not None:
            if cache is not None:
                k, v = cache.update(k, v)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        else:
            y = self._attend_cached(q, k, v, cache, gqa)
        return self.proj(y.transpose(1, 2).reshape(batch, seq_len, self.n_heads * self.head_dim))

    def _project(self, x: torch.Tensor, fuse: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(the query ``[B, T, q_dim]``, K and V ``[B, T, 2 kv_dim]``) of X.

        With ``fuse``, a query whose :meth:`~QueryProjection.fused_projection` is a plain Linear shares the K,V
        matmul: X·[W | W_K | W_V] once (nanoGPT's ``c_attn``), the parameters staying where they are. Not when
        decoding (``fuse`` false with a cache): there the copy of the weights would cost more than one matmul saves.
        Measured: docs/performance.md, "Around the model".
        """
        projection = self.query.fused_projection() if fuse else None
        # Exactly nn.Linear: a replaced module (float8's Float8Linear) must run its own forward; so must a query
        # with hooks (the training diagnostics read its input and output through one).
        hooked = bool(self.query._forward_hooks or self.query._forward_pre_hooks)
        if projection is None or hooked or type(projection) is not nn.Linear or type(self.kv) is not nn.Linear:
            return self.query(x), self.kv(x)
        # split, not slicing: its backward is one cat of the two gradients, where slices' zero-fill a full copy each.
        projected, kv = F.linear(x, torch.cat((projection.weight, self.kv.weight))).split(
            [projection.out_features, self.kv.out_features], dim=-1)
        if self.kv.bias is not None:
            kv = kv + self.kv.bias
        return self.query.from_projection(x, projected), kv

    @staticmethod
    def _attend_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKV, gqa: bool) -> torch.Tensor:
        """Attention of the new queries over every cached key, causal in absolute positions."""
        start, q_len = cache.pos, q.shape[2]
        k, v = cache.update(k, v)
        if q_len == 1:
            # One new token may see every cached position: no mask at all.
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        if start == 0:
            # A prefill from position 0: q_len == kv_len, so is_causal means the usual triangle.
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        # Several new tokens after cached ones: is_causal with q_len != kv_len is top-left
        # aligned in SDPA, which would be wrong here, so build the mask explicitly.
        # Query i sits at absolute position start + i and may see keys 0..start + i.
        q_pos = torch.arange(start, start + q_len, device=q.device)[:, None]
        k_pos = torch.arange(k.shape[2], device=q.device)[None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=k_pos <= q_pos, enable_gqa=gqa)


class MLP(nn.Module):
    """Linear(dim, hidden) -> GELU -> Linear(hidden, dim); with ``mlp_activation = "swiglu"`` the gated
    ``proj(silu(gate(x)) * fc(x))`` (Llama's w2(silu(w1 x) * w3 x): gate = w1, fc = w3, proj = w2).

    GELU is the exact erf form, or GPT-2's tanh form with ``gelu_tanh``.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.fc = nn.Linear(args.dim, args.mlp_hidden, bias=args.bias)
        self.gate = nn.Linear(args.dim, args.mlp_hidden, bias=args.bias) if args.mlp_activation == "swiglu" else None
        self.proj = nn.Linear(args.mlp_hidden, args.dim, bias=args.bias)
        self.approximate = "tanh" if args.mlp_activation == "gelu_tanh" else "none"

    def init_weights(self, init_std: float, residual_std: float) -> None:
        """Up-projection (and gate) at init_std; the down-projection feeds the residual stream, so residual_std; biases 0."""
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


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, args: ModelArgs, layer: int = 0) -> None:
        super().__init__()
        self.ln_1 = build_norm(args, args.dim)
        self.attn = Attention(args, layer)
        self.ln_2 = build_norm(args, args.dim)
        self.mlp = MLP(args)

    def init_weights(self, init_std: float, residual_std: float) -> None:
        """Re-initialise this block in a fixed order: ln_1, attn, ln_2, mlp."""
        self.ln_1.reset_parameters()
        self.attn.init_weights(init_std, residual_std)
        self.ln_2.reset_parameters()
        self.mlp.init_weights(init_std, residual_std)

    def forward(
        self, x: torch.Tensor, rope: RopeTables | None = None, cache: LayerKV | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope, cache, mask)
        return x + self.mlp(self.ln_2(x))


def _uninitialised_embedding(num: int, dim: int) -> nn.Embedding:
    """An Embedding that skips its own init (init_weights sets it): its ``normal_`` on a meta tensor
    imports torch._dynamo, seconds of start-up for a tool that only loads weights."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


class GPT(nn.Module):
    """The decoder: ``forward(tokens [B, T]) -> logits [B, T, vocab_size]``.

    Construction allocates on the default device and runs :meth:`init_weights`; under
    ``torch.device("meta")`` the caller does (``to_empty`` then ``init_weights``). :meth:`init_weights`
    is the only consumer of the RNG, so both paths give identical weights for the same seed.
    """

    def __init__(self, args: ModelArgs, block: Callable[[ModelArgs, int], nn.Module] | None = None) -> None:
        """``block(args, layer)`` builds each transformer block; the library passes the class ``args.block`` names
        (:func:`torchnlq.models.registry.build_model`, the one constructor). Unset: the pre-norm :class:`Block`."""
        super().__init__()
        args.validate()
        if block is None:
            if args.block != PRENORM:
                raise ValueError(f"model.block={args.block!r}: build this model with models.build_model(args)")
            block = Block
        self.args = args
        device = torch.get_default_device()
        # Build on meta so that nn.Linear/nn.Embedding skip their own random init: it would
        # advance the RNG (breaking meta == eager) and be thrown away by init_weights anyway.
        with torch.device("meta"):
            self.tok_emb = _uninitialised_embedding(args.vocab_size, args.dim)
            self.pos_emb = _uninitialised_embedding(args.max_seq_len, args.dim) if args.positions == "learned" else None
            self.rope = (
                RotaryEmbedding(args.head_dim, args.max_seq_len, args.rope_theta, rope_scaling(args))
                if args.positions == "rope" else None
            )
            self.layers = nn.ModuleList(block(args, layer) for layer in range(args.n_layers))
            self.ln_f = build_norm(args, args.dim)
            # A tied head is no module at all: forward reuses tok_emb.weight, so the weight is
            # one tensor in state_dict and stays shared through to_empty and sharding.
            self.lm_head = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        # The head's cross-entropy, given targets; no parameters (compiled from outside, like the blocks).
        self.head_loss = HeadLoss()
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer in place from the global RNG, in a fixed order.

        nanoGPT's scheme: every Linear and Embedding N(0, init_std); the out-projections into the
        residual stream N(0, init_std / sqrt(2 n_layers)) so its variance does not grow with depth;
        norm gains 1; RoPE tables recomputed (not in checkpoints, garbage after to_empty).
        ``args.init = "paper"`` draws the same in the paper's order (:mod:`torchnlq.models.paper_init`).
        """
        if self.args.init == "paper":
            init_like_paper(self)
            return
        std = self.args.init_std
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=std)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb.weight, mean=0.0, std=std)
        if self.rope is not None:
            self.rope.init_weights()
        for index, layer in enumerate(self.layers):
            depth = index + 1 if self.args.init == "depth" else self.args.n_layers
            layer.init_weights(std, std / math.sqrt(2 * depth))
        self.ln_f.reset_parameters()
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=std)

    def forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None, targets: torch.Tensor | None = None,
        loss_chunk_tokens: int = 0,
    ) -> torch.Tensor:
        """Logits [B, T, vocab_size] for token ids [B, T]; T may not exceed max_seq_len.

        With a ``cache``, ``tokens`` continue the cached sequence from position ``cache.pos``, attend to
        every cached position, and the cache advances by T.

        With ``targets`` ([B, T] token ids), the mean cross-entropy instead (an fp32 scalar): from the full
        logits, or through the head ``loss_chunk_tokens`` tokens at a time (``models/lm_loss.py``); computed
        in the model's own forward so that FSDP has gathered the head's weight when it runs.
        """
        seq_len = tokens.shape[1]
        start = 0 if cache is None else cache.pos
        if start + seq_len > self.args.max_seq_len:
            raise ValueError(
                f"sequence length {start + seq_len} exceeds the model's max_seq_len={self.args.max_seq_len}"
            )
        x = self.tok_emb(tokens)
        rope = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + seq_len, device=tokens.device))
        elif start == 0:
            rope = self.rope(seq_len)
        else:
            cos, sin = self.rope(start + seq_len)
            rope = (cos[start:], sin[start:])
        for i, layer in enumerate(self.layers):
            x = layer(x, rope) if cache is None else layer(x, rope, cache.layer(i))
        if cache is not None:
            cache.pos += seq_len
        x = self.ln_f(x)
        weight = self.head_weight()
        if targets is not None:
            return self.head_loss(x, weight, targets, loss_chunk_tokens)
        return F.linear(x, weight)

    def head_weight(self) -> torch.Tensor:
        """The LM head's weight [vocab_size, dim]: the token embedding when tied."""
        return self.tok_emb.weight if self.lm_head is None else self.lm_head.weight

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters actually allocated (shared tensors once), optionally minus token/position embeddings."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                total -= self.pos_emb.weight.numel()
        return total
