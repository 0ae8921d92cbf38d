"""Generated mistakes (Hypothesis) for the tools: prepare_data, compare_runs, run_suite, evaluate, generate.

tests/test_generated.py draws the trainer's options, run-folder states and checkpoint records; this
file holds the other entry points to the same invariant: exit 0 with the promised result, or exit 2
with exactly one ``error:`` line, no traceback, and every file the user had still there, byte for
byte. The SIGTERM tests hold prepare_data.py and compare_runs.py at a chosen moment (a wrapper that
pauses inside the real script, in a subprocess) and check that the signal leaves exit code 143, one
``terminated:`` line, and the output folder absent or exactly as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, example, given, settings
from hypothesis import strategies as st

from torchnlq.cli import run_cli
from torchnlq.data import token_format as fmt
from torchnlq.data.prepare import TOKEN_FILES
from torchnlq.files import OwnedFolder

from helpers import REPO_ROOT
from helpers.checkpoints import load_script, tiny_model, write_byte_data, write_checkpoint
from helpers.data import SHARED_GPT2, write_token_folder, write_toy_tiktoken
from helpers.train import script_env, tiny_args
from test_generated import SETTINGS as TRAINER_SETTINGS
from test_generated import assert_outcome, scratch
from test_suite import BASE as BASE_CONFIG  # the small model of tests/test_suite.py

SETTINGS = {**TRAINER_SETTINGS,
            "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]}
HAVE_GPT2 = SHARED_GPT2.is_file()


@pytest.fixture(autouse=True)
def _no_tiktoken_download(monkeypatch: pytest.MonkeyPatch) -> None:
    """No drawn case may reach tiktoken's download: every gpt2 case names its ranks file."""
    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def tree(root: Path) -> dict[str, str]:
    """Every entry below ``root``: a file's sha256, ``dir``, or a link's target (links are not followed)."""
    entries: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                entries[rel] = f"link -> {os.readlink(path)}"
            elif path.is_dir():
                entries[rel] = "dir"
            else:
                entries[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return entries


def call(main, argv: list[str]) -> tuple[int, str, str]:  # noqa: ANN001 - a main(argv)
    """``run_cli(main, argv)`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(main, argv)
    if currently_in_test_context():
        event(f"exit {code}")  # --hypothesis-show-statistics: how many drawn cases succeed
    return code, out.getvalue(), err.getvalue()


def assert_kept(before: dict[str, str], after: dict[str, str], code: int, may_replace: set[str] = frozenset(),
                may_add: tuple[str, ...] = ()) -> None:
    """A refusal changes nothing at all; a success keeps every entry but ``may_replace``, adding only below
    ``may_add``."""
    if code != 0:
        assert after == before, {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys()
                                 if before.get(k) != after.get(k)}
        return
    for path, value in before.items():
        if path not in may_replace:
            assert after.get(path) == value, (path, value, after.get(path))
    added = sorted(set(after) - set(before))
    assert all(any(p == a or p.startswith(a + os.sep) for a in may_add) for p in added), (added, may_add)


def int_text(low: int = -3, high: int = 40, huge: bool = True) -> st.SearchStrategy[str]:
    """An integer option's value as typed: small numbers, and the mistakes (words, floats, hex, huge)."""
    mistakes = ["", "two", "1.5", "1e3", "0x10", "nan", " 7"]
    mistakes += ["1000000000000", "99999999999999999999"] if huge else []
    return st.one_of(st.integers(low, high).map(str), st.sampled_from(mistakes))


FLOAT_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "1", "0.5", "1e-45", "5e-324", "1e308", "nan", "-inf", "two", ""]),
)


def varied(good: dict, pools: dict[str, st.SearchStrategy], max_changes: int = 3) -> st.SearchStrategy[dict]:
    """``good`` with up to ``max_changes`` of its entries drawn from ``pools``: single mistakes, pairs and triples,
    and (a pool holds good values too) enough successes for the promised result to be checked."""
    return st.dictionaries(st.sampled_from(sorted(pools)), st.just(None), max_size=max_changes).flatmap(
        lambda keys: st.fixed_dictionaries({k: pools[k] for k in keys})).map(lambda changes: {**good, **changes})


