"""Inside a SLURM job: ``python -m torchnlq.experiments.slurm_job MANIFEST`` (what the job script of
experiments/slurm.py runs; not a command for users).

It runs its array task's command (its output appended to ``<dump>/logs/<task>.out``), records the start and the
end in suite.log with the job id, and:

- on SIGUSR1 (``--signal=B:USR1@N``: the time limit is near) tells the task to save and stop, then requeues the
  job when the task stopped cleanly before its end (the requeued job resumes it);
- on SIGTERM/SIGINT (``scancel``, which signals every process of the job) waits for the task, which got the
  signal too and saves; nothing is requeued;
- when the task ended by itself, takes the suite's next step as run_suite.py would without resubmitting anything
  that ran: the comparison once every run has finished, a sweep's best configs and reruns once its studies are done.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from torchnlq.cli import run_cli
from torchnlq.errors import UserError
from torchnlq.experiments import slurm, suite_log
from torchnlq.experiments.executors import SCHEDULER_SIGNALS_ENV, Children, Task, task_env
from torchnlq.files import make_folder, open_append, read_json


def run_task(task: Task, log: Path) -> tuple[int, list[str]]:
    """Run the task; returns its exit code and the signals this job received meanwhile (in order).

    Only the first SIGUSR1 is passed on (as the task's stop signal); scancel's SIGTERM/SIGINT reach the task
    from the scheduler itself."""

    def translate(sig: signal.Signals, children: Children) -> signal.Signals | None:
        first_stop = sig == signal.SIGUSR1 and "SIGUSR1" not in children.received
        return signal.Signals[task.stop_signal] if first_stop else None

    make_folder(log.parent)
    with Children((signal.SIGUSR1, signal.SIGTERM, signal.SIGINT), translate) as children, open_append(log) as out:
        code = children.start(task.argv, {**task_env(task), SCHEDULER_SIGNALS_ENV: "1"}, out).wait()
    return code, children.received


def _task(manifest: dict[str, Any], index: int, path: Path) -> Task:
    tasks = manifest.get("tasks")
    if not isinstance(tasks, list) or not 0 <= index < len(tasks) or not isinstance(tasks[index], dict):
        raise UserError(f"{path} has no task {index}; it is written by run_suite.py: submit the suite again")
    raw = tasks[index]
    return Task(str(raw["name"]), tuple(raw["argv"]), raw.get("run_dir"), int(raw.get("steps", 0)),
                tuple(tuple(pair) for pair in raw.get("env", ())), str(raw.get("stop_signal", "SIGTERM")))


def main(argv: list[str]) -> int:
    """Run this array task's command, then requeue or take the suite's next step."""
    if len(argv) != 1:
        raise UserError("usage: python -m torchnlq.experiments.slurm_job MANIFEST (run by a job script)")
    path = Path(argv[0])
    manifest = read_json(path, "a submission manifest", "it is written by run_suite.py: submit the suite again")
    if not isinstance(manifest, dict):
        raise UserError(f"{path} is not a submission manifest; submit the suite again")
    task = _task(manifest, int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")), path)
    dump, job = Path(manifest["dump_folder"]), slurm.this_job()
    if task.done():
        suite_log.append(dump, task.name, f"job={job} already finished")
    else:
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        suite_log.append(dump, task.name, f"job={job} started host={socket.gethostname()} restart={restarts}")
        t0 = time.perf_counter()
        code, received = run_task(task, task.log_path(dump))
        seconds = time.perf_counter() - t0
        done = task.done() if task.run_dir else (code == 0 and not received)
        again = "SIGUSR1" in received and code == 0 and not done
        state = ("requeued" if again else "finished" if done else "stopped" if received
                 else "failed" if code else "ended")
        stopped = f" stopped_by={received[0]}" if received else ""
        suite_log.append(dump, task.name, f"job={job} exit={code} seconds={seconds:.1f} state={state}{stopped}")
        if again:
            slurm.requeue(job)
            print(f"[slurm] {task.name}: saved and requeued before the time limit", flush=True)
            return 0
        if received or code != 0:
            return code
    from torchnlq.experiments.suite_run import advance_after_job

    try:
        advance_after_job(manifest)
    except UserError as e:  # the task itself went fine: its exit code stays 0, the suite's log says why
        suite_log.append(dump, task.name, f"job={job} next_step_failed")
        print(f"[slurm] the suite's next step did not start: {e}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
