"""Where a suite's runs go: the executor protocol, its registry, a Task, and the one way a child is spawned.

An executor is one class (experiments/pool.py: ``local`` and ``pool``; experiments/slurm.py: ``slurm``; a plugin's
own, registered with :func:`register_executor`): its ``Config`` dataclass is the ``[executor]`` table (declared with
``option()``, checked by the config machinery), and it implements what a suite and a sweep ask of it: run (or
submit) tasks, say which tasks it still holds, wait for them, and add to the dry run. A task is one command: a
training run (``run_train.sh ...``) or a sweep worker (experiments/sweep_worker.py). The format: docs/experiments.md,
"On a cluster"; a new executor: docs/extending.md, "A new executor".
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, TextIO

from torchnlq.config.job_config import option

#: Where a pool's or a SLURM job's task writes its output (a run's own train.log is in its folder).
LOGS_FOLDER = "logs"
#: Set in every task a SLURM job runs: the scheduler's SIGTERM reaches each of the job's processes itself, so a
#: sweep worker does not pass it on to its run (a second SIGTERM would stop the run at once instead of after a save).
SCHEDULER_SIGNALS_ENV = "TORCHNLQ_SCHEDULER_SIGNALS"


@dataclass(frozen=True)
class ExecutorConfig:
    """The ``[executor]`` keys every executor reads; an executor's own ``Config`` adds its keys. Keys of another
    executor than ``type`` are kept and ignored (a suite can carry its cluster settings and still run with
    ``--executor local``)."""

    type: str = option("local", "Where the runs go: an executor's name (docs/experiments.md, \"On a cluster\").",
                       registry="executors")
    workers: int | None = option(None, "Tasks at once (pool: default one per GPU group, or 2 without CUDA); slurm: a "
                                 "sweep's worker jobs (default 2).", min=1)
    gpus_per_run: int = option(1, "GPUs of one run (pool: CUDA_VISIBLE_DEVICES of that many; slurm: --gres=gpu:N; "
                               "0: CPU runs); NGPU > 1 runs torchrun.", min=0)


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

    def done(self) -> bool:
        """A training task whose run has finished at its steps (a sweep worker never counts as done here)."""
        from torchnlq.checkpoint.record import read_run_info
        from torchnlq.experiments.suite import is_finished

        return self.run_dir is not None and is_finished(read_run_info(Path(self.run_dir)), self.steps)


@dataclass(frozen=True)
class Outcome:
    """What :meth:`Executor.run` did: the tasks that failed, the signal that stopped it, and whether the tasks have
    ended (False: they were submitted and run on without this process)."""

    failed: tuple[str, ...] = ()
    stopped_by: str | None = None
    ended: bool = True


@dataclass(frozen=True)
class Activity:
    """A task an executor still holds: waiting for its resources (``queued``) or running, ``where`` (a job id)."""

    queued: bool
    where: str
    #: The executor's own word for the state, for a person ("pending", "running"), and why it waits.
    state: str
    reason: str = ""


class Executor:
    """The protocol: a subclass names itself (``name``), declares its ``[executor]`` keys (``Config``, a frozen
    dataclass extending :class:`ExecutorConfig`) and implements :meth:`run`; the rest has defaults that fit an
    executor whose :meth:`run` returns once its tasks have ended."""

    name: ClassVar[str]
    Config: ClassVar[type] = ExecutorConfig
    #: True when :meth:`run` returns once the tasks are submitted (``--wait`` then waits for them).
    submits: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        self.config = config

    def run(self, tasks: Sequence[Task], dump: Path, context: Mapping[str, Any], after_job: bool,
            out: TextIO) -> Outcome:
        """Run (or submit) the tasks that have not finished; ``context`` is what a submitted task needs to take the
        suite's next step (experiments/suite_run.py: advance), ``after_job`` that one just did."""
        raise NotImplementedError

    def check_ready(self) -> None:
        """Raise UserError when this machine cannot run the executor (its scheduler's tools missing), before the
        suite creates anything; the dry run and ``--status`` do not ask. Default: always ready."""

    def sweep_workers(self) -> int:
        """How many sweep workers to start."""
        return 1

    def alive(self, dump: Path, names: Sequence[str]) -> dict[str, Activity]:
        """The tasks of ``names`` this executor still holds (a UserError when it cannot tell)."""
        return {}

    def wait(self, dump: Path, names: Sequence[str], out: TextIO) -> None:
        """Return when no task of ``names`` is held any more (``--wait``)."""

    def plan(self, suite_name: str, dump: Path, count: int) -> str:
        """What the dry run adds for ``count`` tasks (a job script), or ""."""
        return ""


EXECUTORS: dict[str, type[Executor]] = {}


def register_executor(cls: type[Executor]) -> type[Executor]:
    """Make ``cls`` an ``[executor] type`` (a class decorator; a plugin module does it on import)."""
    EXECUTORS[cls.name] = cls
    return cls


# ----- spawning a child and passing signals on ----------------------------------------------------------------

#: What a :class:`Children` passes on for a signal it received: a signal to send its children, or None.
Translate = Callable[[signal.Signals, "Children"], "signal.Signals | None"]


@dataclass
class Children:
    """Children in their own sessions (a terminal's Ctrl-C reaches only this process) with the signals this process
    receives passed on: ``with Children() as kids: proc = kids.start(argv)``.

    The handlers are installed before any child starts: a signal in between would otherwise end this process by
    Python's default handler while the child, in its own session, kept going; a signal before a child exists is
    sent to it when it starts. ``translate`` says what a signal becomes for the children (None: nothing is sent).
    """

    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
    translate: Translate | None = None  # unset: each signal passed on as it came
    received: list[str] = field(default_factory=list)
    running: list[subprocess.Popen] = field(default_factory=list)
    _pending: list[signal.Signals] = field(default_factory=list)
    _previous: dict[Any, Any] = field(default_factory=dict)

    def __enter__(self) -> Children:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in self.signals}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        sig = signal.Signals(signum)
        send = self.translate(sig, self) if self.translate is not None else sig
        self.received.append(sig.name)
        live = [p for p in self.running if p.poll() is None]
        if send is not None:
            for proc in live:
                proc.send_signal(send)
            if not live:
                self._pending.append(send)

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None, log: IO[str] | None = None,
              ) -> subprocess.Popen:
        """Start ``argv`` (its output to ``log``, or this process's own terminal without one)."""
        quiet = {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL} if log is not None else {}
        proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, start_new_session=True,
                                **quiet)
        self.running.append(proc)
        for send in self._pending:
            proc.send_signal(send)
        self._pending.clear()
        return proc


def task_env(task: Task, slot: Mapping[str, str] = {}) -> dict[str, str]:  # noqa: B006 - read only
    """The environment of a task: this process's, the slot's (GPUs, threads) and the task's own."""
    return {**os.environ, **slot, **dict(task.env)}
