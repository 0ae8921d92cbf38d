"""Run a suite: each run through run_train.sh, one after another, then the comparison.

A failed run is reported and the suite goes on (one bad arm should not cost the night's other runs).
Ctrl-C or SIGTERM is passed to the running trainer, which checkpoints and exits; then the suite stops.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.experiments import suite_log
from torchnlq.experiments.executors import (
    ExecutorConfig,
    Task,
    executor_config,
    pool_slots,
    run_pool,
    split_table_options,
)
from torchnlq.experiments.suite import (
    Suite,
    SuiteRun,
    display_path,
    is_finished,
    launcher_command,
    load_suite,
    read_run_info,
    run_status,
)
from torchnlq.experiments.sweep import Sweep, parse_sweep, sweep_plan

USAGE = """usage: run_suite.py SUITE.toml [--dry-run | --status] [--no-compare] [--wait] [--executor local|pool|slurm]
                    [--executor.KEY VALUE ...] [--sweep.KEY VALUE ...] [--section.key value ...]

Train every run of a suite with run_train.sh, skipping finished runs and resuming interrupted ones, then
compare them into the suite's folder; a suite with a [sweep] first searches each arm with Optuna.
  --dry-run      print the commands, the budget in GPU-hours (a sweep's: every trial to its end) and, for slurm,
                 the job script; do nothing else
  --status       each run's state (new, queued, running at step N, finished, failed, interrupted) and each
                 study's trials; writes the comparison when everything has finished
  --no-compare   skip the comparison at the end
  --executor     where the runs go (default: the suite's [executor] type, else local):
                   local  one after another in this process tree (NGPU passes through)
                   pool   several at once on this machine (--executor.workers N, --executor.gpus_per_run N,
                          --executor.devices [0,1]): each run on its own GPUs or share of the CPU threads
                   slurm  one job array (--executor.partition P, --executor.account A, --executor.time 4:00:00,
                          --executor.gpus_per_run N, --executor.constraint C, --executor.signal_seconds S, ...):
                          submits and returns; the last job to finish writes the comparison
  --wait         slurm: wait until every job has ended (and print the states)
  --sweep.KEY    change one key of the suite's [sweep] (e.g. --sweep.trials 16, --sweep.storage URL)
Overrides apply to every run (after the suite's shared overrides), e.g. --data.path DIR
or --job.dump_folder DIR (moves the whole suite); keys the suite varies per run are refused.
See docs/experiments.md ("On a cluster", "Sweeps")."""
FLAGS = ("--dry-run", "--no-compare", "--status", "--wait")


def print_commands(suite: Suite, launcher: Path | None = None, out: TextIO | None = None) -> None:
    """The dry run: every command, each after a comment with the run's state on this machine."""
    out = out or sys.stdout
    lines = [f"# suite {suite.name}: {len(suite.runs)} runs into {suite.dump_folder}, baseline {suite.baseline}"]
    for i, run in enumerate(suite.runs, 1):
        lines.append(f"# {i}/{len(suite.runs)} {run.name}: {run_status(suite, run)}")
        lines.append(shlex.join(launcher_command(run, launcher)))
    out.write("\n".join(lines) + "\n")  # one write: `| head` does not break it midway


def _log(suite: Suite, line: str) -> None:
    name, _, text = line.partition(" ")
    suite_log.append(suite.dump_folder, name, text)


def launch(cmd: list[str]) -> tuple[int, str | None]:
    """Run one training command; returns (exit code, name of a signal the suite received meanwhile).

    The child gets its own session, so a terminal's Ctrl-C reaches only the suite, which forwards
    every SIGINT/SIGTERM to it (a second one still stops a stuck run the trainer's way).
    """
    received: list[str] = []
    started: list[subprocess.Popen] = []  # the child, once it exists
    pending: list[int] = []  # signals that arrived before it did

    def forward(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        if started:
            started[0].send_signal(signum)
        else:
            pending.append(signum)

    # Handlers first, then the child: a signal in between would otherwise hit Python's
    # default handler and end the suite while the run (in its own session) kept going.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        proc = subprocess.Popen(cmd, start_new_session=True)
        started.append(proc)
        for signum in pending:
            proc.send_signal(signum)
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code, (received[0] if received else None)


def run_suite(suite: Suite, launcher: Path | None = None, compare: bool = True, out: TextIO | None = None) -> int:
    """Train the suite's runs in order, then compare; 0 when every run finished, 1 if one failed, 130 if stopped."""
    out = out or sys.stdout
    check_finished_runs(suite)
    failed: list[str] = []
    start = time.perf_counter()
    for i, run in enumerate(suite.runs, 1):
        status = run_status(suite, run)
        print(f"[suite] {i}/{len(suite.runs)} {run.name}: {status}", file=out, flush=True)
        if is_finished(read_run_info(suite.run_dir(run)), run.steps):
            continue
        cmd = launcher_command(run, launcher)
        print(f"[suite] $ {shlex.join(cmd)}", file=out, flush=True)
        t0 = time.perf_counter()
        code, stopped_by = launch(cmd)
        seconds = time.perf_counter() - t0
        _log(suite, f"{run.name} exit={code} seconds={seconds:.1f}"
             + (f" stopped_by={stopped_by}" if stopped_by else ""))
        if stopped_by:
            print(f"[suite] stopped by {stopped_by} during {run.name} (exit {code}); run the same command to resume",
                  file=out, flush=True)
            return 130
        if code != 0:
            failed.append(run.name)
            print(f"[suite] {run.name} failed with exit code {code}; going on with the next run", file=out, flush=True)
    _summary(suite, failed, time.perf_counter() - start, out)
    if compare:
        compare_suite(suite, out)
    return 1 if failed else 0


def compare_suite(suite: Suite, out: TextIO | None = None) -> list[Path]:
    """Compare the suite's finished runs into its dump folder (nothing when the baseline has not finished)."""
    from torchnlq.experiments.compare import compare_runs

    out = out or sys.stdout
    done = [r for r in suite.runs if is_finished(read_run_info(suite.run_dir(r)), r.steps)]
    if suite.baseline not in {r.name for r in done}:
        print(f"[suite] no comparison: the baseline run {suite.baseline} has not finished", file=out)
        return []
    if suite.scaling:
        return fit_suite(suite, done, out)
    step = suite.compare_step
    if step is not None and any(r.steps < step for r in done):
        print(f"[suite] runs shorter than compare_step {step}: comparing at the last common step instead", file=out)
        step = None
    written = compare_runs([suite.run_dir(r) for r in done], suite.dump_folder / suite.baseline, suite.dump_folder,
                           step=step)
    print(f"[suite] comparison: {', '.join(display_path(p) for p in written)}", file=out)
    return written


def fit_suite(suite: Suite, done: list[SuiteRun], out: TextIO) -> list[Path]:
    """A scaling suite's fit of loss against compute (scaling.md, scaling.png) into its dump folder."""
    from torchnlq.experiments.scaling import main as fit_main

    try:
        fit_main([*(str(suite.run_dir(r)) for r in done), "--out", str(suite.dump_folder)])
    except UserError as e:  # too few finished budgets yet: the runs are kept, the fit waits for the next call
        print(f"[suite] no scaling fit yet: {e}", file=out)
        return []
    written = [p for p in (suite.dump_folder / "scaling.md", suite.dump_folder / "scaling.png") if p.is_file()]
    print(f"[suite] scaling fit: {', '.join(display_path(p) for p in written)}", file=out)
    return written


def check_finished_runs(suite: Suite) -> None:
    """Refuse a finished run whose saved config differs from what the suite now gives it: its results would be
    reported as the new configuration's."""
    from torchnlq.train.preflight import check_job_config, resolved_config, resume_changes

    for run in suite.runs:
        saved = suite.run_dir(run) / "config.toml"
        if not is_finished(read_run_info(suite.run_dir(run)), run.steps) or not saved.is_file():
            continue
        try:
            before = load_job_config([str(saved)])
            now = load_job_config([str(run.config), *run.overrides])
            now = resolved_config(now, check_job_config(now))  # as the run recorded it: the flavor's options set
        except UserError:
            continue  # a hand-edited config.toml, or a config the run itself will refuse in one line
        changes = [c for c in resume_changes(before, now) if not c.startswith(("job.description", "job.rerun"))]
        if changes:
            change = changes[0].replace(" changed on resume", "").split(";")[0] + (" and more" if changes[1:] else "")
            raise UserError(f"{suite.path}: run '{run.name}' finished with another configuration than the suite now "
                            f"gives it ({change}); its results would be reported as the new one's: move "
                            f"{suite.run_dir(run)} away, or rename the run")


def check_data(suite: Suite) -> None:
    """Refuse, before the first launch, an unfinished run whose data cannot be opened (one line, not one per run)."""
    from torchnlq.data import token_format as fmt
    from torchnlq.data.loader import data_meta
    from torchnlq.train.preflight import check_data_fits_model, check_job_config

    opened: dict[tuple[tuple[str, ...], str, str | None, int], dict[str, Any]] = {}
    for run in suite.runs:
        if is_finished(read_run_info(suite.run_dir(run)), run.steps):
            continue
        cfg = load_job_config([str(run.config), *run.overrides])
        data = cfg.data
        if data.synthetic and not fmt.is_complete(Path(data.path).expanduser()):  # the trainer generates it
            continue
        paths = tuple(s.path for s in data.sources) or (data.path,)
        key = (paths, data.tokenizer, data.tokenizer_file, cfg.training.seq_len)  # hf: checked against its file
        try:
            if key not in opened:
                opened[key] = data_meta(data, cfg.training.seq_len)
            check_data_fits_model(opened[key], check_job_config(cfg))
        except UserError as e:
            raise UserError(f"{suite.path}: run '{run.name}': {e}") from None


def main(argv: list[str]) -> int:
    """Parse the command line (see USAGE) and run, submit, print or report the suite."""
    if argv and (argv[0] in ("-h", "--help") or "--help" in argv):
        print(USAGE)
        return 0
    if not argv or argv[0].startswith("--"):
        raise UserError("give the suite file first: run_suite.py SUITE.toml [--dry-run] [--no-compare] "
                        "[--section.key value ...] (see --help)")
    path, rest = argv[0], argv[1:]
    flags = {flag for flag in FLAGS if flag in rest}
    options = [a for a in rest if a not in FLAGS]
    if {"--dry-run", "--status"} <= flags:
        raise UserError("--dry-run and --status each print and do nothing else; give one of them")
    overrides, tables = split_table_options(options, ("executor", "sweep"))
    suite = load_suite(path, overrides)
    executor = executor_config(str(suite.path), suite.executor, tables["executor"])
    sweep = Sweep(suite, parse_sweep(suite, tables["sweep"])) if suite.sweep is not None or tables["sweep"] else None
    if "--wait" in flags and executor.type != "slurm":
        raise UserError(f"--wait is for --executor slurm (the {executor.type} executor waits for its runs anyway)")
    compare = "--no-compare" not in flags
    if "--status" in flags:
        return report_status(suite, sweep, executor, compare)
    if "--dry-run" in flags:
        print_plan(suite, sweep, executor)
        return 0
    check_data(suite)
    context = {"suite": str(suite.path), "argv": options, "compare": compare}
    return advance(suite, sweep, executor, context, wait="--wait" in flags)


def print_plan(suite: Suite, sweep: Sweep | None, executor: ExecutorConfig) -> None:
    """The dry run: the commands (a sweep's trial command and its budget), and a SLURM job script."""
    from torchnlq.experiments.scaling import budget_table

    if sweep is None:
        print_commands(suite)
        print(f"\n# budget\n{budget_table(suite.runs)}")  # what it will cost, before anything runs
    else:
        print(sweep_plan(sweep))
        spec = sweep.spec
        runs = [*suite.runs, *suite.runs] if spec.rerun_seeds else list(suite.runs)
        counts = [spec.trials] * len(suite.runs) + [len(spec.rerun_seeds)] * (len(runs) - len(suite.runs))
        names = [f"{r.name} trials" for r in suite.runs] + [f"{r.name} reruns" for r in runs[len(suite.runs):]]
        print(f"\n# budget (every trial trained to its end: pruning only saves)\n{budget_table(runs, counts, names)}")
    if executor.type == "slurm":
        from torchnlq.experiments.slurm import job_script

        count = (executor.workers or 2) if sweep is not None else len(suite.runs)
        manifest = suite.dump_folder / "slurm" / "submit-N.json"
        script = job_script(executor, suite.name, manifest, count, suite.dump_folder)
        print(f"\n# the job script (--executor slurm)\n{script}", end="")


def report_status(suite: Suite, sweep: Sweep | None, executor: ExecutorConfig, compare: bool) -> int:
    """--status: print the states; write the comparison when everything has finished."""
    from torchnlq.experiments.suite_status import print_status
    from torchnlq.experiments.tuned import best_config_path, tuned_suite

    done = sweep is None or sweep.done(create=False)
    written = sweep is not None and all(best_config_path(sweep, arm).is_file() for arm in sweep.arms)
    tuned = tuned_suite(sweep) if sweep is not None and done and written and sweep.spec.rerun_seeds else None
    finished = print_status(suite, sweep, executor, sys.stdout, tuned)
    if finished and compare and (tuned or sweep is None):
        with suite_log.suite_lock(suite.dump_folder):
            compare_suite(tuned or suite)
    return 0


def advance(suite: Suite, sweep: Sweep | None, executor: ExecutorConfig, context: dict[str, Any], wait: bool = False,
            after_job: bool = False, out: TextIO | None = None) -> int:
    """Take the suite as far as its executor goes: train (local, pool) or submit (slurm) what is left of the
    current stage (a sweep's trials, then its reruns; a suite's runs), then compare.

    ``after_job``: called by a SLURM job that just ended (slurm_job): only what was never submitted is submitted
    (a failed run waits for the user's command), and the comparison is written once everything has finished.
    """
    out = out or sys.stdout
    compare = context.get("compare", True)
    if sweep is not None:
        from torchnlq.experiments.tuned import best_config_path, tuned_suite, write_best_configs, write_plots

        if not sweep.done():
            if after_job:
                return 0  # other workers are still at it (or the user's command resumes a stopped one)
            code = run_workers(sweep, executor, context, wait, out)
            if not sweep.done():
                return code
        with suite_log.suite_lock(suite.dump_folder):
            if not after_job or not all(best_config_path(sweep, a).is_file() for a in sweep.arms):
                write_best_configs(sweep, out)
                write_plots(sweep, out)
        suite = tuned_suite(sweep)
        if suite is None:
            print("[sweep] done; set [sweep] rerun_seeds to rerun each arm's best and compare them", file=out)
            return 0
    return run_stage(suite, executor, context, compare, wait, after_job, out)


def run_stage(suite: Suite, executor: ExecutorConfig, context: dict[str, Any], compare: bool, wait: bool,
              after_job: bool, out: TextIO) -> int:
    """Train or submit a suite's unfinished runs, then compare them (on SLURM: once the last has finished)."""
    if executor.type == "local":
        return run_suite(suite, compare=compare, out=out)
    check_finished_runs(suite)
    tasks = [Task(r.name, tuple(launcher_command(r)), str(suite.run_dir(r)), r.steps) for r in suite.runs]
    if executor.type == "pool":
        start = time.perf_counter()
        failed, stopped_by = run_pool(tasks, pool_slots(executor), suite.dump_folder, out)
        if stopped_by:
            print(f"[suite] stopped by {stopped_by}; run the same command to resume", file=out, flush=True)
            return 130
        _summary(suite, failed, time.perf_counter() - start, out)
        if compare:
            compare_suite(suite, out)
        return 1 if failed else 0
    from torchnlq.experiments import slurm

    created = suite_log.first_missing(suite.dump_folder)
    try:
        with suite_log.suite_lock(suite.dump_folder):  # two jobs ending at once submit the next stage once
            todo = [t for t, r in zip(tasks, suite.runs) if not is_finished(read_run_info(suite.run_dir(r)), r.steps)]
            alive = slurm.alive_jobs(suite.dump_folder, [t.name for t in todo]) if todo else {}
            todo = [t for t in todo
                    if t.name not in alive and not (after_job and slurm.submitted_ever(suite.dump_folder, t.name))]
            if todo:
                slurm.submit(todo, executor, suite.dump_folder, suite.name, context, out)
    except UserError:
        if created is not None:  # refused: the folders made for the lock go again (nothing else was written)
            suite_log.remove_lock(suite.dump_folder, created)
        raise
    if wait:
        slurm.wait_for(suite.dump_folder, [r.name for r in suite.runs], executor, out)
    finished = all(is_finished(read_run_info(suite.run_dir(r)), r.steps) for r in suite.runs)
    if finished and compare:
        with suite_log.suite_lock(suite.dump_folder):
            compare_suite(suite, out)
    elif wait:
        print("[slurm] not every run finished: see run_suite.py SUITE --status", file=out, flush=True)
        return 1
    return 0


def run_workers(sweep: Sweep, executor: ExecutorConfig, context: dict[str, Any], wait: bool, out: TextIO) -> int:
    """A sweep's trials: one worker in this process (local), a worker per place of the pool, or worker jobs."""
    from torchnlq.experiments.sweep_worker import Worker, worker_tasks

    sweep.check_studies()
    if executor.type == "local":
        worker = Worker(sweep, 0, out)
        worker.run()
        return 130 if worker.stopped else 0
    if executor.type == "pool":
        slots = pool_slots(executor)
        while not sweep.done():
            before = sweep.counts()
            failed, stopped_by = run_pool(worker_tasks(sweep, len(slots), context), slots, sweep.dump, out)
            if stopped_by:
                return 130
            if sweep.counts() == before:  # no worker got anywhere: its log says why
                print(f"[sweep] the workers stopped without progress ({', '.join(failed) or 'no error'}); see "
                      f"{display_path(sweep.dump / 'logs')}", file=out, flush=True)
                return 1
        return 0
    from torchnlq.experiments import slurm

    tasks = worker_tasks(sweep, executor.workers or 2, context)
    alive = slurm.alive_jobs(sweep.dump, [t.name for t in tasks])
    todo = [t for t in tasks if t.name not in alive]
    if todo:
        slurm.submit(todo, executor, sweep.dump, sweep.suite.name, context, out)
    if wait:
        slurm.wait_for(sweep.dump, [t.name for t in tasks], executor, out)
    return 0


def advance_after_job(manifest: dict[str, Any]) -> None:
    """What a SLURM job does when its task ended by itself: the suite's next step (see :func:`advance`)."""
    argv = [str(a) for a in manifest.get("argv", [])]
    overrides, tables = split_table_options(argv, ("executor", "sweep"))
    suite = load_suite(str(manifest["suite"]), overrides)
    executor = executor_config(str(suite.path), suite.executor, tables["executor"])
    sweep = Sweep(suite, parse_sweep(suite, tables["sweep"])) if suite.sweep is not None else None
    advance(suite, sweep, executor, manifest, after_job=True)


def _summary(suite: Suite, failed: list[str], wall: float, out: TextIO) -> None:
    _log(suite, f"suite {suite.name}: {len(suite.runs)} runs, {len(failed)} failed, wall {wall:.1f}s")
    print(f"[suite] done in {wall / 60:.1f} min: {len(suite.runs) - len(failed)}/{len(suite.runs)} runs finished"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=out, flush=True)


def cli() -> int:
    """Entry point of scripts/run_suite.py: user errors are one line with exit code 2."""
    return run_cli(main)