# ------------------------------------------------------------------ prepare_data.py --out

TEXT = "The first paragraph.\n\nA second one,\non two lines.\n\nThird.\n\nAnd the fourth, ü.\n"
INPUTS = ("text", "jsonl", "empty", "binary", "folder", "link", "missing", "one_document", "bad_json")
OUT_STATES = ("absent", "empty", "user_files", "foreign_meta", "nanogpt", "token_folder", "file", "link_to_empty",
              "link_to_user_folder", "parent_is_file", "read_only")
# (tokenizer, --tiktoken-file); the real GPT-2 ranks only where ../shared has them.
TOKENIZERS = [("byte", None), ("gpt2", "missing"), ("gpt2", "garbage"), ("gpt2", "toy"), ("sentencepiece", None)] + (
    [("gpt2", "shared"), ("byte", "shared")] if HAVE_GPT2 else [])


def make_input(user: Path, kind: str, i: int) -> Path:
    suffix = ".jsonl" if kind in ("jsonl", "bad_json") else ".txt"
    path = user / f"in{i}-{kind}{suffix}"
    if kind == "text":
        path.write_text(TEXT)
    elif kind == "jsonl":
        path.write_text("".join(json.dumps({"text": f"record {n} of file {i}", "id": n}) + "\n" for n in range(4)))
    elif kind == "empty":
        path.write_text("")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "folder":
        path.mkdir()
        (path / "inside.txt").write_text(TEXT)
    elif kind == "link":
        (user / f"target{i}.txt").write_text(TEXT)
        path.symlink_to(user / f"target{i}.txt")
    elif kind == "one_document":
        path.write_text("just one line without a blank one")
    elif kind == "bad_json":
        path.write_text('{"text": "fine"}\n{not json\n')
    return path  # "missing": never created


def make_out(tmp: Path, state: str) -> Path:
    out = tmp / "out"
    elsewhere = tmp / "user" / "elsewhere"
    if state == "empty":
        out.mkdir()
    elif state == "user_files":
        out.mkdir()
        (out / "notes.txt").write_text("the user's notes\n")
    elif state == "foreign_meta":
        out.mkdir()
        (out / "meta.json").write_text('{"tokenizer": "somebody else\'s", "vocab": 5}')
        (out / "notes.txt").write_text("the user's notes\n")
    elif state == "nanogpt":
        out.mkdir()
        np.arange(500, dtype=np.uint16).tofile(out / "train.bin")
        np.arange(100, dtype=np.uint16).tofile(out / "val.bin")
    elif state == "token_folder":
        write_token_folder(out, np.full(64, 7), np.full(16, 8))
        (out / "notes.txt").write_text("kept beside the token files\n")
    elif state == "file":
        out.write_text("a file of the user's where the folder would go\n")
    elif state in ("link_to_empty", "link_to_user_folder"):
        elsewhere.mkdir(parents=True)
        if state == "link_to_user_folder":
            (elsewhere / "precious.txt").write_text("the user's\n")
        out.symlink_to(elsewhere)
    elif state == "parent_is_file":
        (tmp / "afile").write_text("a file\n")
        out = tmp / "afile" / "out"
    elif state == "read_only":  # root writes anyway: the case then checks the success
        out.mkdir()
        out.chmod(0o555)
    return out


def prepare_argv(tmp: Path, user: Path, draw: dict) -> tuple[list[str], Path]:
    out = make_out(tmp, draw["out"])
    files = [make_input(user, kind, i) for i, kind in enumerate(draw["inputs"])]
    if draw["twice"]:
        files.append(files[0])
    tokenizer, ranks = draw["tokenizer"]
    argv = [f"--out={out}", "--files", *map(str, files), f"--tokenizer={tokenizer}", f"--num-proc={draw['num_proc']}"]
    if ranks is not None:
        argv.append("--tiktoken-file=" + str({
            "missing": tmp / "nowhere.tiktoken", "garbage": files[0], "shared": SHARED_GPT2,
            "toy": write_toy_tiktoken(user / "toy.tiktoken"),
        }[ranks]))
    for option in ("val_fraction", "split_seed", "text_split", "text_field"):
        if draw[option] is not None:
            argv.append(f"--{option.replace('_', '-')}={draw[option]}")
    if draw["cache"] is not None:
        argv.append("--cache-dir=" + str({"new": tmp / "cache", "user_file": user / "notes.txt",
                                          "under_file": user / "notes.txt" / "cache"}[draw["cache"]]))
    if draw["overwrite"]:
        argv.append("--overwrite")
    return argv, out


