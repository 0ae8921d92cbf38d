"""Run a suite: each run through run_train.sh, one after another, then the comparison.

A failed run is reported and the suite goes on (one bad arm should not cost the night's other runs).
Ctrl-C or SIGTERM is passed to the running trainer, which checkpoints and exits; then the suite stops.
"""

from __future__ import annotations

import json
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
from torchnlq.experiments.suite import (
    REPO_ROOT,
    Suite,
    SuiteRun,
    display_path,
    load_suite,
)

USAGE = """usage: run_suite.py SUITE.toml [--dry-run] [--no-compare] [--section.key value ...]

Train every run of a suite with run_train.sh, one after another (NGPU passes through),
skipping finished runs and resuming interrupted ones, then compare them into the suite's folder.
  --dry-run      print the commands (and a scaling suite's budget in GPU-hours) and do nothing else
  --no-compare   skip the comparison at the end
Overrides apply to every run (after the suite's shared overrides), e.g. --data.path DIR
or --job.dump_folder DIR (moves the whole suite); keys the suite varies per run are refused."""


def read_run_info(run_dir: Path) -> dict[str, Any] | None:
    """``run_info.json`` of a run folder, or None when there is none (yet) or it is unreadable."""
    try:
        return json.loads((run_dir / "run_info.json").read_text())
    except (OSError, ValueError):
        return None


def is_finished(info: dict[str, Any] | None, steps: int) -> bool:
    """Finished at exactly the requested steps (a run asked to train longer is not finished)."""
    return bool(info and info.get("finished") and info.get("steps") == steps)


def run_status(suite: Suite, run: SuiteRun) -> str:
    """One word or phrase for the dry run and the progress lines."""
    info = read_run_info(suite.run_dir(run))
    if info is None:
        return "new"
    if is_finished(info, run.steps):
        return "finished (skipped)"
    if info.get("finished"):
        return f"finished at {info.get('steps')} steps; re-running goes on to {run.steps}"
    return (f"interrupted at step {info.get('step', 0)}/{info.get('steps', '?')}; re-running resumes from its "
            "checkpoint, or without one starts again (the earlier files moved into previous-N/)")


def launcher_command(run: SuiteRun, launcher: Path | None = None) -> list[str]:
    """The command that trains ``run``; the environment (NGPU, ...) passes through unchanged.

    The suite owns its run folders: a run interrupted before its first checkpoint starts again
    (``job.rerun``: its earlier files are set aside, not mixed in), one with a checkpoint resumes.
    """
    script = display_path(launcher or REPO_ROOT / "run_train.sh")
    if not script.startswith(("/", ".")):
        script = f"./{script}"  # a bare name would be looked up on PATH
    return [script, *run.argv(), "--job.rerun=true"]


def print_commands(suite: Suite, launcher: Path | None = None, out: TextIO | None = None) -> None:
    """The dry run: every command, each after a comment with the run's state on this machine."""
    out = out or sys.stdout
    lines = [f"# suite {suite.name}: {len(suite.runs)} runs into {suite.dump_folder}, baseline {suite.baseline}"]
    for i, run in enumerate(suite.runs, 1):
        lines.append(f"# {i}/{len(suite.runs)} {run.name}: {run_status(suite, run)}")
        lines.append(shlex.join(launcher_command(run, launcher)))
    out.write("\n".join(lines) + "\n")  # one write: `| head` does not break it midway


def _log(suite: Suite, line: str) -> None:
    suite.dump_folder.mkdir(parents=True, exist_ok=True)
    with (suite.dump_folder / "suite.log").open("a") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


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
        _log(suite, f"{run.name} exit={code} seconds={seconds:.1f}" + (f" stopped_by={stopped_by}" if stopped_by else ""))
        if stopped_by:
            print(f"[suite] stopped by {stopped_by} during {run.name} (exit {code}); run the same command to resume",
                  file=out, flush=True)
            return 130
        if code != 0:
            failed.append(run.name)
            print(f"[suite] {run.name} failed with exit code {code}; going on with the next run", file=out, flush=True)
    wall = time.perf_counter() - start
    _log(suite, f"suite {suite.name}: {len(suite.runs)} runs, {len(failed)} failed, wall {wall:.1f}s")
    print(f"[suite] done in {wall / 60:.1f} min: {len(suite.runs) - len(failed)}/{len(suite.runs)} runs finished"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=out, flush=True)
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
    from torchnlq.train.preflight import resume_changes

    for run in suite.runs:
        saved = suite.run_dir(run) / "config.toml"
        if not is_finished(read_run_info(suite.run_dir(run)), run.steps) or not saved.is_file():
            continue
        try:
            before = load_job_config([str(saved)])
        except UserError:
            continue  # a hand-edited config.toml: the run itself says so when it resumes
        changes = [c for c in resume_changes(before, load_job_config([str(run.config), *run.overrides]))
                   if not c.startswith(("job.description", "job.rerun"))]
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
    """Parse the command line (see USAGE) and run or print the suite."""
    if argv and (argv[0] in ("-h", "--help") or "--help" in argv):
        print(USAGE)
        return 0
    if not argv or argv[0].startswith("--"):
        raise UserError("give the suite file first: run_suite.py SUITE.toml [--dry-run] [--no-compare] "
                        "[--section.key value ...] (see --help)")
    path, rest = argv[0], argv[1:]
    dry_run, compare = "--dry-run" in rest, "--no-compare" not in rest
    overrides = [a for a in rest if a not in ("--dry-run", "--no-compare")]
    suite = load_suite(path, overrides)
    if dry_run:
        print_commands(suite)
        if suite.scaling:  # what it will cost, before anything runs
            from torchnlq.experiments.scaling import budget_table

            print(f"\n# budget\n{budget_table(suite.runs)}")
        return 0
    check_data(suite)
    return run_suite(suite, compare=compare)


def cli() -> int:
    """Entry point of scripts/run_suite.py: user errors are one line with exit code 2."""
    return run_cli(main)
