"""``run_suite.py SUITE --status``: each run's state from its folder, suite.log and the scheduler; writes nothing.

A run is ``new``, ``queued`` (its SLURM job waits: the scheduler's reason), ``running at step N`` (its job runs,
or a trainer holds its folder's lock), ``finished``, ``failed`` (with its output's last line), or ``interrupted
at step N`` (resumed by the same command). A sweep adds each study's trials by state and its best so far.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from torchnlq.checkpoint.record import read_run_info
from torchnlq.errors import UserError
from torchnlq.experiments import suite_log
from torchnlq.experiments.executors import LOGS_FOLDER, Activity, Executor
from torchnlq.experiments.suite import Suite, SuiteRun, display_path, interrupted, is_finished, logged_step
from torchnlq.experiments.suite_log import last_line
from torchnlq.experiments.sweep import Sweep, counted_trials, describe, run_number
from torchnlq.train.run_lock import RunLock

def _locked(run_dir: Path) -> bool:
    try:
        RunLock(run_dir).check_free()
        return False
    except UserError:
        return True


def run_state(run: SuiteRun, run_dir: Path, records: list[suite_log.Record], activity: Activity | None,
              dump: Path) -> str:
    """One phrase for one run (see the module's docstring); ``activity``: what its executor says of it."""
    info = read_run_info(run_dir)
    if is_finished(info, run.steps):
        return "finished"
    at = logged_step(run_dir)
    if activity is not None and activity.queued:
        return f"queued ({activity.where}" + (f": {activity.reason})" if activity.reason else ")")
    if activity is not None or _locked(run_dir):
        where = f" ({activity.where})" if activity is not None else ""
        return f"running at step {at}{where}" if at is not None else f"running, starting{where}"
    end = next((r for r in reversed(records) if "exit" in r.fields), None)
    if end is not None and end.fields["exit"] != "0" and "stopped_by" not in end.fields:
        said = last_line(dump / LOGS_FOLDER / f"{run.name}.out") or last_line(run_dir / "train.log")
        return f"failed (exit {end.fields['exit']}): {said}"
    if info is not None:
        return interrupted(run_dir, info, run.steps)
    return "new"


def held_tasks(executor: Executor, dump: Path, names: list[str], out: TextIO) -> dict[str, Activity]:
    """What the executor still holds of ``names`` (when it cannot tell: the folders alone, said once)."""
    try:
        return executor.alive(dump, names)
    except UserError as e:
        print(f"# without the {executor.name} executor's view ({e}): states from the run folders only", file=out)
        return {}


def print_status(suite: Suite, sweep: Sweep | None, executor: Executor, out: TextIO,
                 tuned: Suite | None = None) -> bool:
    """Print the suite's state; True when everything it runs has finished (its comparison can be written)."""
    lines = [f"# suite {suite.name} ({display_path(suite.dump_folder)}), executor {executor.name}"]
    finished = sweep is None or sweep.done(create=False)
    if sweep is not None:
        workers = sorted(n for n in suite_log.read_records(sweep.dump) if n.startswith("worker-"))
        lines += _sweep_lines(sweep, held_tasks(executor, sweep.dump, workers, out) if workers else {})
    runs = suite if sweep is None else tuned  # a sweep's runs are its reruns, once its studies are done
    if runs is not None:
        alive = held_tasks(executor, runs.dump_folder, [r.name for r in runs.runs], out)
        records = suite_log.read_records(runs.dump_folder)
        states = {r.name: run_state(r, runs.run_dir(r), records.get(r.name, []), alive.get(r.name), runs.dump_folder)
                  for r in runs.runs}
        width = max(map(len, states))
        lines += [f"{name:<{width}}  {state}" for name, state in states.items()]
        finished = finished and all(s == "finished" for s in states.values())
    elif finished and not sweep.spec.rerun_seeds:  # a sweep (runs is the suite otherwise)
        lines.append("(no rerun_seeds: the best configs are the result; nothing is compared)")
    print("\n".join(lines), file=out, flush=True)
    return finished


def _sweep_lines(sweep: Sweep, workers: dict[str, Activity]) -> list[str]:
    import optuna

    lines = [f"# sweep: {sweep.spec.trials} trials per arm, {sweep.spec.sampler} sampler, {sweep.spec.pruner} pruner, "
             f"storage {sweep.storage_url}"]
    lines += [f"{name}: {activity.where} {activity.state}" for name, activity in sorted(workers.items())]
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
            at = logged_step(sweep.trial_dir(arm, run_number(trial)))
            lines.append(f"  trial {trial.number}: running" + (f" at step {at}" if at is not None else ""))
    return lines