GOOD_PREPARE = {"inputs": ["text"], "twice": False, "out": "absent", "overwrite": False, "tokenizer": ("byte", None),
                "val_fraction": "0.3", "split_seed": None, "text_split": "paragraph", "text_field": None,
                "num_proc": "1", "cache": None}
PREPARE = varied(GOOD_PREPARE, {
    "inputs": st.lists(st.sampled_from(INPUTS), min_size=1, max_size=2),
    "twice": st.booleans(),
    "out": st.sampled_from(OUT_STATES),
    "overwrite": st.booleans(),
    "tokenizer": st.sampled_from(TOKENIZERS),
    "val_fraction": st.none() | st.sampled_from(["0.3", "0.5", "0", "1", "-0.2", "nan", "inf", "1e-12", "two", ""]),
    "split_seed": st.none() | st.sampled_from(["0", "-1", "4294967296", "99999999999999999999", "1.5", "x"]),
    "text_split": st.none() | st.sampled_from(["file", "paragraph", "line", "word"]),
    "text_field": st.none() | st.sampled_from(["text", "body", ""]),
    "num_proc": st.sampled_from(["1", "0", "-4"]),  # never a worker pool: in-process and quick
    "cache": st.none() | st.sampled_from(["new", "user_file", "under_file"]),
})


def check_token_folder(out: Path, tokenizer: str) -> None:
    """What prepare promises: the three files, meta.json's counts equal to the files, every id in the vocabulary."""
    assert fmt.is_complete(out)
    meta = json.loads((out / fmt.META_NAME).read_text())
    assert meta["tokenizer"] == tokenizer
    for split in fmt.SPLITS:
        ids = np.fromfile(fmt.split_file(out, split), dtype=np.dtype(meta.get("dtype", "uint16")))
        assert len(ids) == meta["tokens"][split] > 0
        assert ids[-1] == meta["eot_id"] and int(ids.max()) < meta["vocab_size"]
        assert np.count_nonzero(ids == meta["eot_id"]) >= meta["documents"][split] > 0
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


@settings(max_examples=40, **SETTINGS)
@given(PREPARE)
@example(GOOD_PREPARE)
@example({**GOOD_PREPARE, "out": "token_folder", "overwrite": True, "inputs": ["jsonl", "link"]})
@example({**GOOD_PREPARE, "out": "foreign_meta"})
@example({**GOOD_PREPARE, "out": "link_to_user_folder", "overwrite": True})
@(example({**GOOD_PREPARE, "tokenizer": ("gpt2", "shared")}) if HAVE_GPT2 else lambda test: test)
def test_prepare_data_any_options_give_a_token_folder_or_one_line(draw: dict) -> None:
    script = load_script("prepare_data")
    with scratch() as tmp:
        user = tmp / "user"
        user.mkdir()
        (user / "notes.txt").write_text("the user's own notes\n")
        argv, out = prepare_argv(tmp, user, draw)
        before = tree(tmp)
        try:
            code, stdout, err = call(script.main, argv)
            after = tree(tmp)
        finally:
            if out.is_dir():
                out.chmod(0o755)
        assert_outcome(code, err)
        real_out = str(out.resolve().relative_to(tmp.resolve()))
        # --overwrite replaces train.bin, val.bin and meta.json of a folder holding any of them (docs/data.md),
        # another tool's meta.json or a nanoGPT train.bin included; never another file there.
        replaced = {f"{real_out}/{name}" for name in TOKEN_FILES} if draw["overwrite"] else set()
        assert_kept(before, after, code, may_replace=replaced, may_add=(real_out, "cache"))
        if code == 0:
            assert stdout.startswith(f"wrote {out}: train.bin, val.bin, meta.json")
            check_token_folder(out, draw["tokenizer"][0])


