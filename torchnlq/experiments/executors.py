"""Where a suite's runs go: ``[executor]`` (and ``--executor.KEY VALUE``), and the ``pool`` executor.

``local`` (the default) is suite_run's one-after-another loop; ``pool`` runs N tasks at once on this machine,
each pinned to its own GPUs (``CUDA_VISIBLE_DEVICES``) or, without CUDA, to its share of the CPU threads
(``OMP_NUM_THREADS``); ``slurm`` submits them (experiments/slurm.py). A task is one command: a training run
(``run_train.sh ...``) or a sweep worker (experiments/sweep_worker.py). The format: docs/experiments.md,
"On a cluster".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TextIO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from torchnlq.errors import UserError, closest
from torchnlq.experiments import suite_log
from torchnlq.files import make_folder, open_append

EXECUTORS = ("local", "pool", "slurm")
#: Where a pool's or a SLURM job's task writes its output (a run's own train.log is in its folder).
LOGS_FOLDER = "logs"
#: Set in every task a SLURM job runs: the scheduler's SIGTERM reaches each of the job's processes itself, so a
#: sweep worker does not pass it on to its run (a second SIGTERM would stop the run at once instead of after a save).
SCHEDULER_SIGNALS_ENV = "TORCHNLQ_SCHEDULER_SIGNALS"


@dataclass(frozen=True)
class ExecutorConfig:
    """The ``[executor]`` table; keys for another executor than ``type`` are kept and ignored (a suite can carry
    its cluster settings and still run locally with ``--executor local``)."""

    type: str = "local"
    #: pool: tasks at once (default: one per GPU group, or 2 without CUDA); slurm: a sweep's worker jobs (default 2).
    workers: int | None = None
    #: GPUs of one run (pool: CUDA_VISIBLE_DEVICES of that many; slurm: --gres=gpu:N; 0: CPU runs); NGPU > 1
    #: runs torchrun.
    gpus_per_run: int = 1
    #: pool: the GPU indices to use (default: every visible GPU).
    devices: tuple[int, ...] | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    #: slurm: a job's time limit, as sbatch takes it (e.g. "4:00:00", "2-00:00:00").
    time: str | None = None
    cpus_per_run: int | None = None
    #: slurm: memory per job, as sbatch's --mem takes it (e.g. "64G").
    mem: str | None = None
    constraint: str | None = None
    #: slurm: seconds before the time limit at which the job is told to save and requeue (--signal=B:USR1@N).
    signal_seconds: int = 120
    #: slurm: more sbatch options, as written on its command line (e.g. ["--exclusive"]).
    sbatch_args: tuple[str, ...] = ()
    #: slurm: shell lines the job script runs first (e.g. ["module load cuda/12.4"]).
    setup: tuple[str, ...] = ()
    #: slurm: seconds between two looks at the queue with --wait.
    poll_seconds: int = 10


_POSITIVE = {"workers", "cpus_per_run", "signal_seconds", "poll_seconds"}
_STRINGS = {"partition", "account", "qos", "time", "mem", "constraint"}
KEYS = tuple(f.name for f in fields(ExecutorConfig))


def parse_option_value(text: str) -> Any:
    """A command-line value as TOML reads it (4, 1e-3, true, [0, 1], "x"), else the text itself (gpu, 4:00:00)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def split_table_options(argv: Sequence[str], tables: Sequence[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Take ``--TABLE.KEY VALUE`` / ``--TABLE.KEY=VALUE`` (and ``--executor NAME``) out of ``argv``: (the rest,
    ``{table: {key: value}}``); the rest are the runs' config overrides."""
    rest: list[str] = []
    found: dict[str, dict[str, Any]] = {t: {} for t in tables}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        table, dot, key = name.partition(".")
        if table in tables and (dot or table == "executor"):
            key = key if dot else "type"  # --executor slurm
            if not key:
                raise UserError(f"{arg}: name the key, e.g. --{table}.KEY=VALUE (see docs/experiments.md)")
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise UserError(f"--{name} needs a value (e.g. --{name}=VALUE)")
                value = args[i + 1]
                i += 1
            found[table][key] = parse_option_value(value)
        else:
            rest.append(arg)
        i += 1
    return rest, found


def check_keys(where: str, table: dict[str, Any], allowed: Sequence[str]) -> None:
    """An unknown key is one line with the closest allowed one."""
    for key in table:
        if key not in allowed:
            match = closest(key, allowed)
            hint = f"; did you mean '{match}'?" if match else f" (allowed: {', '.join(allowed)})"
            raise UserError(f"{where}: unknown key '{key}'{hint}")


def executor_config(where: str, table: dict[str, Any], options: dict[str, Any]) -> ExecutorConfig:
    """The suite's ``[executor]`` with the command line's ``--executor.KEY`` on top; every mistake one line."""
    merged = {**table, **options}
    check_keys(f"{where}: [executor]", merged, KEYS)
    values: dict[str, Any] = {}
    for key, value in merged.items():
        said = f"{where}: executor.{key} = {value!r}"
        if key == "type":
            if value not in EXECUTORS:
                match = closest(str(value), EXECUTORS)
                raise UserError(f"{said}: not an executor; choose {', '.join(EXECUTORS)}"
                                + (f" (did you mean '{match}'?)" if match else ""))
        elif key == "gpus_per_run":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{said} must be a number of GPUs (0: CPU runs)")
        elif key in _POSITIVE:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{said} must be a positive integer")
        elif key in _STRINGS:
            if not isinstance(value, str) or not value.strip():
                raise UserError(f"{said} must be a non-empty string")
        elif key == "devices":
            if not (isinstance(value, list) and value and all(isinstance(d, int) and not isinstance(d, bool)
                                                              and d >= 0 for d in value)):
                raise UserError(f"{said} must be a list of GPU indices such as [0, 1, 2, 3]")
            if len(set(value)) != len(value):
                raise UserError(f"{said} lists a GPU twice; each runs one task at a time")
            value = tuple(value)
        elif key in ("sbatch_args", "setup"):
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise UserError(f"{said} must be a list of strings")
            value = tuple(value)
        values[key] = value
    return ExecutorConfig(**values)


# ----- tasks and the pool ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One command an executor runs: a training run (``run_dir``/``steps`` tell when it is finished) or a sweep
    worker (no run folder of its own)."""

    name: str
    argv: tuple[str, ...]
    run_dir: str | None = None
    steps: int = 0
    #: Environment variables of this task alone (a sweep worker's index).
    env: tuple[tuple[str, str], ...] = ()
    #: What tells it to save and stop before a time limit: SIGTERM for a run, SIGUSR1 for a sweep worker (which
    #: passes SIGTERM on to its run; see sweep_worker).
    stop_signal: str = "SIGTERM"

    def log_path(self, dump_folder: Path) -> Path:
        """Where the task's output goes when no terminal shows it (pool, SLURM): ``<dump>/logs/<name>.out``."""
        return dump_folder / LOGS_FOLDER / f"{self.name}.out"


def usable_cpus() -> int:
    """The CPUs this process may run on (a SLURM allocation or taskset counts, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def pool_slots(config: ExecutorConfig) -> list[dict[str, str]]:
    """The environment of each of the pool's places: GPUs (``CUDA_VISIBLE_DEVICES``, ``NGPU``) or CPU threads."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if config.devices is not None:
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


def task_done(task: Task) -> bool:
    """A training task whose run has finished at its steps (a sweep worker never counts as done here)."""
    from torchnlq.experiments.suite import is_finished, read_run_info

    return task.run_dir is not None and is_finished(read_run_info(Path(task.run_dir)), task.steps)


def run_pool(tasks: Sequence[Task], slots: Sequence[dict[str, str]], dump_folder: Path,
             out: TextIO | None = None) -> tuple[list[str], str | None]:
    """Run ``tasks`` at most ``len(slots)`` at a time, each with its slot's environment and its output in
    ``<dump>/logs/``; finished training runs are skipped. Returns (failed task names, the signal that stopped the
    pool or None). SIGINT/SIGTERM go to every running task once (each saves and stops); no new task starts."""
    out = out or sys.stdout
    pending = [t for t in tasks if not task_done(t)]
    for task in tasks:
        if task not in pending:
            print(f"[pool] {task.name}: finished (skipped)", file=out, flush=True)
    free = list(range(len(slots)))
    running: dict[int, tuple[subprocess.Popen, Task, float, Any]] = {}
    failed: list[str] = []
    received: list[str] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        for proc, *_ in running.values():
            proc.send_signal(signum)

    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        make_folder(dump_folder / LOGS_FOLDER)
        while (pending and not received) or running:
            while pending and free and not received:
                task, slot = pending.pop(0), free.pop(0)
                log = open_append(task.log_path(dump_folder))
                env = {**os.environ, **slots[slot], **dict(task.env)}
                print(f"[pool] {task.name}: started on {_describe(slots[slot])}, output in "
                      f"{task.log_path(dump_folder)}", file=out, flush=True)
                suite_log.append(dump_folder, task.name, f"started executor=pool slot={slot}")
                proc = subprocess.Popen(list(task.argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
                running[slot] = (proc, task, time.perf_counter(), log)
            time.sleep(0.2)
            for slot, (proc, task, t0, log) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                log.close()
                seconds = time.perf_counter() - t0
                del running[slot]
                free.append(slot)
                stopped = f" stopped_by={received[0]}" if received else ""
                suite_log.append(dump_folder, task.name, f"exit={code} seconds={seconds:.1f} executor=pool{stopped}")
                print(f"[pool] {task.name}: exit {code} after {seconds:.0f}s", file=out, flush=True)
                if code != 0 and not received:
                    failed.append(task.name)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return failed, (received[0] if received else None)


def _describe(slot: dict[str, str]) -> str:
    if "CUDA_VISIBLE_DEVICES" in slot:
        return f"GPU {slot['CUDA_VISIBLE_DEVICES']}"
    return f"{slot['OMP_NUM_THREADS']} CPU thread(s)"
