"""Run a suite: its runs through its executor (experiments/executors.py), then the comparison.

A failed run is reported and the suite goes on (one bad arm should not cost the night's other runs).
Ctrl-C or SIGTERM is passed to the running trainers, which checkpoint and exit; then the suite stops.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.experiments import suite_log
from torchnlq.experiments.executors import Executor, ExecutorConfig, Task
from torchnlq.experiments.suite import Suite, SuiteRun, display_path, launcher_command, run_status
from torchnlq.experiments.suite_command import build_executor, executors, load_command, submitting
from torchnlq.experiments.sweep import Sweep, sweep_plan
from torchnlq.models.counts import flops_per_token

USAGE = """usage: run_suite.py SUITE.toml [--dry-run | --status] [--no-compare] [--wait] [--executor NAME]
                    [--executor.KEY VALUE ...] [--sweep.KEY VALUE ...] [--section.key value ...]

Train every run of a suite, skipping finished runs and resuming interrupted ones, then compare them into the
suite's folder; a suite with a [sweep] first searches each arm with Optuna.
  --dry-run      print the commands, the budget in GPU-hours (a sweep's: every trial to its end) and what the
                 executor adds (slurm: the job script); do nothing else
  --status       each run's state (new, queued, running at step N, finished, failed, interrupted) and each
                 study's trials; writes the comparison when everything has finished
  --no-compare   skip the comparison at the end
  --executor     where the runs go (default: the suite's [executor] type, else {default}): {names}
  --wait         an executor that submits and returns ({submitting}): wait until every job has ended
  --sweep.KEY    change one key of the suite's [sweep] (e.g. --sweep.trials 16, --sweep.storage URL)
Overrides apply to every run (after the suite's shared overrides), e.g. --data.path DIR
or --job.dump_folder DIR (moves the whole suite); keys the suite varies per run are refused.
See docs/experiments.md ("On a cluster", "Sweeps").

[executor] keys (the suite's table, or --executor.KEY VALUE); each executor reads its own:"""
FLAGS = ("--dry-run", "--no-compare", "--status", "--wait")


def usage() -> str:
    """USAGE with the registered executors and the keys of [executor] (each once, from its executor's Config) and
    [sweep] (SweepSpec's), as their declarations say them."""
    from torchnlq.config.render import table_help
    from torchnlq.experiments.sweep import SweepSpec

    known = executors()
    lines: list[str] = []
    for cls in known.values():
        lines += table_help(cls.Config, "executor", {"executor.type": list(known)},
                            skip=[line.split("\n")[0].strip()[len("--executor."):] for line in lines])
    text = USAGE.format(default=ExecutorConfig.type, names=", ".join(known), submitting=", ".join(submitting()))
    sweep = table_help(SweepSpec, "sweep", skip=["params"])  # [sweep.params]: its own table
    return "\n".join([text, *lines, "\n[sweep] keys (the suite's table, or --sweep.KEY VALUE):", *sweep])


def print_commands(suite: Suite, launcher: Path | None = None, out: TextIO | None = None) -> None:
    """The dry run: every command, each after a comment with the run's state on this machine."""
    out = out or sys.stdout
    lines = [f"# suite {suite.name}: {len(suite.runs)} runs into {suite.dump_folder}, baseline {suite.baseline}"]
    for i, run in enumerate(suite.runs, 1):
        lines.append(f"# {i}/{len(suite.runs)} {run.name}: {run_status(suite, run)}")
        lines.append(shlex.join(launcher_command(run, launcher)))
    out.write("\n".join(lines) + "\n")  # one write: `| head` does not break it midway


def compare_suite(suite: Suite, out: TextIO | None = None) -> list[Path]:
    """Compare the suite's finished runs into its dump folder (nothing when the baseline has not finished)."""
    from torchnlq.experiments.compare import compare_runs

    out = out or sys.stdout
    done = [r for r in suite.runs if suite.finished(r)]
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
        if not suite.finished(run) or not saved.is_file():
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
        if suite.finished(run):
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
        print(usage())
        return 0
    if not argv or argv[0].startswith("--"):
        raise UserError("give the suite file first: run_suite.py SUITE.toml [--dry-run] [--no-compare] "
                        "[--section.key value ...] (see --help)")
    path, rest = argv[0], argv[1:]
    flags = {flag for flag in FLAGS if flag in rest}
    options = [a for a in rest if a not in FLAGS]
    if {"--dry-run", "--status"} <= flags:
        raise UserError("--dry-run and --status each print and do nothing else; give one of them")
    command = load_command(path, options)
    suite, executor, sweep = command.suite, command.executor, command.sweep
    if "--wait" in flags and not executor.submits:
        raise UserError(f"--wait is for --executor {'|'.join(submitting())} (the {executor.name} executor waits for "
                        "its runs anyway)")
    compare = "--no-compare" not in flags
    if "--status" in flags:
        return report_status(suite, sweep, executor, compare)
    if "--dry-run" in flags:
        print_plan(suite, sweep, executor)
        return 0
    executor.check_ready()  # before anything exists: a sweep's storage, the suite's folder
    check_data(suite)
    context = {"suite": str(suite.path), "name": suite.name, "argv": options, "compare": compare}
    return advance(suite, sweep, executor, context, wait="--wait" in flags)


def print_plan(suite: Suite, sweep: Sweep | None, executor: Executor) -> None:
    """The dry run: the commands (a sweep's trial command and its budget), and what the executor adds."""
    if sweep is None:
        print_commands(suite)
        print(f"\n# budget\n{budget_table(suite.runs)}")  # what it will cost, before anything runs
    else:
        print(sweep_plan(sweep))
        spec = sweep.spec
        reruns = [dataclasses.replace(r, overrides=(*r.overrides, *spec.rerun_overrides)) for r in suite.runs]
        runs = [*suite.runs, *reruns] if spec.rerun_seeds else list(suite.runs)
        counts = [spec.trials] * len(suite.runs) + [len(spec.rerun_seeds)] * (len(runs) - len(suite.runs))
        names = [f"{r.name} trials" for r in suite.runs] + [f"{r.name} reruns" for r in runs[len(suite.runs):]]
        print(f"\n# budget (every trial trained to its end: pruning only saves)\n{budget_table(runs, counts, names)}")
    plan = executor.plan(suite.name, suite.dump_folder, executor.sweep_workers() if sweep else len(suite.runs))
    if plan:
        print(f"\n{plan}", end="")


# ----- what a suite will cost (the dry run) ------------------------------------------------------------------

#: The MFU (torchnlq's count) measured for the default profile compiled with the full-logits loss on one H200
#: (2026-11-28, docs/performance.md); the budget assumes it at every size, which larger widths usually beat.
MEASURED_MFU = 0.40
#: The cards a budget is given for: dense bf16 peak TFLOP/s and memory in GiB.
BUDGET_CARDS = {"RTX 5090": (209.5, 32.0), "H100 SXM": (989.0, 80.0)}


def _hours(hours: float) -> str:
    """Three significant digits, whole hours with thousands separators from 100 on."""
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"


def budget_table(runs: Sequence[Any], counts: Sequence[int] | None = None, names: Sequence[str] | None = None) -> str:
    """A suite's cost before it runs: per run its tokens, training FLOPs (the model's count), the GPU-hours on each
    of :data:`BUDGET_CARDS` at :data:`MEASURED_MFU`, and the memory estimate of its micro-batch against each card.
    ``counts``: how many times each run is trained (a sweep's trials, its reruns), named ``names``."""
    from torchnlq.train.memory_estimate import GIB, HEADROOM, estimate_memory
    from torchnlq.train.preflight import check_job_config

    header = ["run", "steps", "tokens", "training FLOPs", *(f"{card} hours" for card in BUDGET_CARDS),
              "memory estimate (GiB)"]
    rows, totals, estimates = [], dict.fromkeys(BUDGET_CARDS, 0.0), {}
    for i, run in enumerate(runs):
        count = counts[i] if counts else 1
        cfg = load_job_config([*run.argv(), "--training.device=cuda"])
        args = check_job_config(cfg)
        t = cfg.training
        tokens = t.steps * t.tokens_per_step()
        flops = flops_per_token(args, t.seq_len) * tokens
        shape = (args.n_layers, args.dim, args.query.type, t.micro_batch_size, t.seq_len)
        if shape not in estimates:  # seeds share a size's estimate
            estimates[shape] = estimate_memory(cfg, args, 1, "cuda").total / GIB
        hours = {card: count * flops / (MEASURED_MFU * peak * 1e12) / 3600 for card, (peak, _) in BUDGET_CARDS.items()}
        for card in totals:
            totals[card] += hours[card]
        fits = ", ".join(card for card, (_, gib) in BUDGET_CARDS.items() if estimates[shape] <= (1 - HEADROOM) * gib)
        name = f"{names[i] if names else run.name}" + (f" (x {count})" if counts else "")
        rows.append([name, f"{t.steps:,}", f"{tokens:,}", f"{flops:.3g}", *(_hours(h) for h in hours.values()),
                     f"{estimates[shape]:.1f} (fits: {fits or 'neither card: lower the micro-batch'})"])
    rows.append(["total", "", "", "", *(_hours(h) for h in totals.values()), ""])
    lines = [f"| {' | '.join(header)} |", "| --- | " + "---: | " * (len(header) - 2) + "--- |"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines) + (f"\n\nGPU-hours at {100 * MEASURED_MFU:.0f}% MFU (torchnlq's count; measured for "
                               "GPT-2 small on one H200, compiled: docs/performance.md) on one card; the memory "
                               "estimate is the config's micro-batch on CUDA in bf16 "
                               "(torchnlq/train/memory_estimate.py).")


def report_status(suite: Suite, sweep: Sweep | None, executor: Executor, compare: bool) -> int:
    """--status: print the states; write the comparison when everything has finished."""
    from torchnlq.experiments.suite_status import print_status
    from torchnlq.experiments.tuned import best_config_path, tuned_suite

    written = sweep is not None and sweep.done(create=False) and all(
        best_config_path(sweep, arm).is_file() for arm in sweep.arms)
    tuned = tuned_suite(sweep) if written else None  # the reruns (None without rerun_seeds)
    finished = print_status(suite, sweep, executor, sys.stdout, tuned)
    if finished and compare and (tuned or sweep is None):
        with suite_log.suite_lock(suite.dump_folder):
            compare_suite(tuned or suite)
    return 0


def advance(suite: Suite, sweep: Sweep | None, executor: Executor, context: dict[str, Any], wait: bool = False,
            after_job: bool = False, out: TextIO | None = None) -> int:
    """Take the suite as far as its executor goes: run (or submit) what is left of the current stage (a sweep's
    trials, then its reruns; a suite's runs), then compare.

    ``after_job``: called by a submitted job that just ended (slurm_job): only what was never submitted is
    submitted (a failed run waits for the user's command), and the comparison is written once everything has
    finished.
    """
    out = out or sys.stdout
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
    return run_stage(suite, executor, context, context.get("compare", True), wait, after_job, out)


def run_stage(suite: Suite, executor: Executor | None = None, context: dict[str, Any] | None = None,
              compare: bool = True, wait: bool = False, after_job: bool = False, out: TextIO | None = None,
              launcher: Path | None = None) -> int:
    """Run (or submit) a suite's unfinished runs, then compare them; 0 when every run finished (or was submitted),
    1 if one failed, 130 if a signal stopped the suite. ``executor``: the suite's own by default."""
    out = out or sys.stdout
    executor = executor or build_executor(str(suite.path), suite.executor, {})
    check_finished_runs(suite)
    tasks = [Task(r.name, tuple(launcher_command(r, launcher)), str(suite.run_dir(r)), r.steps) for r in suite.runs]
    start = time.perf_counter()
    outcome = executor.run(tasks, suite.dump_folder, context or {"name": suite.name}, after_job, out)
    if outcome.stopped_by:
        print(f"[suite] stopped by {outcome.stopped_by}; run the same command to resume", file=out, flush=True)
        return 130
    if outcome.ended:
        _summary(suite, list(outcome.failed), time.perf_counter() - start, out)
    elif wait:
        executor.wait(suite.dump_folder, [r.name for r in suite.runs], out)
    finished = all(suite.finished(r) for r in suite.runs)
    if compare and (finished or outcome.ended):
        with suite_log.suite_lock(suite.dump_folder):
            compare_suite(suite, out)
    if wait and not finished:
        print("[suite] not every run finished: see run_suite.py SUITE --status", file=out, flush=True)
    return 1 if outcome.failed or (wait and not finished) else 0


def run_workers(sweep: Sweep, executor: Executor, context: dict[str, Any], wait: bool, out: TextIO) -> int:
    """A sweep's trials: its executor's sweep workers, run until the studies are done (or submitted)."""
    from torchnlq.experiments.sweep_worker import worker_tasks

    sweep.check_studies()
    tasks = worker_tasks(sweep, executor.sweep_workers(), context)
    while True:
        before = sweep.counts()
        outcome = executor.run(tasks, sweep.dump, context, False, out)
        if outcome.stopped_by:
            print(f"[sweep] stopped by {outcome.stopped_by}; run the same command to resume", file=out, flush=True)
            return 130
        if not outcome.ended:
            if wait:
                executor.wait(sweep.dump, [t.name for t in tasks], out)
            return 0
        if sweep.done():
            return 0
        if sweep.counts() == before:  # no worker got anywhere: its log says why
            print(f"[sweep] the workers stopped without progress ({', '.join(outcome.failed) or 'no error'}); see "
                  f"their output ({display_path(sweep.dump / 'logs')} unless on this terminal)", file=out, flush=True)
            return 1


def advance_after_job(manifest: dict[str, Any]) -> None:
    """What a submitted job does when its task ended by itself: the suite's next step (see :func:`advance`)."""
    command = load_command(str(manifest["suite"]), [str(a) for a in manifest.get("argv", [])])
    advance(command.suite, command.sweep, command.executor, manifest, after_job=True)


def _summary(suite: Suite, failed: list[str], wall: float, out: TextIO) -> None:
    suite_log.append(suite.dump_folder, "suite", f"{suite.name}: {len(suite.runs)} runs, {len(failed)} failed, "
                     f"wall {wall:.1f}s")
    print(f"[suite] done in {wall / 60:.1f} min: {len(suite.runs) - len(failed)}/{len(suite.runs)} runs finished"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=out, flush=True)


def cli() -> int:
    """Entry point of scripts/run_suite.py: user errors are one line with exit code 2."""
    return run_cli(main)