# ------------------------------------------------------------------ prepare_data.py --adopt

SPLIT_STATES = ("ok", "empty", "odd", "too_big_id", "missing", "folder", "link")
META_STATES = ("absent", "foreign", "folder", "link")


def lay_out_nanogpt(folder: Path, user: Path, draw: dict) -> None:
    folder.mkdir()
    for split in fmt.SPLITS:
        path, state = folder / f"{split}.bin", draw[split]
        ids = np.r_[np.arange(200) % 256, 256].astype(np.uint16)
        if state == "ok":
            ids.tofile(path)
        elif state == "empty":
            path.write_bytes(b"")
        elif state == "odd":
            path.write_bytes(ids.tobytes() + b"\x01")
        elif state == "too_big_id":
            np.r_[ids, 60000].astype(np.uint16).tofile(path)
        elif state == "folder":
            path.mkdir()
        elif state == "link":
            ids.tofile(user / f"{split}-elsewhere.bin")
            path.symlink_to(user / f"{split}-elsewhere.bin")
    if draw["meta"] == "foreign":
        (folder / "meta.json").write_text('{"tokenizer": "theirs"}')
    elif draw["meta"] == "folder":
        (folder / "meta.json").mkdir()
    elif draw["meta"] == "link":
        (folder / "meta.json").symlink_to(user / "notes.txt")
    if draw["pickle"]:
        (folder / "meta.pkl").write_bytes(b"\x80\x04not to be unpickled")


GOOD_ADOPT = {"train": "ok", "val": "ok", "meta": "absent", "pickle": False, "overwrite": False, "tokenizer": "byte",
              "extra": []}
ADOPT = varied(GOOD_ADOPT, {
    "train": st.sampled_from(SPLIT_STATES), "val": st.sampled_from(SPLIT_STATES), "meta": st.sampled_from(META_STATES),
    "pickle": st.booleans(), "overwrite": st.booleans(), "tokenizer": st.sampled_from(["byte", "gpt2", "bpe"]),
    "extra": st.sampled_from([[], ["--val-fraction=0.1"], ["--files", "x.txt"], ["--out=elsewhere"]]),
})


@settings(max_examples=30, **SETTINGS)
@given(ADOPT)
@example({**GOOD_ADOPT, "pickle": True})
@example({**GOOD_ADOPT, "val": "link", "meta": "link", "overwrite": True, "tokenizer": "gpt2"})
def test_prepare_data_adopt_any_folder_state_writes_only_meta_json_or_one_line(draw: dict) -> None:
    script = load_script("prepare_data")
    with scratch() as tmp:
        user, folder = tmp / "user", tmp / "nanogpt"
        user.mkdir()
        (user / "notes.txt").write_text("the user's own notes\n")
        lay_out_nanogpt(folder, user, draw)
        before = tree(tmp)
        with contextlib.chdir(tmp):
            code, stdout, err = call(script.main, [f"--adopt={folder}", f"--tokenizer={draw['tokenizer']}",
                                                   *draw["extra"], *(["--overwrite"] if draw["overwrite"] else [])])
        assert_outcome(code, err)
        after = tree(tmp)
        # Only meta.json (a link there is replaced, its target never written through).
        assert_kept(before, after, code, may_replace={"nanogpt/meta.json"}, may_add=("nanogpt/meta.json",))
        if code == 0:
            assert stdout.startswith(f"adopted {folder} (tokenizer {draw['tokenizer']}): wrote meta.json only")
            meta = json.loads((folder / "meta.json").read_text())
            for split in fmt.SPLITS:
                ids = np.fromfile(folder / f"{split}.bin", dtype=fmt.DTYPE)
                assert meta["tokens"][split] == len(ids) and meta["max_token_id"][split] == int(ids.max())
            assert not (folder / "meta.json").is_symlink()
            assert (user / "notes.txt").read_text() == "the user's own notes\n"


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
        if code == 0:  # one comment and one command per run, each run with its own folder
            lines = stdout.splitlines()
            assert lines[0].startswith("# suite ")
            commands = lines[2::2]
            names = [c.split("--job.name=")[1].split()[0] for c in commands]
            assert len(commands) == len(lines[1::2]) == expected_runs(draw) and len(set(names)) == len(names)


