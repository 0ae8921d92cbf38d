"""Generated mistakes (Hypothesis) for prepare_data.py: ``--out`` with any inputs, output folder state and tokenizer,
``--adopt`` of any nanoGPT folder state, and SIGTERM at chosen moments (and at an unarranged one) of a preparation.

The invariant (tests/helpers/generated_tools.py): exit 0 with a complete token folder, or exit 2 with one ``error:``
line, and every file the user had still there, byte for byte; SIGTERM leaves exit code 143, one ``terminated:``
line, and the output folder absent or exactly as it was.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_generated import assert_outcome, scratch

from helpers import REPO_ROOT
from helpers.checkpoints import load_script
from helpers.data import SHARED_GPT2, write_token_folder, write_toy_tiktoken
from helpers.generated_tools import (  # noqa: F401 - no_tiktoken_download: an autouse fixture
    SETTINGS, assert_kept, assert_terminated, call, no_tiktoken_download, terminate_at, tree, varied,
)
from helpers.train import script_env
from torchnlq.data import token_format as fmt
from torchnlq.data.prepare import TOKEN_FILES

HAVE_GPT2 = SHARED_GPT2.is_file()


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



# ------------------------------------------------------------------ SIGTERM in the middle of prepare_data.py

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
