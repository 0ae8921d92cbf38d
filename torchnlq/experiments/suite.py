"""Experiment suites: many training runs from one TOML file (the format: docs/experiments.md, "Suites").

Every run's config is loaded and checked before anything is launched; running a suite is
:mod:`torchnlq.experiments.suite_run`.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchnlq.checkpoint.record import read_run_info
from torchnlq.cli import ArgumentParser
from torchnlq.config.job_config import option
from torchnlq.config.manager import load_job_config, load_table, read_toml
from torchnlq.config.plugins import import_plugins
from torchnlq.errors import UserError
from torchnlq.experiments.suite_log import read_end

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The suite file's tables: its runs ([[runs]], [grid] or [scaling]) and where and how they run.
TABLES = ("runs", "grid", "scaling", "executor", "sweep")
# Short labels for run names; other grid keys use their last component (the full key if that clashes).
LABELS = {
    "training.seed": "seed", "optimizer.lr": "lr", "optimizer.weight_decay": "wd",
    "lr_schedule.min_lr": "minlr", "model.query.type": "q", "model.mlp_hidden": "mlp",
}


@dataclass(frozen=True)
class SuiteKeys:
    """The keys at the top of a suite file, before its tables ([[runs]], [grid] or [scaling], [executor], [sweep])."""

    name: str | None = option(None, "The suite's name (default: the file's stem).")
    description: str = option("", "Free text about the suite.")
    dump_folder: str | None = option(None, "Where its runs' folders go (default: ./outputs/<the file's stem>).")
    config: str | None = option(None, "The runs' config, relative to the suite file ([[runs]] may give their own).")
    overrides: list[str] = option([], "Overrides of every run, e.g. [\"--training.steps=300\"].")
    baseline: str | None = option(None, "The run (or [[runs]] arm) the others are compared with (default: the first).")
    compare_step: int | None = option(None, "The step the runs are compared at (default: the last one all have).",
                                      min=1)
    plugins: list[str] = option([], "Python modules imported first, so that what they register (an executor, a "
                                "query type) can be named.")


@dataclass(frozen=True)
class RunEntry:
    """One ``[[runs]]`` entry: an arm of the suite."""

    name: str | None = option(None, "The arm's name (its runs' folders start with it).")
    config: str | None = option(None, "Its config, relative to the suite file (default: the suite's config).")
    overrides: list[str] = option([], "Its own overrides, after the suite's.")
    description: str = option("", "Free text about the arm.")


@dataclass(frozen=True)
class SuiteRun:
    """One training run of a suite: its config file and overrides (job.name/dump_folder last)."""

    name: str
    arm: str  # the [[runs]] entry it comes from ("" for a grid over the top-level config)
    config: Path
    overrides: tuple[str, ...]
    steps: int = 0  # training.steps as resolved (run_info.json must match it for "finished")

    def argv(self) -> list[str]:
        """What run_train.sh (and load_job_config) receives."""
        return [display_path(self.config), *self.overrides]


@dataclass
class Suite:
    """A loaded, validated suite."""

    path: Path
    name: str
    description: str
    dump_folder: Path
    runs: list[SuiteRun]
    baseline: str  # name of the baseline run (its seed group is the comparison baseline)
    compare_step: int | None = None  # None: the last validation step all runs have
    scaling: bool = False  # a [scaling] grid: fitted (experiments/scaling.py) rather than tabled at one step
    #: The [executor] table as written (read by experiments/executors.py: where the runs go).
    executor: dict[str, Any] = field(default_factory=dict)
    #: The [sweep] table as written, or None (experiments/sweep.py: its runs are then the arms searched).
    sweep: dict[str, Any] | None = None

    def run_dir(self, run: SuiteRun) -> Path:
        return self.dump_folder / run.name

    def finished(self, run: SuiteRun) -> bool:
        """Whether ``run`` has finished at its steps (its run_info.json says so)."""
        return is_finished(read_run_info(self.run_dir(run)), run.steps)


def display_path(path: Path) -> str:
    """A path relative to the working directory when it lies below it (portable commands), else absolute."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:  # another drive on Windows
        return str(path)


def override_keys(overrides: Sequence[str]) -> set[str]:
    """The dotted keys an argv-style override list sets (``--a.b=1`` and ``--a.b 1`` alike)."""
    return {tok[2:].split("=", 1)[0] for tok in overrides if tok.startswith("--")}


