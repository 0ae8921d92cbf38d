"""A suite as a command line gives it: ``SUITE.toml [--executor NAME] [--executor.KEY V] [--sweep.KEY V] [overrides]``
read into the suite, its executor (from the registry, with the package's own executors registered) and its sweep,
alike for run_suite.py, a SLURM job's next step and a sweep worker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from torchnlq.config.manager import load_table
from torchnlq.errors import UserError
from torchnlq.experiments import pool, slurm  # noqa: F401 - the package's executors register themselves
from torchnlq.experiments.executors import EXECUTORS, Executor, ExecutorConfig
from torchnlq.experiments.suite import Suite, load_suite
from torchnlq.experiments.sweep import Sweep, parse_sweep


@dataclass
class Command:
    """A suite as a command line gives it: the suite (its runs' overrides applied), its executor and its sweep."""

    suite: Suite
    executor: Executor
    sweep: Sweep | None


def load_command(path: str, options: Sequence[str]) -> Command:
    """``SUITE.toml`` and run_suite.py's options (not its flags): what run_suite.py, a SLURM job's next step and a
    sweep worker read alike."""
    overrides, tables = table_options(options, ("executor", "sweep"))
    suite = load_suite(path, overrides)
    executor = build_executor(str(suite.path), suite.executor, tables["executor"])
    sweep = Sweep(suite, parse_sweep(suite, tables["sweep"])) if suite.sweep is not None or tables["sweep"] else None
    return Command(suite, executor, sweep)


def executors() -> dict[str, type[Executor]]:
    """Every registered executor (the package's own and those of plugins imported so far), by name."""
    return dict(sorted(EXECUTORS.items()))


def build_executor(where: str, table: Mapping[str, Any], options: Mapping[str, str]) -> Executor:
    """The suite's ``[executor]`` with the command line's ``--executor.KEY VALUE`` (strings) on top; every mistake
    one line (an unknown key with the closest known one, a value of the wrong type or out of range)."""
    known = executors()
    base = load_table(ExecutorConfig, where, "executor", {k: v for k, v in table.items() if k == "type"},
                      {k: v for k, v in options.items() if k == "type"}, choices={"type": list(known)})
    cls = known[base.type]
    every = {f.name for c in known.values() for f in fields(c.Config)}
    return cls(load_table(cls.Config, where, "executor", table, options, choices={"type": list(known)},
                          ignored=every))


def submitting() -> list[str]:
    """The executors that submit and return (``--wait`` is theirs)."""
    return [name for name, cls in executors().items() if cls.submits]


def table_options(argv: Sequence[str], tables: Sequence[str]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Take ``--TABLE.KEY VALUE`` / ``--TABLE.KEY=VALUE`` (and ``--executor NAME``) out of ``argv``: (the rest,
    ``{table: {key: text}}``), each text read later by its option's type; the rest are the runs' overrides."""
    rest: list[str] = []
    found: dict[str, dict[str, str]] = {t: {} for t in tables}
    args = iter(argv)
    for arg in args:
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        table, dot, key = name.partition(".")
        if table not in tables or not (dot or table == "executor"):
            rest.append(arg)
            continue
        if dot and not key:
            raise UserError(f"{arg}: name the key, e.g. --{table}.KEY=VALUE (see docs/experiments.md)")
        if not eq:
            value = next(args, "--")
            if value.startswith("--"):
                raise UserError(f"--{name} needs a value (e.g. --{name}=VALUE)")
        found[table][key or "type"] = value  # --executor slurm
    return rest, found
