"""The ``slurm`` executor: a suite's tasks as one job array, submitted with sbatch, read back with squeue.

sbatch itself rather than a Python submission library: each task is already a shell command (run_train.sh, a
sweep worker), the job script stays a file a user can read and resubmit, nothing is pickled, and the queue's
states come from squeue (no accounting database needed; ``sacct`` fails without one).

Each array task runs ``python -m torchnlq.experiments.slurm_job MANIFEST`` (the manifest lists the tasks), submitted
``--requeue --signal=B:USR1@<signal_seconds>``; what the job does on that signal and on ``scancel``: slurm_job's
docstring.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from torchnlq.config.job_config import option
from torchnlq.errors import UserError
from torchnlq.experiments import suite_log
from torchnlq.experiments.executors import (
    LOGS_FOLDER,
    Activity,
    Executor,
    ExecutorConfig,
    Outcome,
    Task,
    register_executor,
)
from torchnlq.files import make_folder, no_folder_left_on_failure, replace_file

SLURM_FOLDER = "slurm"
COMMANDS = ("sbatch", "squeue", "scontrol")
#: States in which a job still holds (or waits for) the cluster: its run is not to be submitted again.
ALIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
         "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT")
#: How long a scheduler command may take before the controller counts as down.
COMMAND_TIMEOUT = 120


@dataclass(frozen=True)
class SlurmConfig(ExecutorConfig):
    """``[executor]`` of SLURM: what sbatch is asked for."""

    partition: str | None = option(None, "slurm: sbatch --partition.")
    account: str | None = option(None, "slurm: sbatch --account.")
    qos: str | None = option(None, "slurm: sbatch --qos.")
    time: str | None = option(None, "slurm: a job's time limit, as sbatch takes it (e.g. \"4:00:00\", \"2-00:00:00\").")
    cpus_per_run: int | None = option(None, "slurm: sbatch --cpus-per-task.", min=1)
    mem: str | None = option(None, "slurm: memory per job, as sbatch's --mem takes it (e.g. \"64G\").")
    constraint: str | None = option(None, "slurm: sbatch --constraint.")
    signal_seconds: int = option(120, "slurm: seconds before the time limit at which the job is told to save and "
                                 "requeue (--signal=B:USR1@N).", min=1)
    sbatch_args: list[str] = option([], "slurm: more sbatch options, as written on its command line (e.g. "
                                    "[\"--exclusive\"]).")
    setup: list[str] = option([], "slurm: shell lines the job script runs first (e.g. [\"module load cuda/12.4\"]).")
    poll_seconds: int = option(10, "slurm: seconds between two looks at the queue with --wait.", min=1)


def require_slurm() -> None:
    """One line when SLURM's commands are not on PATH."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        raise UserError(f"the slurm executor needs SLURM's {', '.join(missing)} on PATH (not found): run the suite on "
                        "a cluster's login node, or choose --executor local or pool")


