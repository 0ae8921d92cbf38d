"""AdamW with the paper's parameter groups, and the warmup + cosine LR schedule.

``optimizer.name = "adamw8bit"`` swaps torch's AdamW for torchao's ``AdamW8bit`` (both moments
in 8 bits: ~2 bytes of state per parameter instead of 8; see docs/performance.md).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from torchnlq.config.job_config import LRSchedule, Optimizer
from torchnlq.errors import ConfigError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """A decayed group (tensors with >= 2 dims) and an undecayed one (norm gains, biases); tied weights once."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _adamw8bit(cfg: Optimizer, groups: list[dict]) -> torch.optim.Optimizer:
    """torchao's AdamW8bit over the same parameter groups (imported only when asked for)."""
    if cfg.fused:
        raise ConfigError("optimizer.fused = true is torch's fused AdamW kernel; unset it with optimizer.name = 'adamw8bit'")
    from torchnlq.parallel.float8 import quiet_torchao_import

    with quiet_torchao_import():
        from torchao.optim import AdamW8bit
    # Its state subclass warns once per compile that AOT autograd's cache cannot hash it: harmless, not actionable.
    warnings.filterwarnings("ignore", message="OptimState8bit does not implement _stable_hash_for_caching")
    return AdamW8bit(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


def build_optimizer(cfg: Optimizer, model: nn.Module, device_type: str) -> torch.optim.Optimizer:
    """``cfg.name`` over :func:`param_groups`: AdamW (fused on CUDA unless ``cfg.fused`` says otherwise)
    or torchao's AdamW8bit (same groups, same decay)."""
    if cfg.name == "adamw8bit":
        return _adamw8bit(cfg, param_groups(model, cfg.weight_decay))
    fused = cfg.fused if cfg.fused is not None else device_type == "cuda"
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=fused,
    )


def lr_at(it: int, peak_lr: float, cfg: LRSchedule, total_steps: int) -> float:
    """Learning rate of iteration ``it`` (0-based): linear warmup, cosine to ``min_lr`` (nanoGPT's formula)."""
    warmup = cfg.warmup_steps
    decay_steps = cfg.decay_steps if cfg.decay_steps is not None else total_steps
    if it < warmup:
        return peak_lr * (it + 1) / (warmup + 1)
    if it >= decay_steps or decay_steps <= warmup:
        return cfg.min_lr
    ratio = (it - warmup) / (decay_steps - warmup)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak_lr - cfg.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group (torchao's tensor one in place: no recompile)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