# ------------------------------------------------------------------ evaluate.py and generate.py

MC_ROWS = [{"ctx": "The cat", "endings": ["sat.", "flew to the moon.", "ran"], "label": 0},
           {"ctx_a": "One", "ctx_b": "two", "endings": ["three", "seven"], "label": "1"}]


@pytest.fixture(scope="module")
def model_files() -> Iterator[Path]:
    """A tiny byte-tokenizer checkpoint, its export, a data folder and multiple-choice files."""
    with scratch() as tmp:
        write_checkpoint(tmp / "ckpt", tiny_model("linear"))
        code, _, err = call(load_script("convert_checkpoint").main, [str(tmp / "ckpt"), str(tmp / "export")])
        assert code == 0, err
        write_byte_data(tmp / "data")
        (tmp / "empty_folder").mkdir()
        (tmp / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MC_ROWS))
        (tmp / "mc_empty.jsonl").write_text("\n\n")
        (tmp / "mc_bad.jsonl").write_text('{"ctx": "a", "endings": ["b", "c"], "label": 5}\n{oops\n')
        (tmp / "mc_binary.jsonl").write_bytes(b"\xff\xfe\x00\x80\n")
        yield tmp


SOURCES = st.sampled_from(["ckpt", "export", "data", "missing", "mc.jsonl"])
DEVICES = st.sampled_from(["cpu", "cpu", "auto", "cuda", "cuda:9", "meta", "tpu", ""])


def source_path(root: Path, name: str) -> str:
    return str(root / ("nowhere" if name == "missing" else name))


GOOD_EVALUATE = {"source": "ckpt", "mode": "data", "data": "data", "mc": "mc.jsonl", "options": {}, "device": "cpu",
                 "plugins": None}
EVALUATE = varied(GOOD_EVALUATE, {
    "source": SOURCES,
    "mode": st.sampled_from(["data", "multiple-choice", "multiple-choice", "both", "neither"]),
    "data": st.sampled_from(["data", "missing", "empty_folder", "ckpt", "mc.jsonl"]),
    "mc": st.sampled_from(["mc.jsonl", "mc_empty.jsonl", "mc_bad.jsonl", "mc_binary.jsonl", "missing", "data"]),
    "options": st.dictionaries(
        st.sampled_from(["sequences", "micro-batch-size", "seed", "seq-len", "limit", "batch-size"]),
        int_text(), max_size=3),
    "device": DEVICES,
    "plugins": st.none() | st.sampled_from(["", "json", "no_such_module_here", "../x"]),
})


def report(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.splitlines())


@settings(max_examples=40, **SETTINGS)
@given(EVALUATE)
@example(GOOD_EVALUATE)
@example({**GOOD_EVALUATE, "source": "export", "mode": "multiple-choice", "options": {"limit": "1"}})
@example({**GOOD_EVALUATE, "options": {"sequences": "3", "micro-batch-size": "1000000000000"}})
def test_evaluate_any_options_report_or_are_one_line(model_files: Path, draw: dict) -> None:
    script = load_script("evaluate")
    options = draw["options"]
    argv = [source_path(model_files, draw["source"])]
    if draw["mode"] in ("data", "both"):
        argv.append(f"--data={source_path(model_files, draw['data'])}")
    if draw["mode"] in ("multiple-choice", "both"):
        argv.append(f"--multiple-choice={source_path(model_files, draw['mc'])}")
    argv += [f"--{k}={v}" for k, v in options.items()] + [f"--device={draw['device']}"]
    argv += [f"--plugins={draw['plugins']}"] if draw["plugins"] is not None else []
    before = tree(model_files)
    code, stdout, err = call(script.main, argv)
    assert_outcome(code, err)
    assert tree(model_files) == before  # evaluate writes nothing
    if code == 0:
        result = report(stdout)
        if draw["mode"] == "data":
            assert math.isfinite(float(result["val_loss"])) and float(result["perplexity"]) > 1
            assert int(result["sequences"]) == int(options.get("sequences", 10))  # the run's recorded 10
        else:
            assert 0 <= float(result["acc"]) <= 1 and 0 <= float(result["acc_norm"]) <= 1
            assert int(result["rows"]) == min(len(MC_ROWS), int(options.get("limit", len(MC_ROWS))))


