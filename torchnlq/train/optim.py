"""AdamW with the paper's parameter groups, and the warmup + cosine LR schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from torchnlq.config.job_config import LRSchedule, Optimizer


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split parameters into a decayed group (tensors with >= 2 dims: matmul and
    embedding weights) and an undecayed one (norm gains, and biases if any).

    Tied weights appear once: ``named_parameters`` de-duplicates shared tensors.
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(cfg: Optimizer, model: nn.Module, device_type: str) -> torch.optim.Optimizer:
    """AdamW over :func:`param_groups`; fused on CUDA unless ``cfg.fused`` says otherwise."""
    fused = cfg.fused if cfg.fused is not None else device_type == "cuda"
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=fused,
    )


def lr_at(it: int, peak_lr: float, cfg: LRSchedule, total_steps: int) -> float:
    """Learning rate of iteration ``it`` (0-based: the update that makes step it+1).

    Warmup ``peak * (it + 1) / (warmup + 1)`` for ``it < warmup``, then a cosine
    from ``peak`` down to ``min_lr`` reached at ``decay_steps`` (default: the total
    steps), constant after. This is the paper's (nanoGPT's) formula.
    """
    warmup = cfg.warmup_steps
    decay_steps = cfg.decay_steps if cfg.decay_steps is not None else total_steps
    if it < warmup:
        return peak_lr * (it + 1) / (warmup + 1)
    if it >= decay_steps or decay_steps <= warmup:
        return cfg.min_lr
    ratio = (it - warmup) / (decay_steps - warmup)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak_lr - cfg.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
