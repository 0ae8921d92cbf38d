"""The executors of this machine: ``pool`` runs N tasks at once, each pinned to its own GPUs
(``CUDA_VISIBLE_DEVICES``) or, without CUDA, to its share of the CPU threads (``OMP_NUM_THREADS``), each task's
output in ``<dump>/logs/``; ``local`` (the default) is a pool of one place that streams to the terminal and
passes ``NGPU`` through. A signal (Ctrl-C, SIGTERM) goes to every running task once; each saves and stops, and no
new task starts.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from torchnlq.config.job_config import option
from torchnlq.errors import UserError
from torchnlq.experiments import suite_log
from torchnlq.experiments.executors import (
    LOGS_FOLDER,
    Children,
    Executor,
    ExecutorConfig,
    Outcome,
    Task,
    register_executor,
    task_env,
)
from torchnlq.files import make_folder, open_append


@dataclass(frozen=True)
class PoolConfig(ExecutorConfig):
    """``[executor]`` of the pool."""

    devices: list[int] | None = option(None, "pool: the GPU indices to use (default: every visible GPU).", min=0)


def usable_cpus() -> int:
    """The CPUs this process may run on (a SLURM allocation or taskset counts, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def pool_slots(config: PoolConfig) -> list[dict[str, str]]:
    """The environment of each of the pool's places: GPUs (``CUDA_VISIBLE_DEVICES``, ``NGPU``) or CPU threads."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if config.devices is not None:
        if len(set(config.devices)) != len(config.devices):
            raise UserError(f"executor.devices = {config.devices} lists a GPU twice; each runs one task at a time")
        missing = [d for d in config.devices if d >= gpus]
        if missing:
            raise UserError(f"executor.devices lists GPU {missing[0]}, but this machine shows {gpus} CUDA device(s); "
                            "list the GPUs it has (or leave devices out to use all of them)")
    if gpus and config.gpus_per_run:
        devices = list(config.devices if config.devices is not None else range(gpus))
        size = config.gpus_per_run
        if size > len(devices):
            raise UserError(f"executor.gpus_per_run = {size} but only {len(devices)} GPU(s) are available to the pool")
        groups = [devices[i:i + size] for i in range(0, len(devices) - size + 1, size)]
        groups = groups[: config.workers or len(groups)]
        if config.workers and config.workers > len(groups):
            raise UserError(f"executor.workers = {config.workers} needs {config.workers * size} GPUs "
                            f"({size} per run), and the pool has {len(devices)}")
        return [{"CUDA_VISIBLE_DEVICES": ",".join(map(str, g)), "NGPU": str(size)} for g in groups]
    if config.gpus_per_run > 1 and not gpus:
        raise UserError(f"executor.gpus_per_run = {config.gpus_per_run} but this machine has no CUDA device")
    workers = config.workers or 2
    threads = max(1, usable_cpus() // workers)
    return [{"OMP_NUM_THREADS": str(threads), "NGPU": "1"} for _ in range(workers)]


def run_pool(name: str, tasks: Sequence[Task], slots: Sequence[Mapping[str, str]], dump: Path, out: TextIO,
             stream: bool = False) -> Outcome:
    """Run ``tasks`` at most ``len(slots)`` at a time, each with its slot's environment and its output in
    ``<dump>/logs/`` (``stream``: on this terminal); finished training runs are skipped."""
    pending = [t for t in tasks if not t.done()]
    for task in tasks:
        if task not in pending:
            print(f"[{name}] {task.name}: finished (skipped)", file=out, flush=True)
    free = list(range(len(slots)))
    running: dict[int, tuple[Any, Task, float, Any]] = {}
    failed: list[str] = []
    if not stream:
        make_folder(dump / LOGS_FOLDER)
    with Children() as children:
        received = children.received
        while (pending and not received) or running:
            while pending and free and not received:
                task, slot = pending.pop(0), free.pop(0)
                log = None if stream else open_append(task.log_path(dump))
                where = f"$ {shlex.join(task.argv)}" if stream else f"on {_describe(slots[slot])}, output in " \
                                                                    f"{task.log_path(dump)}"
                print(f"[{name}] {task.name}: started {where}", file=out, flush=True)
                suite_log.append(dump, task.name, f"started executor={name} slot={slot}")
                running[slot] = (children.start(task.argv, task_env(task, slots[slot]), log), task,
                                 time.perf_counter(), log)
            time.sleep(0.2)
            for slot, (proc, task, t0, log) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                if log is not None:
                    log.close()
                seconds = time.perf_counter() - t0
                del running[slot]
                free.append(slot)
                stopped = f" stopped_by={received[0]}" if received else ""
                suite_log.append(dump, task.name, f"exit={code} seconds={seconds:.1f} executor={name}{stopped}")
                print(f"[{name}] {task.name}: exit {code} after {seconds:.0f}s", file=out, flush=True)
                if code != 0 and not received:
                    failed.append(task.name)
    return Outcome(tuple(failed), received[0] if received else None)


def _describe(slot: Mapping[str, str]) -> str:
    if "CUDA_VISIBLE_DEVICES" in slot:
        return f"GPU {slot['CUDA_VISIBLE_DEVICES']}"
    return f"{slot['OMP_NUM_THREADS']} CPU thread(s)"


@register_executor
class Pool(Executor):
    """``pool``: several tasks at once on this machine (``workers``, ``gpus_per_run``, ``devices``)."""

    name = "pool"
    Config = PoolConfig

    def run(self, tasks: Sequence[Task], dump: Path, context: Mapping[str, Any], after_job: bool,
            out: TextIO) -> Outcome:
        return run_pool(self.name, tasks, pool_slots(self.config), dump, out)

    def sweep_workers(self) -> int:
        return len(pool_slots(self.config))


@register_executor
class Local(Executor):
    """``local``: one task after another in this process tree, on this terminal (``NGPU`` passes through)."""

    name = "local"

    def run(self, tasks: Sequence[Task], dump: Path, context: Mapping[str, Any], after_job: bool,
            out: TextIO) -> Outcome:
        sys.stdout.flush()  # the suite's lines before the task's own
        return run_pool(self.name, tasks, [{}], dump, out, stream=True)