def test_evaluate_a_huge_sequence_count_is_one_line(model_files: Path) -> None:
    """10**12 sequences were an 8 TB allocation and a traceback; they are refused against the machine's memory."""
    script = load_script("evaluate")
    before = tree(model_files)
    code, _, err = call(script.main, [str(model_files / "ckpt"), f"--data={model_files / 'data'}",
                                      "--sequences=1000000000000"])
    assert code == 2 and err.startswith("error: --sequences=1000000000000 of 16 tokens take ")
    assert err.strip().endswith("of memory; lower --sequences") and len(err.strip().splitlines()) == 1, err
    assert tree(model_files) == before


GOOD_GENERATE = {"source": "ckpt", "prompt": "To be", "options": {"max-new-tokens": "5"}, "huge": None,
                 "temperature": None, "device": "cpu", "tiktoken": None}
GENERATE = varied(GOOD_GENERATE, {
    "source": SOURCES,
    "prompt": st.none() | st.sampled_from(["", "a", "To be", "ü€", "a" * 40, "\udcff", "\x00"])
    | st.text(max_size=6),
    "options": st.dictionaries(
        st.sampled_from(["max-new-tokens", "temperature", "top-k", "seed"]),
        int_text(high=12, huge=False),
        max_size=3),
    "huge": st.none() | st.sampled_from(["max-new-tokens", "top-k", "seed"]),
    "temperature": st.none() | FLOAT_TEXT,
    "device": DEVICES,
    "tiktoken": st.none() | st.sampled_from(["missing"] + (["shared"] if HAVE_GPT2 else [])),
})


@settings(max_examples=40, **SETTINGS)
@given(GENERATE)
@example(GOOD_GENERATE)
@example({**GOOD_GENERATE, "temperature": "1e-45"})  # logits / T overflow float32: greedy is the limit
@example({**GOOD_GENERATE, "temperature": "1e308"})  # T itself overflows float32
@example({**GOOD_GENERATE, "prompt": "\udcff"})  # a command-line byte that is not UTF-8 (surrogateescape)
@example({**GOOD_GENERATE, "source": "export", "huge": "max-new-tokens"})
def test_generate_any_options_sample_or_are_one_line(model_files: Path, draw: dict) -> None:
    script = load_script("generate")
    argv = [source_path(model_files, draw["source"])]
    argv += [f"--prompt={draw['prompt']}"] if draw["prompt"] is not None else []
    options = dict(draw["options"])
    if draw["huge"]:
        options[draw["huge"]] = "99999999999999999999" if draw["huge"] == "seed" else "1000000000000"
    if draw["temperature"] is not None:
        options["temperature"] = draw["temperature"]
    argv += [f"--{k}={v}" for k, v in options.items()] + [f"--device={draw['device']}"]
    if draw["tiktoken"]:
        argv.append(f"--tiktoken-file={model_files / 'nowhere' if draw['tiktoken'] == 'missing' else SHARED_GPT2}")
    before = tree(model_files)
    code, stdout, err = call(script.main, argv)
    assert_outcome(code, err)
    assert tree(model_files) == before
    if code == 0:  # the prompt, then the continuation
        assert stdout.startswith(draw["prompt"] or "") and stdout.endswith("\n")


# ------------------------------------------------------------------ SIGTERM in the middle of a tool

