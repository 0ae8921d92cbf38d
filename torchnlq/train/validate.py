"""Validation on the fixed, pre-drawn validation sequences: the loss, and when to compute it."""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from torchnlq.config.every import Every
from torchnlq.config.job_config import Validation
from torchnlq.data.batches import PaperValidationRows, ValidationSet
from torchnlq.data.mixture import MixtureValidation
from torchnlq.models.lm_loss import cross_entropy
from torchnlq.pause_points import pause_point

Batch = tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Sequence[Batch],
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    rank: int = 0,
    world_size: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[float, float]:
    """Mean and standard deviation of the micro-batch losses (the paper's report), as one process would get them.

    Rank r evaluates the r-th contiguous chunk. Every rank runs as many forwards (FSDP's all-gathers need
    them all): a short chunk repeats its first batch and drops that result.
    """
    per_rank = math.ceil(len(batches) / world_size)
    mine = list(range(rank * per_rank, min((rank + 1) * per_rank, len(batches))))
    losses = torch.zeros(per_rank, dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    try:
        for slot in range(per_rank):
            index = mine[slot] if slot < len(mine) else (mine[0] if mine else 0)
            x, y = (t.to(device, non_blocking=True) for t in batches[index])
            with autocast():
                loss = cross_entropy(model(x), y)
            if slot < len(mine):
                losses[slot] = loss.double()
            if progress is not None:
                progress(slot + 1, per_rank)
    finally:
        model.train(was_training)
    gathered = [losses]
    if world_size > 1:
        gathered = [torch.empty_like(losses) for _ in range(world_size)]
        dist.all_gather(gathered, losses)
    # Rank q's chunk holds its first min(per_rank, remaining) results; the rest is padding.
    values = torch.cat([g[: max(0, min(per_rank, len(batches) - q * per_rank))] for q, g in enumerate(gathered)]).cpu()
    std = values.std().item() if len(values) > 1 else math.nan  # one micro-batch: no spread
    return values.mean().item(), std


@dataclass(frozen=True)
class ValidationResult:
    """One validation: the mean and std of the micro-batch losses, its seconds, and the paper's train estimate."""

    mean: float
    std: float
    seconds: float
    #: (mean, std) over the paper protocol's eval_train row of the step (the paper's "train loss"); None otherwise.
    eval_train: tuple[float, float] | None = None
    #: A mixture's loss per source, by name (``mean`` is then their mean weighted as training draws them).
    per_source: dict[str, float] | None = None


class Validator:
    """The run's validation batches, when to evaluate them, and the last result (all ranks :meth:`run` together)."""

    def __init__(
        self, cfg: Validation, source: ValidationSet | PaperValidationRows | MixtureValidation, device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager], rank: int = 0, world_size: int = 1,
    ) -> None:
        self.cfg, self.source, self.device = cfg, source, device
        self.autocast, self.rank, self.world_size = autocast, rank, world_size
        self.report: Callable[[str], None] | None = None  # progress lines of a long validation (rank 0)
        self.report_every = 10.0  # seconds: a validation longer than this reports its progress at this interval
        self.schedule = Every(cfg.interval if cfg.enabled else 0)

    def describe(self) -> str:
        """What one validation evaluates, for the run's header."""
        sequences = sum(len(x) for x, _ in self.source.batches_at(0))
        if self.cfg.protocol == "paper":
            return f"{sequences:,} sequences of the paper's row of each step, as many of its eval_train row; and step 0"
        parts = getattr(self.source, "parts_at", None)
        if parts is not None:
            return f"{self.cfg.sequences:,} fixed sequences of each of {len(parts(0))} sources"
        return f"{sequences:,} fixed sequences"

    def due_before_training(self, step: int, branch: bool = False) -> bool:
        """Whether to validate before the first update: the paper's protocol at step 0 (not on a resume), and a
        ``branch`` (a run that goes on from another run's checkpoint) at its branch point, so that branched decays
        share a validation step with each other and their trunk."""
        return self.cfg.enabled and ((self.cfg.protocol == "paper" and step == 0) or (branch and step > 0))

    def run(self, model: nn.Module, step: int) -> ValidationResult:
        """Evaluate ``model`` on ``batches_at(step)`` (and the paper protocol's eval_train row of ``step``)."""
        start = time.perf_counter()
        pause_point("validation", step)
        progress = self._progress_reporter(start)
        evaluate_at = functools.partial(evaluate, model, device=self.device, autocast=self.autocast, rank=self.rank,
                                        world_size=self.world_size, progress=progress)
        parts = getattr(self.source, "parts_at", None)
        if parts is not None:  # a mixture: each source's loss, and their mean weighted as training draws them
            results = [(name, weight, evaluate_at(batches)) for name, weight, batches in parts(step)]
            total = sum(weight for _, weight, _ in results)
            mean = sum(weight * loss for _, weight, (loss, _) in results) / total
            _, std = evaluate_at(self.source.batches_at(step))  # the spread over every micro-batch
            return ValidationResult(mean, std, time.perf_counter() - start,
                                    per_source={name: loss for name, _, (loss, _) in results})
        mean, std = evaluate_at(self.source.batches_at(step))
        train_rows = getattr(self.source, "train_batches_at", None)
        eval_train = evaluate_at(train_rows(step)) if train_rows is not None else None
        return ValidationResult(mean, std, time.perf_counter() - start, eval_train)

    def _progress_reporter(self, start: float) -> Callable[[int, int], None] | None:
        """A callback that reports every ``report_every`` seconds, so a long validation is not silence."""
        if self.report is None:
            return None
        last = [start]

        def progress(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - last[0] >= self.report_every and done < total:
                last[0] = now
                left = (now - start) / done * (total - done)
                self.report(f"validating: {done}/{total} micro-batches, {now - start:.0f}s so far, ~{left:.0f}s left")

        return progress
