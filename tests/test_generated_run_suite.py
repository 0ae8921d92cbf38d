"""Generated mistakes (Hypothesis) for run_suite.py --dry-run: any suite file (keys set, removed or of the wrong
type, runs and grids replaced, broken TOML) and command-line overrides.

The invariant (tests/helpers/generated_tools.py): exit 0 with one command per run, or exit 2 with one ``error:``
line; nothing is launched.
"""

from __future__ import annotations

import contextlib
import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_generated import assert_outcome, scratch
from test_suite import BASE as BASE_CONFIG  # the small model of tests/test_suite.py

from helpers.generated_tools import SETTINGS, call, no_tiktoken_download, tree  # noqa: F401 - an autouse fixture


# ------------------------------------------------------------------ run_suite.py (--dry-run: nothing is launched)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value == math.inf else "-inf" if value == -math.inf
                                               else repr(value))
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)  # int (beyond 64 bits is itself a mistake: TOML refuses it)


SCALARS = st.one_of(st.integers(-2, 3), st.sampled_from([10**30, 2**63, 1.5, float("nan"), True, "", "x", [1], []]))
OVERRIDES = st.sampled_from(["--training.steps=3", "--training.steps=-5", "--training.steps=1e999", "--nope.key=1",
                             "--job.name=x", "--job.dump_folder=elsewhere", "not-a-flag", "--optimizer.lr=two",
                             "--model.dim=1000000000000", "--model.query.type=residual_mlp"])
VALUES = st.one_of(st.sampled_from(["base", "res", "base_seed1", "../configs/base.toml", "../configs/missing.toml",
                                    "../configs"]), st.lists(OVERRIDES, max_size=2), SCALARS)
GRID_VALUES = st.lists(st.sampled_from([1, 2, 1e-3, 10**18, "x", "linear", True]), max_size=3) | SCALARS
DELETE = object()
GOOD_SUITE = {"top": {"config": "../configs/base.toml", "baseline": "base", "overrides": ["--training.steps=3"]},
              "runs": [{"name": "base"}, {"name": "res", "overrides": ["--model.query.type=residual_mlp"]}],
              "grid": {"training.seed": [1, 2]}, "raw": "", "cli": []}
# One change to the good suite: a top-level key, a run's key or a grid key set (to anything) or removed, the runs
# or the grid replaced whole, a line of broken TOML, a command-line override.
CHANGE = st.one_of(
    st.tuples(st.just("top"), st.sampled_from(["name", "description", "dump_folder", "config", "overrides", "baseline",
                                               "compare_step", "nmae"]), VALUES | st.just(DELETE)),
    st.tuples(st.just("run"), st.integers(0, 1),
              st.sampled_from(["name", "config", "overrides", "description", "nmae"]), VALUES | st.just(DELETE)),
    st.tuples(st.just("grid"), st.sampled_from(["training.seed", "optimizer.lr", "model.dim", "no.such",
                                                "model.query.type"]), GRID_VALUES | st.just(DELETE)),
    st.tuples(st.just("runs"), st.none() | st.lists(st.fixed_dictionaries({"name": st.sampled_from(["base", "x"])}),
                                                    max_size=2) | SCALARS),
    st.tuples(st.just("grid_whole"), st.none() | SCALARS),
    st.tuples(st.just("raw"), st.sampled_from(['name = "twice"\nname = "again"', "= broken", "[runs]\nname = 1"])),
    st.tuples(st.just("cli"), OVERRIDES | st.sampled_from(["--job.dump_folder", "--training.steps", "--dry-run"])),
)


def changed_suite(changes: list[tuple]) -> dict:
    suite = json.loads(json.dumps(GOOD_SUITE))
    for kind, *what in changes:
        if kind in ("top", "grid", "run"):
            *where, key, value = what
            table = suite["top"] if kind == "top" else suite["grid"] if kind == "grid" else (
                suite["runs"][where[0]] if isinstance(suite["runs"], list) and where[0] < len(suite["runs"]) else None)
            if not isinstance(table, dict):
                continue
            if value is DELETE:
                table.pop(key, None)
            else:
                table[key] = value
        elif kind == "runs":
            suite["runs"] = what[0]
        elif kind == "grid_whole":
            suite["grid"] = what[0]
        elif kind == "raw":
            suite["raw"] = what[0]
        else:
            suite["cli"].append(what[0])
    return suite


SUITE = st.lists(CHANGE, max_size=3).map(changed_suite)


def suite_text(draw: dict) -> str:
    lines = [f"{key} = {toml_value(value)}" for key, value in draw["top"].items()]
    lines.append(draw["raw"])
    if draw["grid"] is not None:
        if isinstance(draw["grid"], dict):
            lines += ["[grid]", *(f'"{k}" = {toml_value(v)}' for k, v in draw["grid"].items())]
        else:
            lines = [f"grid = {toml_value(draw['grid'])}", *lines]
    if isinstance(draw["runs"], list) and all(isinstance(run, dict) for run in draw["runs"]):
        for run in draw["runs"]:
            lines += ["[[runs]]", *(f"{k} = {toml_value(v)}" for k, v in run.items())]
    elif draw["runs"] is not None:
        lines = [f"runs = {toml_value(draw['runs'])}", *lines]
    return "\n".join(lines) + "\n"


def expected_runs(draw: dict) -> int:
    """Every [[runs]] entry (one, the top-level config, without any) crossed with every grid value."""
    runs = len(draw["runs"]) if isinstance(draw["runs"], list) else 1
    return runs * math.prod(len(values) for values in (draw["grid"] or {}).values())


@settings(max_examples=40, **SETTINGS)
@given(SUITE)
@example(GOOD_SUITE)
@example({**GOOD_SUITE, "runs": [{"name": "base"}, {"name": "base"}]})
@example({**GOOD_SUITE, "top": {**GOOD_SUITE["top"], "compare_step": 10**30}})
def test_run_suite_any_suite_file_prints_its_commands_or_is_one_line(draw: dict) -> None:
    from torchnlq.experiments.suite_run import main as suite_main

    with scratch() as tmp:
        (tmp / "configs").mkdir()
        (tmp / "configs" / "base.toml").write_text(BASE_CONFIG)
        (tmp / "suites").mkdir()
        path = tmp / "suites" / "s.toml"
        path.write_text(suite_text(draw))
        before = tree(tmp)
        with contextlib.chdir(tmp):
            code, stdout, err = call(suite_main, [str(path), "--dry-run", *draw["cli"]])
        assert_outcome(code, err)
        assert tree(tmp) == before  # a dry run writes nothing, whatever the outcome
        if code == 0:  # one comment and one command per run, each run with its own folder; then the budget
            lines = stdout.split("\n\n# budget")[0].splitlines()
            assert "\n# budget" in stdout
            assert lines[0].startswith("# suite ")
            commands = lines[2::2]
            names = [c.split("--job.name=")[1].split()[0] for c in commands]
            assert len(commands) == len(lines[1::2]) == expected_runs(draw) and len(set(names)) == len(names)
