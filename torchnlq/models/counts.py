"""Parameter and FLOP counts of any family's model, from the model itself built on the meta device (no memory).

Counting the built model, not a formula per family, keeps every family honest: a block with another parameter
count (a plugin's, an MoE) is counted as it is built. Modules that compute for only some tokens say so by
:class:`PartlyActive` (an MoE's routed experts: top_k / n_experts): their parameters count in full in the total
and at that fraction in the active count, which the FLOPs, MFU and the scaling fits use.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .args import ModelArgs
from .family import build_model, get_family
from .query import get_query_class


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameters: all of them, those one token uses, and the embedding tables among them."""

    total: int
    #: Parameters one token computes with (routed experts at their active fraction); ``total`` for a dense model.
    active: int
    #: Token and position tables (a tied head is the token table).
    embedding: int
    #: The LM head's matmul (vocab x dim): FLOPs though not a parameter of its own when tied.
    head_matmul: int


@runtime_checkable
class PartlyActive(Protocol):
    """A module each token computes with only in part (an MoE's routed experts)."""

    #: The share of its parameters one token computes with (top_k / n_experts), in (0, 1].
    active_fraction: float


_CACHE: dict[str, ParamCounts] = {}


def param_counts(args: ModelArgs) -> ParamCounts:
    """The counts of the model ``args`` describes (its family's blocks built on meta; cached by the args and the
    classes that build them, so a plugin registered again is counted again)."""
    classes = (get_family(args.family).block, get_query_class(args.query.type))
    key = json.dumps(dataclasses.asdict(args), sort_keys=True, default=str) + repr([id(c) for c in classes])
    if key not in _CACHE:
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[key] = _count(args)
    return _CACHE[key]


def _count(args: ModelArgs) -> ParamCounts:
    with torch.device("meta"):
        model = build_model(args)
    fraction: dict[int, float] = {}
    for module in model.modules():
        if isinstance(module, PartlyActive):
            fraction.update(dict.fromkeys((id(p) for p in module.parameters()), float(module.active_fraction)))
    params = list(model.parameters())  # a tied weight once
    total = sum(p.numel() for p in params)
    active = round(sum(p.numel() * fraction.get(id(p), 1.0) for p in params))
    embedding = model.tok_emb.weight.numel() + (model.pos_emb.weight.numel() if model.pos_emb is not None else 0)
    return ParamCounts(total, active, embedding, args.vocab_size * args.dim)


def num_params(args: ModelArgs, non_embedding: bool = False, active: bool = False) -> int:
    """Parameters of the model: all, or per token (``active``); ``non_embedding`` subtracts the token and
    position tables, as GPT-2 / nanoGPT report (an untied LM head stays in, as in the paper's counts)."""
    counts = param_counts(args)
    n = counts.active if active else counts.total
    return n - counts.embedding if non_embedding else n


def flops_per_token(args: ModelArgs, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward) at context length ``seq_len``.

    6·N + 12·n_layers·n_heads·head_dim·seq_len (Kaplan et al. / PaLM; no discount for the causal mask). N = the
    active non-embedding parameters + the LM head matmul (V·d) when tied: lookups do no FLOPs, the head does
    (an untied head is already in N). Norm gains are in N (a negligible overcount); elementwise work is not.
    """
    n = num_params(args, non_embedding=True, active=True)
    if args.tie_embeddings:
        n += param_counts(args).head_matmul
    return 6 * n + 12 * args.n_layers * args.n_heads * args.head_dim * seq_len


def active_params(args: ModelArgs) -> str:
    """``", active N"`` where a token computes with fewer parameters than the model has (an MoE), else nothing."""
    active = num_params(args, active=True)
    return f", active {active:,}" if active != num_params(args) else ""
