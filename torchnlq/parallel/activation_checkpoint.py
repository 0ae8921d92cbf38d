"""Activation checkpointing of transformer blocks, applied in place.

A checkpointed block keeps only its input and recomputes the rest in backward (``full``,
``selective``), or keeps the matmul and attention outputs and recomputes the rest (``op``).

Not ``checkpoint_wrapper``: its ``_checkpoint_wrapped_module`` child changes every parameter name.
Each block's ``forward`` is replaced, on the instance only, by a non-reentrant
:func:`torch.utils.checkpoint.checkpoint` around the class's forward, so names and keys stay.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from torchnlq.config.job_config import ActivationCheckpoint

aten = torch.ops.aten

# Ops whose outputs "op" mode saves: the matmuls (bmm for SDPA's math path, _scaled_mm for float8)
# and every fused attention kernel. Names missing from this torch build are skipped.
_SAVED_OP_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)


SAVED_OPS: frozenset[Any] = frozenset(getattr(aten, name).default for name in _SAVED_OP_NAMES if hasattr(aten, name))


def _op_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Save matmul and attention outputs; recompute everything else (norms, GELU, adds, views)."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def op_context_fn() -> tuple[Any, Any]:
    """Fresh selective-checkpoint contexts for one forward of one block (what ``context_fn`` must return)."""
    return create_selective_checkpoint_contexts(_op_policy)


def checkpoint_block(block: nn.Module, context_fn: Callable[[], tuple[Any, Any]] | None = None) -> None:
    """Make ``block`` recompute its forward in backward, in place; ``context_fn`` selects what is saved anyway."""
    if is_checkpointed(block):
        raise RuntimeError(f"{type(block).__name__} already has an instance forward (checkpointed twice?)")
    inner = block.forward  # the class's forward, bound to this block
    # context_fn only when given: passing torch's own default explicitly breaks dynamo's tracing of checkpoint.
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if context_fn is not None:
        kwargs["context_fn"] = context_fn

    @functools.wraps(inner)
    def forward(*args: Any, **fwd_kwargs: Any) -> Any:
        return checkpoint(inner, *args, **kwargs, **fwd_kwargs)

    block.forward = forward  # an instance attribute: plain attribute, not a submodule


def is_checkpointed(block: nn.Module) -> bool:
    """Whether :func:`checkpoint_block` was applied to ``block``."""
    return "forward" in vars(block)


@dataclass(frozen=True)
class CheckpointMode:
    """One ``activation_checkpoint.mode``: which blocks recompute, and what their forward still saves."""

    #: (block index, cfg) -> whether the block is checkpointed.
    blocks: Callable[[int, ActivationCheckpoint], bool]
    #: What a checkpointed block saves anyway (None: only its input).
    context_fn: Callable[[], tuple[Any, Any]] | None = None
    #: Whether ``activation_checkpoint.every`` matters (it names the mode with it: "selective/2").
    reads_every: bool = False


#: ``activation_checkpoint.mode``.
MODES: dict[str, CheckpointMode] = {
    "none": CheckpointMode(blocks=lambda index, cfg: False),
    "full": CheckpointMode(blocks=lambda index, cfg: True),
    "selective": CheckpointMode(blocks=lambda index, cfg: (index + 1) % cfg.every == 0, reads_every=True),
    "op": CheckpointMode(blocks=lambda index, cfg: True, context_fn=op_context_fn),
}


def describe_checkpointing(cfg: ActivationCheckpoint) -> str:
    """The mode in words: its name, with ``every`` where it reads it ("selective/2")."""
    return f"{cfg.mode}/{cfg.every}" if MODES[cfg.mode].reads_every else cfg.mode


def apply_activation_checkpointing(model: nn.Module, cfg: ActivationCheckpoint) -> nn.Module:
    """Checkpoint ``model.layers`` per ``cfg.mode`` (:data:`MODES`)."""
    mode = MODES[cfg.mode]
    for index, block in enumerate(model.layers):
        if mode.blocks(index, cfg):
            checkpoint_block(block, mode.context_fn)
    return model
