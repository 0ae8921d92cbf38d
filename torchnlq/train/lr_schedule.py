"""The learning-rate schedules, by name (``lr_schedule.name``), and the shapes of a decay tail (``decay_shape``).

Each :class:`Schedule` owns what is particular to it: its rate after the warmup, where its decay starts, whether it
reads a decay tail, and its words in the run's header. :func:`lr_at`, the preflight checks and the header read these
registries; no other code tests a schedule's name. docs/training.md describes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torchnlq.config.job_config import LRSchedule
from torchnlq.errors import ConfigError

#: ``decay_shape``: (peak, min_lr, progress 0..1 through the tail) -> the rate.
DECAY_SHAPES: dict[str, Callable[[float, float, float], float]] = {
    "linear": lambda peak, low, progress: peak - (peak - low) * progress,
    "cosine": lambda peak, low, progress: low + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - low),
    "1-sqrt": lambda peak, low, progress: low + (peak - low) * (1.0 - math.sqrt(progress)),
}


def decay_length(cfg: LRSchedule, end: int) -> int:
    """Steps of a decay tail: ``decay_length``, else ``decay_fraction`` of the schedule's end (at least 1)."""
    if cfg.decay_length is not None:
        return cfg.decay_length
    return max(1, round(cfg.decay_fraction * end))


@dataclass(frozen=True)
class Schedule:
    """One ``lr_schedule.name``."""

    #: (cfg, end) -> the iteration its decay starts at (the warmup's end when it decays at once).
    decay_start: Callable[[LRSchedule, int], int]
    #: (cfg, it, peak, end) -> the rate at iteration ``it``, warmup <= it < end.
    rate: Callable[[LRSchedule, int, float, int], float]
    #: Whether it has a decay tail (``decay_length``, ``decay_fraction``, ``decay_shape``).
    has_tail: bool


def _cosine(cfg: LRSchedule, it: int, peak: float, end: int) -> float:
    progress = (it - cfg.warmup_steps) / (end - cfg.warmup_steps)
    return DECAY_SHAPES["cosine"](peak, cfg.min_lr, progress)


def _wsd(cfg: LRSchedule, it: int, peak: float, end: int) -> float:
    start = end - decay_length(cfg, end)
    return peak if it < start else DECAY_SHAPES[cfg.decay_shape](peak, cfg.min_lr, (it - start) / (end - start))


#: ``lr_schedule.name``: cosine (the paper's: decays from the warmup's end) or warmup-stable-decay.
SCHEDULES: dict[str, Schedule] = {
    "cosine": Schedule(decay_start=lambda cfg, end: cfg.warmup_steps, rate=_cosine, has_tail=False),
    "wsd": Schedule(decay_start=lambda cfg, end: end - decay_length(cfg, end), rate=_wsd, has_tail=True),
}


def schedule_end(cfg: LRSchedule, total_steps: int) -> int:
    """The iteration the schedule reaches min_lr at: ``decay_steps``, else the run's steps."""
    return cfg.decay_steps if cfg.decay_steps is not None else total_steps


def lr_at(it: int, peak_lr: float, cfg: LRSchedule, total_steps: int) -> float:
    """Learning rate of iteration ``it`` (0-based), before a group's multiplier.

    Every schedule warms up linearly (nanoGPT's ``peak·(it + 1)/(warmup + 1)``) and reaches ``min_lr`` at
    ``decay_steps`` (unset: the run's steps); between, the schedule's own rate.
    """
    warmup, end = cfg.warmup_steps, schedule_end(cfg, total_steps)
    if it < warmup:
        return peak_lr * (it + 1) / (warmup + 1)
    if it >= end or end <= warmup:
        return cfg.min_lr
    return SCHEDULES[cfg.name].rate(cfg, it, peak_lr, end)


def check_schedule(cfg: LRSchedule, total_steps: int) -> None:
    """ConfigError for a schedule that cannot be what its settings say (before anything is written)."""
    end = schedule_end(cfg, total_steps)
    if cfg.decay_steps is not None and cfg.decay_steps < cfg.warmup_steps:
        raise ConfigError(
            f"lr_schedule.decay_steps={cfg.decay_steps} is shorter than lr_schedule.warmup_steps={cfg.warmup_steps}: "
            "the learning rate would drop from its peak straight to min_lr; set decay_steps above warmup_steps "
            "(unset means training.steps)"
        )
    tailed = [name for name, schedule in SCHEDULES.items() if schedule.has_tail]
    if SCHEDULES[cfg.name].has_tail:
        tail = decay_length(cfg, end)
        if tail > end - cfg.warmup_steps:
            raise ConfigError(
                f"lr_schedule.decay_length={tail} is longer than the {end - cfg.warmup_steps} steps between the warmup "
                f"({cfg.warmup_steps}) and the end of the schedule ({end}): there is no stable phase; shorten it"
            )
    elif cfg.decay_length is not None:
        raise ConfigError(f"lr_schedule.decay_length is the decay tail of lr_schedule.name = "
                          f"{' or '.join(map(repr, tailed))}; {cfg.name} decays from the end of the warmup: drop it, "
                          f"or set name = '{tailed[0]}'")


def describe_schedule(cfg: LRSchedule, total_steps: int) -> str:
    """The run header's words for the schedule after its warmup."""
    end = schedule_end(cfg, total_steps)
    if SCHEDULES[cfg.name].has_tail:
        return f"{cfg.name} ({cfg.decay_shape} decay over steps {SCHEDULES[cfg.name].decay_start(cfg, end):,}..{end:,})"
    return f"{cfg.name} to step {end:,}"
