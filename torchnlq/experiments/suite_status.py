"""``run_suite.py SUITE --status``: each run's state from its folder, suite.log and the scheduler; writes nothing.

A run is ``new``, ``queued`` (its SLURM job waits: the scheduler's reason), ``running at step N`` (its job runs,
or a trainer holds its folder's lock), ``finished``, ``failed`` (with its output's last line), or ``interrupted
at step N`` (resumed by the same command). A sweep adds each study's trials by state and its best so far.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TextIO

from torchnlq.errors import UserError
from torchnlq.experiments import suite_log
from torchnlq.experiments.executors import LOGS_FOLDER, ExecutorConfig
from torchnlq.experiments.suite import Suite, SuiteRun, display_path, is_finished, read_run_info
from torchnlq.experiments.sweep import Sweep, counted_trials, run_number
from torchnlq.experiments.sweep_worker import describe, last_line
from torchnlq.train.run_lock import RunLock

_STEP_LINE = re.compile(rb"step\s+(\d+)/(\d+)")


def current_step(run_dir: Path) -> int | None:
    """The last step train.log reports (None before the first)."""
    try:
        with (run_dir / "train.log").open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 65536))
            steps = _STEP_LINE.findall(f.read())
    except OSError:
        return None
    return int(steps[-1][0]) if steps else None


def _locked(run_dir: Path) -> bool:
    try:
        RunLock(run_dir).check_free()
        return False
    except UserError:
        return True


def run_state(run: SuiteRun, run_dir: Path, records: list[suite_log.Record], queue: dict[str, tuple[str, str]],
              dump: Path) -> str:
    """One phrase for one run (see the module's docstring)."""
    info = read_run_info(run_dir)
    if is_finished(info, run.steps):
        return "finished"
    job = next((r.fields["job"] for r in reversed(records) if "submitted" in r.fields), None)
    state, reason = queue.get(job, ("", "")) if job else ("", "")
    at = current_step(run_dir)
    if state == "PENDING":
        return f"queued (job {job}: {reason})"
    if state or _locked(run_dir):
        where = f" (job {job})" if state else ""
        return f"running at step {at}{where}" if at is not None else f"running, starting{where}"
    end = next((r for r in reversed(records) if "exit" in r.fields), None)
    if end is not None and end.fields["exit"] != "0" and "stopped_by" not in end.fields:
        said = last_line(dump / LOGS_FOLDER / f"{run.name}.out") or last_line(run_dir / "train.log")
        return f"failed (exit {end.fields['exit']}): {said}"
    if info is not None:
        return f"interrupted at step {info.get('step', at or 0)}/{run.steps} (the same command resumes it)"
    return "new"


def suite_states(suite: Suite, queue: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Every run's state phrase, by name."""
    records = suite_log.read_records(suite.dump_folder)
    return {run.name: run_state(run, suite.run_dir(run), records.get(run.name, []), queue, suite.dump_folder)
            for run in suite.runs}


def read_queue(executor: ExecutorConfig, out: TextIO) -> dict[str, tuple[str, str]]:
    """The scheduler's view when the suite runs on SLURM (its commands missing: the folders alone, said once)."""
    if executor.type != "slurm":
        return {}
    from torchnlq.experiments import slurm

    try:
        return slurm.queue_states()
    except UserError as e:
        print(f"# without the queue ({e}): states from the run folders only", file=out)
        return {}


def print_status(suite: Suite, sweep: Sweep | None, executor: ExecutorConfig, out: TextIO,
                 tuned: Suite | None = None) -> bool:
    """Print the suite's state; True when everything it runs has finished (its comparison can be written)."""
    queue = read_queue(executor, out)
    lines = [f"# suite {suite.name} ({display_path(suite.dump_folder)}), executor {executor.type}"]
    finished = True
    if sweep is not None:
        finished = sweep.done(create=False)
        lines += _sweep_lines(sweep, queue)
        runs_suite = tuned
    else:
        runs_suite = suite
    if runs_suite is not None:
        states = suite_states(runs_suite, queue)
        width = max(map(len, states))
        lines += [f"{name:<{width}}  {state}" for name, state in states.items()]
        finished = finished and all(s == "finished" for s in states.values())
    elif sweep is not None and finished and not sweep.spec.rerun_seeds:
        lines.append("(no rerun_seeds: the best configs are the result; nothing is compared)")
    print("\n".join(lines), file=out, flush=True)
    return finished


def _sweep_lines(sweep: Sweep, queue: dict[str, tuple[str, str]]) -> list[str]:
    import optuna

    lines = [f"# sweep: {sweep.spec.trials} trials per arm, {sweep.spec.sampler} sampler, {sweep.spec.pruner} pruner, "
             f"storage {sweep.storage_url}"]
    records = suite_log.read_records(sweep.dump)
    workers = sorted(n for n in records if n.startswith("worker-"))
    for name in workers:
        job = next((r.fields["job"] for r in reversed(records[name]) if "submitted" in r.fields), None)
        if job and job in queue:
            lines.append(f"{name}: job {job} {queue[job][0].lower()}")
    for arm in sweep.arms:
        study = sweep.study(arm, create=False)
        trials = counted_trials(study) if study is not None else []  # a retried attempt gives way to its retry
        said = ", ".join(f"{n} {s.lower()}" for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
                         if (n := sum(t.state.name == s for t in trials)))
        line = f"{arm.name}: {len(trials)}/{sweep.spec.trials} trials ({said or 'none yet'})"
        done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        if done:
            best = min(done, key=lambda t: (t.value, t.number))
            line += f"; best {best.value:.4f} (trial {best.number}: {describe(best.params)})"
        lines.append(line)
        for trial in (t for t in trials if t.state == optuna.trial.TrialState.RUNNING):
            at = current_step(sweep.trial_dir(arm, run_number(trial)))
            lines.append(f"  trial {trial.number}: running" + (f" at step {at}" if at is not None else ""))
    return lines