def _scheduler(args: Sequence[str], what: str) -> str:
    """Run a SLURM command; its refusal (a bad partition, a controller that is down) is one line quoting it."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UserError(f"{what}: {args[0]} gave no answer in {COMMAND_TIMEOUT} s (is slurmctld up?); nothing was "
                        "submitted") from None
    except OSError as e:
        raise UserError(f"{what}: could not run {args[0]} ({e.strerror})") from None
    if done.returncode != 0:
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()] or [f"exit code {done.returncode}"]
        raise UserError(f"{what}: {args[0]} said: {said[-1]}")
    return done.stdout


def job_script(config: SlurmConfig, name: str, manifest: Path, count: int, dump: Path) -> str:
    """The batch script of an array of ``count`` tasks (kept beside the manifest: ``sbatch`` it again by hand)."""
    import torchnlq

    options = [f"--job-name={name}", f"--array=0-{count - 1}", f"--output={dump.resolve() / SLURM_FOLDER}/%A_%a.out",
               "--open-mode=append", "--requeue", f"--signal=B:USR1@{config.signal_seconds}", "--ntasks=1",
               f"--chdir={Path.cwd()}"]
    asked = {key: getattr(config, key) for key in ("partition", "account", "qos", "time", "mem", "constraint")}
    asked |= {"cpus-per-task": config.cpus_per_run or None,
              "gres": f"gpu:{config.gpus_per_run}" if config.gpus_per_run else None}
    options += [f"--{key}={value}" for key, value in asked.items() if value is not None]
    options += config.sbatch_args
    source = Path(torchnlq.__file__).resolve().parents[1]  # the jobs import this torchnlq (a checkout, or installed)
    lines = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(o)}" for o in options), "", *config.setup,
             f"export PYTHONPATH={shlex.quote(str(source))}${{PYTHONPATH:+:$PYTHONPATH}}",
             f"export NGPU={max(1, config.gpus_per_run)}",
             f"exec {shlex.quote(sys.executable)} -m torchnlq.experiments.slurm_job {shlex.quote(str(manifest))}"]
    return "\n".join(lines) + "\n"


def submit(tasks: Sequence[Task], config: SlurmConfig, dump: Path, name: str, context: dict[str, Any],
           out: TextIO) -> str:
    """Submit ``tasks`` as one array; returns its job id. A refusal is one line and leaves nothing submitted or
    written (the manifest and script are removed, and the folders made for them when still empty)."""
    require_slurm()
    with no_folder_left_on_failure(dump / SLURM_FOLDER), no_folder_left_on_failure(dump / LOGS_FOLDER):
        make_folder(dump / SLURM_FOLDER)
        make_folder(dump / LOGS_FOLDER)
        n = 1
        while (dump / SLURM_FOLDER / f"submit-{n}.json").exists():
            n += 1
        manifest, script = dump / SLURM_FOLDER / f"submit-{n}.json", dump / SLURM_FOLDER / f"submit-{n}.sbatch"
        replace_file(manifest, json.dumps({**context, "dump_folder": str(dump), "cwd": str(Path.cwd()),
                                           "tasks": [asdict(t) for t in tasks]}, indent=1))
        replace_file(script, job_script(config, name, manifest.resolve(), len(tasks), dump))
        try:
            said = _scheduler(["sbatch", "--parsable", str(script)], f"submitting {len(tasks)} job(s) of {name}")
        except UserError as e:
            manifest.unlink(missing_ok=True)
            script.unlink(missing_ok=True)
            raise UserError(f"{e}; nothing was submitted") from None
    job = said.strip().split(";")[0]
    for i, task in enumerate(tasks):
        suite_log.append(dump, task.name, f"submitted job={job}_{i} executor=slurm")
    print(f"[slurm] submitted {len(tasks)} job(s) as array {job} ({script}); outputs in {dump / LOGS_FOLDER}/",
          file=out, flush=True)
    return job


def alive_jobs(dump: Path, names: Sequence[str]) -> dict[str, Activity]:
    """The runs (or workers) of ``names`` whose latest submission is still queued or running."""
    records = suite_log.read_records(dump)
    latest = {n: next((r.fields["job"] for r in reversed(records.get(n, [])) if "submitted" in r.fields), None)
              for n in names}
    if not any(latest.values()):
        return {}
    require_slurm()
    # This user's jobs in the queue (array tasks one by one): {"123_0": (state, reason)}.
    text = _scheduler(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T|%r"], "reading the queue")
    rows = [line.strip().split("|") for line in text.splitlines()]
    states = {job: (state, reason) for job, state, reason in (row for row in rows if len(row) == 3)}
    alive = {n: (job, *states[job]) for n, job in latest.items() if job and states.get(job, ("",))[0] in ALIVE}
    return {n: Activity(state == "PENDING", f"job {job}", state.lower(), reason if state == "PENDING" else "")
            for n, (job, state, reason) in alive.items()}


def requeue(job: str) -> None:
    """Put the job back in the queue (from inside it: the wrapper after a pre-timeout signal)."""
    _scheduler(["scontrol", "requeue", job], f"requeueing job {job}")


def this_job() -> str:
    """The id of the job (array task ``A_i``) this process runs in."""
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{index}" if array and index else os.environ.get("SLURM_JOB_ID", "?")


@register_executor
class Slurm(Executor):
    """``slurm``: the tasks as one job array; it submits and returns, and the last job to end takes the suite's next
    step (experiments/slurm_job.py)."""

    name = "slurm"
    Config = SlurmConfig
    submits = True

    def run(self, tasks: Sequence[Task], dump: Path, context: Mapping[str, Any], after_job: bool,
            out: TextIO) -> Outcome:
        """Submit the tasks that have not finished, are not queued or running, and (``after_job``: a job's next
        step) were never submitted (a failed run waits for the user's command); a refusal leaves nothing."""
        new = not dump.exists()
        with no_folder_left_on_failure(dump):  # refused: the folders made for the lock go again
            try:
                with suite_log.suite_lock(dump):  # two jobs ending at once submit the next stage once
                    todo = [t for t in tasks if not t.done()]
                    alive = alive_jobs(dump, [t.name for t in todo]) if todo else {}
                    records = suite_log.read_records(dump) if after_job else {}  # after a job: only the never-submitted
                    todo = [t for t in todo if t.name not in alive
                            and not any("submitted" in r.fields for r in records.get(t.name, []))]
                    if todo:
                        submit(todo, self.config, dump, str(context.get("name", dump.name)), dict(context), out)
            except UserError:
                if new:  # the lock file is all a refused first submission wrote
                    (dump / suite_log.LOCK_NAME).unlink(missing_ok=True)
                raise
        return Outcome(ended=False)

    def check_ready(self) -> None:
        require_slurm()

    def sweep_workers(self) -> int:
        return self.config.workers or 2

    def alive(self, dump: Path, names: Sequence[str]) -> dict[str, Activity]:
        return alive_jobs(dump, names)

    def wait(self, dump: Path, names: Sequence[str], out: TextIO) -> None:
        """Return when no job of ``names`` is queued or running; prints each change of state."""
        seen: dict[str, str] = {}
        quiet = 0
        while quiet < 2:  # twice in a row: a job that ended may just have submitted the next stage
            alive = alive_jobs(dump, names)
            for name, activity in alive.items():
                if seen.get(name) != activity.state:
                    print(f"[slurm] {name}: {activity.where} {activity.state}", file=out, flush=True)
                    seen[name] = activity.state
            quiet = 0 if alive else quiet + 1
            time.sleep(self.config.poll_seconds if alive else 1)

    def plan(self, suite_name: str, dump: Path, count: int) -> str:
        script = job_script(self.config, suite_name, dump / SLURM_FOLDER / "submit-N.json", count, dump)
        return f"# the job script (--executor {self.name})\n{script}"