def format_value(value: Any) -> str:
    """A grid value as an override string: booleans lowercase, floats in their shortest exact form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _name_number(value: float) -> str:
    """3e-3 -> '3e-3', 0.5 -> '0.5', 1337 -> '1337': short and readable in a folder name."""
    if isinstance(value, int) or value == 0 or 1e-2 <= abs(value) < 1e5:
        return f"{value:g}"
    mantissa, exponent = f"{value:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def grid_name(values: dict[str, Any], labels: dict[str, str]) -> str:
    """``{"optimizer.lr": 3e-3, "training.seed": 1337}`` -> ``lr3e-3_seed1337``."""
    parts = []
    for key, value in values.items():
        label = labels[key]
        if isinstance(value, bool):
            parts.append(f"{label}-{format_value(value)}")
        elif isinstance(value, (int, float)):
            parts.append(f"{label}{_name_number(value)}")
        else:
            parts.append(f"{label}-{value}")
    return "_".join(parts)


def _distinct(names: list[str]) -> list[str]:
    """Append -2, -3, ... to repeats (values that print alike), so every run has its own folder."""
    out: list[str] = []
    for name in names:
        candidate, k = name, 1
        while candidate in out:
            k += 1
            candidate = f"{name}-{k}"
        out.append(candidate)
    return out


def _expand_grid(where: str, grid: Any) -> list[dict[str, Any]]:
    if not isinstance(grid, dict) or not grid:
        raise UserError(f"{where}: [grid] must map dotted config keys to lists of values")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}: grid key '{key}' needs a non-empty list of values, got {values!r}")
        for value in values:
            try:
                load_job_config([f"--{key}={format_value(value)}"])
            except UserError as e:
                raise UserError(f"{where}: grid key '{key}' = {value!r}: {e}") from None
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise UserError(f"{where}: grid key '{key}' lists {twice[0]!r} twice; "
                            "each value gives one run, list it once")
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def load_suite(path: str | Path, cli_overrides: Sequence[str] = ()) -> Suite:
    """Read, expand and validate a suite file; every problem is a one-line UserError."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise UserError(f"suite file '{path}' not found; pass a suite TOML such as suites/shakespeare_tiny.toml")
    data = read_toml(where)
    keys = load_table(SuiteKeys, where, "", data, ignored=TABLES)
    import_plugins(keys.plugins, f"{where}: plugins")  # before an executor (or query type) they register is named
    here = path.resolve().parent
    shared = keys.overrides
    cli = list(cli_overrides)
    cli_keys = override_keys(cli)
    if "job.name" in cli_keys or "job.name" in override_keys(shared):
        raise UserError(f"{where}: the suite names its runs; do not override job.name")
    dump = keys.dump_folder or f"./outputs/{path.stem}"
    if "job.dump_folder" in override_keys(shared):
        raise UserError(f"{where}: set the suite's dump_folder instead of overriding job.dump_folder")
    # The command line may move the whole suite (--job.dump_folder DIR or =DIR; the last one wins).
    parser = ArgumentParser(prog="run_suite.py", add_help=False, allow_abbrev=False)
    parser.add_argument("--job.dump_folder", dest="dump", nargs="?", const="")  # bare: "" (its own message)
    moved, cli = parser.parse_known_args(cli)
    if moved.dump == "":
        raise UserError("--job.dump_folder needs a value (e.g. --job.dump_folder=DIR), "
                        "the folder the suite's runs go to")
    dump = moved.dump or dump

    for key in ("executor", "sweep"):
        if key in data and not isinstance(data[key], dict):
            raise UserError(f"{where}: {key} must be a table ([{key}] with its keys), got {data[key]!r}")
    if "scaling" in data:
        if "sweep" in data:
            raise UserError(f"{where}: a [scaling] suite fixes each run's settings by rule; remove [sweep] "
                            "(or [scaling])")
        return replace(_scaling_suite(path, keys, data, cli, cli_keys, dump), executor=data.get("executor", {}))
    entries = data.get("runs")
    if entries is None:
        if keys.config is None:
            raise UserError(f"{where}: give a top-level config (with a [grid]) or [[runs]] entries")
        entries = [{"name": ""}]
    elif not isinstance(entries, list) or not entries:
        raise UserError(f"{where}: runs must be a non-empty array of [[runs]] tables")
    combos = _expand_grid(where, data["grid"]) if "grid" in data else [{}]
    # A short, unambiguous label per grid key (used in run names).
    labels = {k: LABELS.get(k, k.split(".")[-1]) for k in data.get("grid", {})}
    labels = {k: (v if list(labels.values()).count(v) == 1 else k.replace(".", "-")) for k, v in labels.items()}

    runs: list[SuiteRun] = []
    arms: set[str] = set()
    for i, entry in enumerate(entries):
        rwhere = f"{where}: runs[{i}]"
        if not isinstance(entry, dict):
            raise UserError(f"{rwhere} must be a table with name, config, overrides")
        run_entry = load_table(RunEntry, where, f"runs[{i}]", entry)
        arm = run_entry.name or ""
        if data.get("runs") is not None and not arm:
            raise UserError(f"{rwhere} needs a name (a string)")
        if arm in arms:
            raise UserError(f"{rwhere}: run name '{arm}' appears twice")
        arms.add(arm)
        config = run_entry.config or keys.config
        if config is None:
            raise UserError(f"{rwhere} needs a config (a TOML path relative to the suite file)")
        config_path = Path(os.path.normpath(here / config))
        if not config_path.is_file():
            raise UserError(f"{rwhere}: config '{config}' not found (looked for {config_path})")
        own = run_entry.overrides
        clash = sorted(cli_keys & (override_keys(own) | set(combos[0])))
        if clash:
            raise UserError(f"--{clash[0]} is set per run by the suite (run '{arm or 'grid'}'); change it in {where}")
        if "job.name" in override_keys(own) or "job.dump_folder" in override_keys(own):
            raise UserError(f"{rwhere}: the suite sets job.name and job.dump_folder; remove them from overrides")
        for combo in combos:
            # A lone run needs a folder name too; characters a folder name should not hold become "_".
            name = re.sub(r"[^A-Za-z0-9._+-]", "_", "_".join(p for p in (arm, grid_name(combo, labels)) if p) or "run")
            grid_args = [f"--{k}={format_value(v)}" for k, v in combo.items()]
            runs.append(SuiteRun(name, arm, config_path, (*shared, *cli, *own, *grid_args)))

    runs = [_validated(where, replace(run, name=name), dump)
            for run, name in zip(runs, _distinct([r.name for r in runs]))]
    if cli_keys:
        _refuse_varied_keys(where, runs, cli, cli_keys)
    return Suite(path, keys.name or path.stem, keys.description, Path(dump), runs,
                 _pick_baseline(where, keys.baseline, runs), keys.compare_step, executor=data.get("executor", {}),
                 sweep=data.get("sweep"))


