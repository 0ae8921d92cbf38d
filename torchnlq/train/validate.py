"""Validation on the fixed, pre-drawn validation sequences."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32, whatever the autocast dtype."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[float, float]:
    """Mean and standard deviation of the micro-batch losses (the paper's report).

    The model is put in eval mode for the pass and restored afterwards.
    """
    was_training = model.training
    model.eval()
    losses = []
    try:
        for x, y in batches:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast():
                losses.append(cross_entropy(model(x), y))
    finally:
        model.train(was_training)
    stacked = torch.stack(losses).double().cpu()
    std = stacked.std().item() if len(losses) > 1 else 0.0
    return stacked.mean().item(), std
