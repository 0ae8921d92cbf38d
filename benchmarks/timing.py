"""Timing helpers shared by the benchmarks: a device timer, interleaved rounds, machine info, Markdown tables,
and :func:`measure_allocations`, the CPU allocations of a call (process RSS only ever grows).
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from torchnlq.errors import UserError


class DeviceTimer:
    """Seconds taken by ``fn()`` on ``device``: CUDA events on GPU, ``perf_counter`` on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], Any]) -> float:
        """Run ``fn`` once and return its duration in seconds (earlier queued work is excluded)."""
        if self.device.type != "cuda":
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        self.synchronize()
        start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start_event.record()
        fn()
        end_event.record()
        end_event.synchronize()
        return start_event.elapsed_time(end_event) / 1000.0


def interleave(
    runs: Sequence[Callable[[], float]], rounds: int, seed: int = 0,
    after_round: Callable[[int, list[list[float]]], None] | None = None,
) -> list[list[float]]:
    """Call every run (one timed unit of work each) once per round, in a seeded random order; each run's results.

    Interleaving lets a load change hit every variant alike; shuffling matters because what ran
    just before shows in a step's time (docs/performance.md, "Tools"). ``after_round(round, results)``
    is called after each round (a progress line for long benchmarks).
    """
    results: list[list[float]] = [[] for _ in runs]
    order, rng = list(range(len(runs))), random.Random(seed)
    for index in range(rounds):
        rng.shuffle(order)
        for i in order:
            results[i].append(runs[i]())
        if after_round is not None:
            after_round(index, results)
    return results


def median(values: Sequence[float]) -> float:
    """The median (robust to the occasional step disturbed by another process)."""
    return statistics.median(values)


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict[str, Any]:
    """Device name, torch version, CPU threads and the 1-minute load average at call time."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "device": device.type,
        "device_name": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_avg_1m": load,
    }


def describe_machine(info: dict[str, Any]) -> str:
    """One line from :func:`machine_info` (the load average says how shared the machine was)."""
    load = f", load avg {info['load_avg_1m']:.2f}" if info.get("load_avg_1m") is not None else ""
    return (
        f"{info['device']} ({info['device_name']}), torch {info['torch']}, "
        f"{info['threads']} threads / {info['cpus']} CPUs{load}"
    )


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """A Markdown table; ``right[i]`` right-aligns column i (numbers)."""
    right = right if right is not None else [False] * len(headers)
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if r else "---" for r in right) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ratio_table(kind: str, quantity: str, reference: tuple[str, Sequence[float]], other: tuple[str, Sequence[float]],
                versus: str) -> str:
    """Two things' seconds per round as a Markdown table: each median in ms, and the median and range over the
    rounds of other / reference (each pair from one round). ``kind`` heads the names, ``quantity`` the times."""
    ratios = [o / r for o, r in zip(other[1], reference[1])]
    return markdown_table(
        [kind, f"{quantity} (median)", f"vs {versus} (median of rounds)", "range"],
        [[reference[0], f"{1000 * median(reference[1]):.1f}", "1.000×", ""],
         [other[0], f"{1000 * median(other[1]):.1f}", f"{median(ratios):.3f}×",
          f"{min(ratios):.3f}–{max(ratios):.3f}"]],
        right=[False, True, True, True])


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children (a subprocess's cost, read before and after)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def long_short_steps(steps: str, rounds: int, example: str) -> tuple[int, int]:
    """The ``--steps LONG,SHORT`` of a whole-program benchmark (per iteration = (LONG run − SHORT run) /
    (LONG − SHORT), so start-up cancels), with its ``--rounds`` checked; a mistake is one UserError line."""
    try:
        long, short = (int(s) for s in steps.split(","))
    except ValueError:
        raise UserError(f"--steps {steps!r}: expected LONG,SHORT such as {example}") from None
    if not 1 <= short < long:
        raise UserError(f"--steps {steps!r}: need 1 <= SHORT < LONG")
    if rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {rounds}")
    return long, short


def _walk(events: list[Any]) -> Iterator[Any]:
    for event in events:
        yield event
        yield from _walk(event.children)


def measure_allocations(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """Run ``fn`` under the profiler: (its result, bytes allocated and not freed, peak bytes above the start).

    The garbage collector is paused: a collection inside would free earlier tensors, counted as ``fn``'s.
    """
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    gc.collect()
    gc.disable()
    try:
        # kineto prints a profiler_start/stop line on stderr at a level no environment variable
        # lowers: hidden around start and stop only, so whatever fn prints still shows.
        with _quiet_native_stderr():
            prof.start()
        try:
            result = fn()
        finally:
            with _quiet_native_stderr():
                prof.stop()
    finally:
        gc.enable()
    tree = prof.profiler.kineto_results.experimental_event_tree()
    events = [e for e in _walk(tree) if e.tag == _EventType.Allocation]
    events.sort(key=lambda e: e.start_time_ns)
    live = peak = 0
    for event in events:
        live += event.extra_fields.alloc_size  # negative for a free
        peak = max(peak, live)
    return result, live, peak


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (native code's stderr too) for the duration."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