def _scaling_suite(path: Path, keys: SuiteKeys, data: dict[str, Any], cli: list[str], cli_keys: set[str],
                   dump: str) -> Suite:
    """A suite from a ``[scaling]`` table (torchnlq/experiments/scaling.py): sizes x query types x seeds."""
    from torchnlq.experiments.scaling import expand_scaling
    from torchnlq.train.preflight import check_job_config

    where = str(path)
    if "runs" in data or "grid" in data:
        raise UserError(f"{where}: [scaling] makes the suite's runs; remove [[runs]] and [grid]")
    if keys.config is None:
        raise UserError(f"{where}: [scaling] needs a top-level config (a TOML path relative to the suite file)")
    config_path = Path(os.path.normpath(path.resolve().parent / keys.config))
    if not config_path.is_file():
        raise UserError(f"{where}: config '{keys.config}' not found (looked for {config_path})")
    shared = keys.overrides

    def load(size_args: list[str]) -> tuple[Any, Any]:
        try:
            cfg = load_job_config([str(config_path), *shared, *cli, *size_args])
            return cfg, check_job_config(cfg)
        except UserError as e:
            raise UserError(f"{where}: [scaling] size {' '.join(size_args)}: {e}") from None

    planned = expand_scaling(where, data["scaling"], load)
    ruled = set().union(*(override_keys(r.overrides) for r in planned))
    clash = sorted(cli_keys & ruled)
    if clash:
        raise UserError(f"--{clash[0]} is set per run by the suite's [scaling] rules; change it in {where}")
    runs = [_validated(where, SuiteRun(p.name, p.arm, config_path, (*shared, *cli, *p.overrides)), dump)
            for p in planned]
    if keys.compare_step is not None:
        raise UserError(f"{where}: a scaling suite compares each run at its end; remove compare_step")
    return Suite(path, keys.name or path.stem, keys.description, Path(dump), runs,
                 _pick_baseline(where, keys.baseline, runs), None, scaling=True)