PAUSED_RUN = r"""
import importlib, os, runpy, sys, time
from pathlib import Path

module, qualname, when, nth = os.environ["TEST_PAUSE"].split(":")
owner = importlib.import_module(module)
*parents, name = qualname.split(".")
for part in parents:
    owner = getattr(owner, part)
real, calls = getattr(owner, name), []

def pause():
    Path(os.environ["TEST_PAUSE_MARKER"]).write_text(str(os.getpid()))
    time.sleep(120)  # the test sends SIGTERM here

def paused(*args, **kwargs):
    calls.append(1)
    held = len(calls) == int(nth)
    if held and when == "before":
        pause()
    result = real(*args, **kwargs)
    if held and when == "after":
        pause()
    return result

setattr(owner, name, paused)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def terminate_at(tmp: Path, moment: str, script: str, *args: str) -> tuple[int, str]:
    """Run scripts/<script> held at ``moment`` (module:qualname:before|after:nth), SIGTERM it there; (code, output)."""
    marker = tmp / "paused"
    env = {**script_env(tmp), "TEST_PAUSE": moment, "TEST_PAUSE_MARKER": str(marker), "PYTHONPATH": str(REPO_ROOT),
           "HF_HOME": str(tmp / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("TORCHNLQ_TIKTOKEN_FILE", None)
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_RUN, str(REPO_ROOT / "scripts" / script), *args], cwd=tmp,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not marker.exists():
            output = proc.communicate(timeout=60)[0] if proc.poll() is not None else ""
            pytest.fail(f"never reached {moment}: {output}")
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    marker.unlink()
    return proc.returncode, output


def assert_terminated(code: int, output: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 143, output
    assert "Traceback" not in output and lines[-1].startswith("terminated: "), output


PREPARE_MOMENTS = {
    "read": "torchnlq.data.prepare:_load_files:after:1",  # the text read into the cache, nothing tokenized
    "train-written": "torchnlq.data.token_format:write_tokens:after:1",  # train.bin's temporary, not val.bin's
    "before-commit": "torchnlq.data.token_format:commit:before:1",  # both temporaries written, nothing renamed
    # Inside commit: the previous files set aside, both splits renamed into place, the new meta.json not yet written.
    "mid-commit": "torchnlq.data.token_format:file_identity:before:3",
}


@pytest.mark.integration
@pytest.mark.parametrize(("moment", "previous"), [
    pytest.param(moment, previous, id=f"{name}-{'previous-token-folder' if previous else 'new-out'}")
    for name, moment in PREPARE_MOMENTS.items() for previous in (False, True)
])
def test_sigterm_during_prepare_data_leaves_no_partial_output_and_a_rerun_finishes(tmp_path, moment, previous):
    (tmp_path / "in.txt").write_text(TEXT * 50)
    out = tmp_path / "out"
    if previous:  # --overwrite of an earlier token folder: it must stay whole
        write_token_folder(out, np.full(64, 7), np.full(16, 8))
        (out / "notes.txt").write_text("kept\n")
    before = tree(tmp_path)
    argv = [f"--out={out}", "--files", str(tmp_path / "in.txt"), "--tokenizer=byte", "--num-proc=1",
            "--text-split=paragraph", "--val-fraction=0.2", *(["--overwrite"] if previous else [])]
    code, output = terminate_at(tmp_path, moment, "prepare_data.py", *argv)
    assert_terminated(code, output)
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("hf_home")} == before  # out absent, or as it was
    code, _, err = call(load_script("prepare_data").main, argv)
    assert code == 0, err
    check_token_folder(out, "byte")


@pytest.mark.integration
def test_sigterm_at_an_unarranged_moment_of_a_long_prepare_leaves_nothing_or_the_whole_folder(tmp_path):
    """No pause: a 12 MB input (about 10 s of work), SIGTERM a second after datasets' cache appears in the output."""
    (tmp_path / "in.txt").write_text(("a line of text for the tokenizer to read\n" * 50 + "\n") * 6000)
    out = tmp_path / "out"
    env = {**script_env(tmp_path), "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"), f"--out={out}", "--files",
         str(tmp_path / "in.txt"), "--tokenizer=byte", "--num-proc=1", "--text-split=line", "--val-fraction=0.01"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "hf_cache").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in stderr, stderr
    if proc.returncode == 0:  # it finished first: then the whole folder
        check_token_folder(out, "byte")
    else:
        assert proc.returncode == 143, stderr
        assert [line for line in stderr.splitlines() if line.strip()][-1].startswith("terminated: "), stderr
        assert {p.name for p in tmp_path.iterdir()} - {"hf_home"} == {"in.txt"}  # no out, no temporaries


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
