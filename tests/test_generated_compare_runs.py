"""Generated mistakes (Hypothesis) for compare_runs.py: any mix of finished, damaged and missing run folders,
baselines, steps and output folders; and SIGTERM at chosen moments of a comparison.

The invariant (tests/helpers/generated_tools.py): exit 0 with the comparison, or exit 2 with one ``error:`` line,
and every file the user had still there, byte for byte; SIGTERM leaves exit code 143, one ``terminated:`` line,
and the output folder absent or exactly as it was.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_generated import assert_outcome, scratch

from helpers.generated_tools import (  # noqa: F401 - no_tiktoken_download: an autouse fixture
    SETTINGS, assert_kept, assert_terminated, call, no_tiktoken_download, terminate_at, tree, varied,
)
from helpers.train import tiny_args
from torchnlq.files import OwnedFolder


# ------------------------------------------------------------------ compare_runs.py

@pytest.fixture(scope="module")
def finished_runs() -> Iterator[Path]:
    """Three real tiny runs (a; b with another query; c = a with another seed) and a comparison of them."""
    from torchnlq.experiments.compare import main as compare_main
    from torchnlq.train.__main__ import main as train_main

    with scratch() as tmp:
        common = dict(steps=4, checkpoint__enabled=False, validation__interval=2)
        for name, extra in (("a", {}), ("b", {"model__query__type": "linear"}), ("c", {"training__seed": 7})):
            code, _, err = call(train_main, tiny_args(tmp, name=name, **common, **extra))
            assert code == 0, err
        runs = tmp / "outputs"
        code, _, err = call(compare_main, [*(str(runs / n) for n in "abc"), "--baseline=a", f"--out={tmp}/previous"])
        assert code == 0, err
        yield tmp


DAMAGES = (
    ("train.log", "garbage"), ("train.log", "deleted"),
    ("run_info.json", "truncated"), ("run_info.json", "garbage"), ("run_info.json", "list"),
    ("run_info.json", "empty_object"), ("run_info.json", "wrong_types"), ("run_info.json", "list_fingerprint"),
    ("run_info.json", "folder"), ("config.toml", "truncated"), ("config.toml", "garbage"), ("config.toml", "empty"),
    ("config.toml", "wrong_types"), ("config.toml", "section_not_table"),
    ("tb", "garbage"), ("tb", "truncated"), ("tb", "no_events"), ("tb", "file"),
)
SPECIALS = ("missing", "empty_folder", "link_to_first", "dotdot_first", "folder_of_runs", "a_file")


def damage(run: Path, what: str, how: str) -> None:
    path = run / what
    if what == "tb":
        events = next(path.iterdir())
        if how == "garbage":
            events.write_bytes(bytes(range(256)) * 8)
        elif how == "truncated":
            events.write_bytes(events.read_bytes()[: events.stat().st_size // 2])
        elif how == "no_events":
            events.unlink()
        else:
            shutil.rmtree(path)
            path.write_text("not a folder\n")
    elif how == "garbage":
        path.write_bytes(b"\xff\xfe\x00garbage\x80")
    elif how == "deleted":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "list":
        path.write_text("[1, 2]")
    elif how == "empty_object":
        path.write_text("{}")
    elif how == "empty":
        path.write_text("")
    elif how == "folder":
        path.unlink()
        path.mkdir()
    elif how == "list_fingerprint":  # the trainer's record, one value of the wrong type
        path.write_text(json.dumps({**json.loads(path.read_text()), "batch_fingerprint": ["122e", "24df"]}))
    elif how == "section_not_table":  # the trainer's config, its [data] table a number
        path.write_text("data = 5\n" + path.read_text().replace("[data]\n", "[moved_data]\n"))
    elif what == "run_info.json":  # wrong_types
        path.write_text(json.dumps({"name": 5, "world_size": "two", "batch_fingerprint": [1], "finished": "yes",
                                    "validation_fingerprint": {"a": 1}, "non_embedding_params": "many"}))
    else:  # config.toml, wrong_types
        path.write_text('[optimizer]\nlr = "fast"\nweight_decay = []\n[lr_schedule]\nmin_lr = true\n'
                        '[training]\nseed = "x"\n')


GOOD_RUN = st.tuples(st.just("run"), st.sampled_from("abc"), st.none())
ENTRY = st.one_of(
    GOOD_RUN, GOOD_RUN,
    st.tuples(st.just("run"), st.sampled_from("abc"), st.sampled_from(DAMAGES)),
    st.tuples(st.just("special"), st.sampled_from(SPECIALS), st.none()),
)
GOOD_COMPARE = {"entries": [("run", "a", None), ("run", "b", None), ("run", "c", None)], "baseline": "a",
                "out": "new", "step": None, "x": None, "allow_different_data": False}
COMPARE = varied(GOOD_COMPARE, {
    "entries": st.lists(ENTRY, min_size=1, max_size=3),
    "baseline": st.sampled_from(["a", "b", "first", "nobody", "missing_path"]),
    "out": st.sampled_from(["new", "user_file", "user_comparison", "user_notes", "previous", "inside_run",
                            "under_file"]),
    "step": st.none() | st.sampled_from(["4", "2", "3", "0", "-1", "x", "1" + "0" * 30]),
    "x": st.none() | st.sampled_from(["steps", "tokens", "bytes"]),
    "allow_different_data": st.booleans(),
})


def lay_out_runs(tmp: Path, runs: Path, entries: list) -> list[str]:
    given: list[str] = []
    for i, (kind, what, harm) in enumerate(entries):
        path = tmp / "runs" / f"{i}-{what}"
        if kind == "run":
            shutil.copytree(runs / what, path, symlinks=True)
            if harm is not None:
                damage(path, *harm)
        elif what == "empty_folder":
            path.mkdir(parents=True)
        elif what == "link_to_first" and given:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(Path(given[0]).resolve())
        elif what == "dotdot_first" and given:
            path = Path(given[0]) / ".." / Path(given[0]).name
        elif what == "folder_of_runs":
            for name in "ab":
                shutil.copytree(runs / name, path / name)
        elif what == "a_file":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("not a run\n")
        given.append(str(path))  # "missing" (and a link with nothing to point at) stays absent
    return given


def compare_out(tmp: Path, previous: Path, state: str, given: list[str]) -> Path:
    out = tmp / "cmp"
    if state == "user_file":
        out.write_text("my own file\n")
    elif state == "user_comparison":
        out.mkdir()
        (out / "comparison.md").write_text("my own notes\n")
    elif state == "user_notes":
        out.mkdir()
        (out / "notes.txt").write_text("kept\n")
    elif state == "previous":
        shutil.copytree(previous, out)
        (out / "notes.txt").write_text("kept\n")
    elif state == "inside_run":
        out = Path(given[0]) / "cmp"
    elif state == "under_file":
        (tmp / "afile").write_text("a file\n")
        out = tmp / "afile" / "cmp"
    return out


@pytest.mark.integration  # the runs are trained (in this process, once per module)
@settings(max_examples=40, **SETTINGS)
@given(COMPARE)
@example(GOOD_COMPARE)
@example({**GOOD_COMPARE, "out": "previous", "x": "tokens", "step": "2"})
@example({**GOOD_COMPARE, "entries": [("run", "a", ("config.toml", "empty"))]})  # was a KeyError
@example({**GOOD_COMPARE, "entries": [("run", "a", ("config.toml", "wrong_types")), ("run", "b", None)],
          "allow_different_data": True})  # was a ValueError (a string formatted as a number)
@example({**GOOD_COMPARE, "entries": [("run", "a", ("run_info.json", "wrong_types")), ("run", "b", None)],
          "baseline": "first", "allow_different_data": True})  # was a ValueError (a string formatted with ',')
@example({**GOOD_COMPARE, "entries": [("run", "a", ("run_info.json", "list_fingerprint")), ("run", "b", None)]})
# (above: was a TypeError, a list in a set)
@example({**GOOD_COMPARE, "entries": [("run", "a", ("config.toml", "section_not_table"))]})  # was an AttributeError
@example({**GOOD_COMPARE, "entries": [("run", "a", ("run_info.json", "empty_object"))], "baseline": "first"})
@example({**GOOD_COMPARE, "entries": [("run", "a", ("tb", "garbage")), ("run", "b", None)]})
def test_compare_runs_any_run_folders_compare_or_are_one_line(finished_runs: Path, draw: dict) -> None:
    from torchnlq.experiments.compare import main as compare_main

    with scratch() as tmp:
        given = lay_out_runs(tmp, finished_runs / "outputs", draw["entries"])
        out = compare_out(tmp, finished_runs / "previous", draw["out"], given)
        baseline = {"first": given[0], "missing_path": str(tmp / "nowhere")}.get(draw["baseline"], draw["baseline"])
        argv = [*given, f"--baseline={baseline}", f"--out={out}"]
        argv += [f"--{k.replace('_', '-')}={draw[k]}" for k in ("step", "x") if draw[k] is not None]
        argv += ["--allow-different-data"] if draw["allow_different_data"] else []
        before = tree(tmp)
        with contextlib.chdir(tmp):
            code, stdout, err = call(compare_main, argv)
        assert_outcome(code, err)
        rel_out = str(out.relative_to(tmp)) if out.is_relative_to(tmp) else "-"
        owned = OwnedFolder(finished_runs / "previous").owned | {OwnedFolder.MANIFEST}
        replaced = {f"{rel_out}/{name}" for name in owned} if draw["out"] == "previous" else set()
        assert_kept(before, tree(tmp), code, may_replace=replaced, may_add=(rel_out,))
        if code == 0:  # the promised result: the table, a row per seed group, a line per run
            table = (out / "comparison.md").read_text()
            assert stdout.startswith(table)
            groups = (out / "comparison.csv").read_text().splitlines()[1:]
            runs = (out / "runs.csv").read_text().splitlines()[1:]
            given_runs = sum(1 if kind == "run" else 2 * (what == "folder_of_runs")
                             for kind, what, _ in draw["entries"])
            assert len(runs) == given_runs >= len(groups) >= 1, (runs, groups)
            assert all(f"| {g.split(',')[0]} |" in table for g in groups)



# ------------------------------------------------------------------ SIGTERM in the middle of compare_runs.py

COMPARE_MOMENTS = [
    "torchnlq.experiments.compare:load_run:after:1",  # one run read, nothing written
    "torchnlq.files:OwnedFolder.write:after:1",  # comparison.md written, the rest not
    "torchnlq.files:OwnedFolder.write:after:3",  # the tables written, the plots not
]


@pytest.mark.integration
@pytest.mark.parametrize("moment", COMPARE_MOMENTS)
@pytest.mark.parametrize("previous", [False, True], ids=["new-out", "previous-comparison"])
def test_sigterm_during_compare_runs_leaves_no_partial_output_and_a_rerun_finishes(finished_runs, tmp_path, moment,
                                                                                   previous):
    for name in "ab":
        shutil.copytree(finished_runs / "outputs" / name, tmp_path / name)
    out = tmp_path / "cmp"
    if previous:  # an earlier comparison there (it compared a, b and c) and a file of the user's
        shutil.copytree(finished_runs / "previous", out)
        (out / "notes.txt").write_text("kept\n")
    before = tree(tmp_path)
    argv = [str(tmp_path / "a"), str(tmp_path / "b"), "--baseline=a", f"--out={out}"]
    code, output = terminate_at(tmp_path, moment, "compare_runs.py", *argv)
    assert_terminated(code, output)
    assert tree(tmp_path) == before  # the output folder absent, or exactly as it was
    from torchnlq.experiments.compare import main as compare_main

    code, _, err = call(compare_main, argv)
    assert code == 0, err
    runs = (out / "runs.csv").read_text().splitlines()[1:]
    assert [line.split(",")[0] for line in runs] == ["a", "b"]  # this comparison's, not the previous one's
