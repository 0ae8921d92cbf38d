"""How a catalogue row runs and is checked: the entry points (``ENTRIES``), a row in this process or as a
process, the one-line rule and the snapshots of every file around it."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO_ROOT
from helpers.checkpoints import load_script

from catalogue.rows import P, T, Inputs, Mistake, Setup, fill
from torchnlq.cli import run_cli

# ==================================================================================================
# The entry points: how a row runs, in this process and as a process
# ==================================================================================================

Main = Callable[[list[str]], "int | None"]
#: The xdist group of every entry point's subprocess rows: under ``--dist loadgroup`` they run on one worker.
SUBPROCESS_GROUP = "catalogue-subprocess-rows"


@dataclass(frozen=True)
class EntryPoint:
    """How users start a command and its ``main(argv)``.

    ``program`` is a script relative to the repository (``scripts/generate.py``, ``run_train.sh``) or a module
    run from the repository's root with ``python -m`` (``benchmarks.train_step``: the benchmarks package is not
    installed).
    """

    program: str
    load: Callable[[], Main]  # imported on first use: only the rows that need torch's heavy parts pay for them
    watch: tuple[Path, ...] = ()  # folders of the repository it could write by mistake (snapshotted too)

    @property
    def is_module(self) -> bool:
        """Started as ``python -m program``."""
        return not self.program.endswith((".py", ".sh"))

_scripts: dict[str, Any] = {}


def _script(name: str) -> Callable[[], Main]:
    """``main`` of scripts/<name>.py, imported once (the scripts that define their own main)."""

    def load() -> Main:
        if name not in _scripts:
            _scripts[name] = load_script(name)
        return _scripts[name].main

    return load


def _train_main() -> Main:
    from torchnlq.train.__main__ import main

    return main


def _preflight_main() -> Main:
    main = _train_main()

    def preflight(argv: list[str]) -> int:  # what run_train.sh runs first when NGPU > 1: here NGPU=2
        os.environ["TORCHNLQ_WORLD_SIZE"] = "2"  # the row's clean environment puts it back afterwards
        return main(["--preflight", *argv])

    return preflight


def _attr(module: str, name: str = "main") -> Callable[[], Main]:
    """``module.name``, imported on first use (the library's and the benchmarks' mains, run through run_cli)."""

    def load() -> Main:
        import importlib

        return getattr(importlib.import_module(module), name)

    return load


def _benchmark(name: str) -> EntryPoint:
    """``python -m benchmarks.NAME``: its ``main`` (the module's ``__main__`` block runs it through run_cli)."""
    return EntryPoint(f"benchmarks.{name}", _attr(f"benchmarks.{name}"))


BENCHMARKS = ("train_step", "attention_block", "coord_check", "lr_transfer", "batch_reads", "startup", "trainer_overhead", "versus_nanogpt",
              "versus_torchtitan", "checkpoint_io", "activation_memory", "inference_speed", "cpu_allocator",
              "gpu_check")

ENTRIES: dict[str, EntryPoint] = {
    T: EntryPoint("run_train.sh", _train_main),
    P: EntryPoint("run_train.sh", _preflight_main),
    "prepare_data.py": EntryPoint("scripts/prepare_data.py", _script("prepare_data")),
    "convert_checkpoint.py": EntryPoint("scripts/convert_checkpoint.py", _script("convert_checkpoint")),
    "generate.py": EntryPoint("scripts/generate.py", _script("generate")),
    "evaluate.py": EntryPoint("scripts/evaluate.py", _script("evaluate")),
    "run_suite.py": EntryPoint("scripts/run_suite.py", _attr("torchnlq.experiments.suite_run")),
    "compare_runs.py": EntryPoint("scripts/compare_runs.py", _attr("torchnlq.experiments.compare")),
    "fit_scaling.py": EntryPoint("scripts/fit_scaling.py", _attr("torchnlq.experiments.scaling")),
    "loss_compare.py": EntryPoint("scripts/loss_compare.py", _attr("torchnlq.experiments.loss_compare")),
    "model_summary.py": EntryPoint("scripts/model_summary.py", _attr("torchnlq.train.summary")),
    "gen_config_docs.py": EntryPoint("scripts/gen_config_docs.py", _script("gen_config_docs"), (REPO_ROOT / "docs",)),
    "upcycle.py": EntryPoint("scripts/upcycle.py", _script("upcycle")),
    **{f"benchmarks.{name}": _benchmark(name) for name in BENCHMARKS},
}


@dataclass(frozen=True)
class Outcome:
    """How a command ended: its exit code and what it printed."""

    code: int
    out: str
    err: str


#: Warning categories Python does not show by default (DeprecationWarning only for __main__'s own code).
HIDDEN_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_in_process(entry: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``run_cli(main, argv)`` as the script's ``__main__`` calls it; an escaping exception fails the row.

    ``SystemExit`` is what the process would exit with (argparse's usage errors raise it). Warnings
    are recorded each time (not once per process, as the rows stand for separate processes) and
    those a terminal would show become stderr lines.
    """
    main = ENTRIES[entry].load()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code = run_cli(main, argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    captured = capsys.readouterr()
    shown = [f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, HIDDEN_BY_DEFAULT)]
    return Outcome(code, captured.out, captured.err + "".join(f"{line}\n" for line in shown))


def command(entry: str) -> tuple[list[str], dict[str, str]]:
    """The command line of an entry point as a user types it (with this Python), and what it adds to the
    environment: a benchmark module is found as from the repository's root."""
    entry_point = ENTRIES[entry]
    if entry_point.is_module:
        return [sys.executable, "-m", entry_point.program], {"PYTHONPATH": str(REPO_ROOT)}
    script = REPO_ROOT / entry_point.program
    return ([str(script)] if script.suffix == ".sh" else [sys.executable, str(script)]), {}


# ==================================================================================================
# Checking a row: the one-line rule and the snapshots
# ==================================================================================================

Snapshot = dict[str, tuple[Any, ...]]


def snapshot(*roots: Path) -> Snapshot:
    """Every path under ``roots``: files by sha256 and mtime, links by target, folders by existence.

    A folder's own mtime is left out: it changes when a file is created and removed again inside it,
    and a temporary file that is gone is not a file left behind.
    """
    tree: Snapshot = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                if path.is_symlink():
                    tree[str(path)] = ("link", os.readlink(path))
                elif path.is_dir():
                    tree[str(path)] = ("dir",)
                else:
                    tree[str(path)] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return tree


def assert_unchanged(before: Snapshot, after: Snapshot) -> None:
    """Nothing created, deleted or changed between the two snapshots (the first few of each are named)."""
    created = sorted(set(after) - set(before))
    deleted = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    assert not (created or deleted or changed), f"created {created[:5]}, deleted {deleted[:5]}, changed {changed[:5]}"


def assert_one_clean_line(outcome: Outcome, fragment: str) -> None:
    """Exit code 2, one ``error:`` line on stderr holding ``fragment``, no traceback anywhere."""
    shown = f"exit code {outcome.code}\n--- stderr:\n{outcome.err[-3000:]}\n--- stdout:\n{outcome.out[-1500:]}"
    assert "Traceback (most recent call last)" not in outcome.out + outcome.err, shown
    assert outcome.code == 2, shown
    lines = [line for line in outcome.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"not one 'error:' line\n{shown}"
    assert fragment in lines[0], f"{fragment!r} is not in the error line\n{shown}"


# ==================================================================================================
# The checks of a row, each entry point's tests call them
# ==================================================================================================

def working_folder(tmp: Path) -> Path:
    """The row's working directory ({tmp}), one level below the snapshotted folder: '..' is watched too."""
    work = tmp / "work"
    work.mkdir()
    return work


def check_in_process(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    """One in-process row: exit 2, one ``error:`` line with the fragment, no traceback, nothing written."""
    work = working_folder(tmp_path)
    places = inputs.places(work)
    for name, value in mistake.env:
        clean_env.setenv(name, fill(value, places))
    cleanup = mistake.setup(work, inputs) if mistake.setup else None
    clean_env.chdir(work)
    roots = (tmp_path, inputs.root, *ENTRIES[mistake.entry].watch)
    before = snapshot(*roots)
    capsys.readouterr()
    try:
        outcome = run_in_process(mistake.entry, [fill(a, places) for a in mistake.argv], capsys)
    finally:
        if cleanup is not None:
            cleanup()
    assert_one_clean_line(outcome, fill(mistake.fragment, places))
    assert_unchanged(before, snapshot(*roots))


@dataclass
class Launched:
    """A subprocess row in flight: its folder (the parent of its cwd), the snapshot taken before it started,
    its future outcome."""

    tmp: Path
    places: dict[str, str]
    before: Snapshot
    outcome: concurrent.futures.Future[Outcome]


def run_process(cmd: list[str], cwd: Path, env: dict[str, str]) -> Outcome:
    """A row's command as a real process."""
    proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


@dataclass
class Launches:
    """The subprocess rows in flight (by test node id), and the shared inputs as they were before any started."""

    rows: dict[str, Launched]
    inputs_before: Snapshot


def check_in_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
    """One row as a real process (started by the ``launched`` fixture): the same rule as in-process."""
    state = launched.rows[request.node.nodeid]
    outcome = state.outcome.result()
    assert_one_clean_line(outcome, fill(mistake.fragment, state.places))
    assert_unchanged(state.before, snapshot(state.tmp))


def check_valid_command(entry: str, argv: list[str], setup: Setup | None, inputs: Inputs, tmp_path: Path,
                        clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The shared inputs and a base command are valid: a row fails for its own mistake, not theirs."""
    work = working_folder(tmp_path)
    places = inputs.places(work)
    if setup is not None:
        setup(work, inputs)
    clean_env.chdir(work)
    before = snapshot(inputs.root)
    outcome = run_in_process(entry, [fill(a, places) for a in argv], capsys)
    assert outcome.code == 0, outcome.err[-3000:]
    assert "error:" not in outcome.err and "Traceback" not in outcome.err
    assert_unchanged(before, snapshot(inputs.root))


def mistake_tests(in_process: list[Any], in_subprocess: list[Any]) -> tuple[Callable[..., None], Callable[..., None]]:
    """An entry point's two tests of its rows, which its module binds as ``test_mistake`` and
    ``test_mistake_in_a_subprocess``: each row run in this process, and (integration) as a command."""

    @pytest.mark.parametrize("mistake", in_process)
    def test_mistake(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
        check_in_process(mistake, inputs, tmp_path, clean_env, capsys)

    @pytest.mark.integration
    @pytest.mark.xdist_group(SUBPROCESS_GROUP)  # one worker starts them all at once (conftest.launched)
    @pytest.mark.parametrize("mistake", in_subprocess)
    def test_mistake_in_a_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
        check_in_subprocess(mistake, request, launched)

    return test_mistake, test_mistake_in_a_subprocess


def valid_command_test(controls: list[Any]) -> Callable[..., None]:
    """The test of an entry point's valid commands next to its mistakes (``test_the_valid_command_works``)."""

    @pytest.mark.parametrize(("entry", "argv", "setup"), controls)
    def test_the_valid_command_works(entry: str, argv: list[str], setup: Setup | None, inputs: Inputs, tmp_path: Path,
                                     clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        check_valid_command(entry, argv, setup, inputs, tmp_path, clean_env, capsys)

    return test_the_valid_command_works