def _refuse_varied_keys(where: str, runs: list[SuiteRun], cli: list[str], keys: set[str]) -> None:
    """A command-line override may not flatten a key whose value differs between the suite's runs."""
    values: dict[str, set[str]] = {key: set() for key in keys}
    for run in runs:
        own = list(run.overrides)
        for tok in cli:  # the run's argv without the command-line overrides (they sit in one block)
            own.remove(tok)
        cfg = load_job_config([str(run.config), *own])
        for key in keys:
            values[key].add(repr(functools.reduce(getattr, key.split("."), cfg)))
    varied = sorted(k for k, v in values.items() if len(v) > 1)
    if varied:
        raise UserError(f"--{varied[0]} differs between the runs of {where} ({', '.join(sorted(values[varied[0]]))}); "
                        "overriding it for all runs would erase the comparison, so edit the suite instead")


def _validated(where: str, run: SuiteRun, dump: str) -> SuiteRun:
    """``run`` with job.name and job.dump_folder last and its steps, its config loaded and its model shapes resolved
    (a typo fails here, before any launch)."""
    from torchnlq.train.preflight import check_job_config

    run = replace(run, overrides=(*run.overrides, f"--job.name={run.name}", f"--job.dump_folder={dump}"))
    try:
        cfg = load_job_config([str(run.config), *run.overrides])
        check_job_config(cfg)  # what the trainer checks first, so a bad run fails before any launch
    except UserError as e:
        raise UserError(f"{where}: run '{run.name}': {e}") from None
    return replace(run, steps=cfg.training.steps)


def _pick_baseline(where: str, baseline: Any, runs: list[SuiteRun]) -> str:
    """The first run whose name or arm is ``baseline`` (default: the first run)."""
    if baseline is None:
        return runs[0].name
    for run in runs:
        if baseline in (run.name, run.arm):
            return run.name
    raise UserError(f"{where}: baseline '{baseline}' is not a run name (runs: {', '.join(r.name for r in runs)})")


# ----- a run's state on disk, and its command (the executors and --status read them too)

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
    return interrupted(suite.run_dir(run), info, run.steps)


#: A train.log step line: ``step   12/100``.
_STEP_LINE = re.compile(r"step\s+(\d+)/(\d+)")


def logged_step(run_dir: Path) -> int | None:
    """The last step train.log reports (None before the first)."""
    steps = _STEP_LINE.findall(read_end(run_dir / "train.log", 65536))
    return int(steps[-1][0]) if steps else None


def interrupted(run_dir: Path, info: dict[str, Any], steps: int) -> str:
    """An unfinished run as its folder shows it: the last step its log reports (run_info.json's when the log says
    none: a record is written at the start and at saves, so a killed run's is behind) and the checkpoint the same
    command resumes from."""
    from torchnlq.checkpoint.checkpointer import list_checkpoints  # DCP's import only when a run is unfinished

    at = logged_step(run_dir)
    at = info.get("step", 0) if at is None else at
    saved = list_checkpoints(run_dir / "checkpoints")
    then = (f"the same command resumes it from step-{saved[-1]}" if saved else
            "no checkpoint: the same command starts it again (the earlier files moved into previous-N/)")
    return f"interrupted at step {at}/{steps}; {then}"


def launcher_command(run: SuiteRun, launcher: Path | None = None) -> list[str]:
    """The command that trains ``run``; the environment (NGPU, ...) passes through unchanged.

    The suite owns its run folders: a run interrupted before its first checkpoint starts again
    (``job.rerun``: its earlier files are set aside, not mixed in), one with a checkpoint resumes.
    """
    script = display_path(launcher or REPO_ROOT / "run_train.sh")
    if not script.startswith(("/", ".")):
        script = f"./{script}"  # a bare name would be looked up on PATH
    return [script, *run.argv(), "--job.rerun=true"]
