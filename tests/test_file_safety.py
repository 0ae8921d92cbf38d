"""Nothing outside what the user named is deleted or written: export folders, job.name, prepare's --out.

Each refusal is checked against a snapshot of the whole tmp tree (every path, every file's hash)
taken before and after: a refused command must leave every file where it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from torchnlq.interop.export import check_export_folder, export_safetensors
from torchnlq.interop.export import export_hf_standard
from torchnlq.data import token_format as fmt
from torchnlq.data.prepare import prepare_dataset
from torchnlq.errors import ConfigError, UserError
from torchnlq.train.trainer import Trainer

from helpers import REPO_ROOT
from helpers.checkpoints import load_script, tiny_model, write_checkpoint
from helpers.train import tiny_config


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root``: files by their sha256, folders and links by their kind."""
    tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                tree[rel] = "link -> " + os.readlink(p)
            elif p.is_dir():
                tree[rel] = "dir"
            else:
                tree[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return tree


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder as the trainer leaves it: config.toml, train.log, checkpoints/step-7."""
    run = tmp_path / "outputs" / "run"
    write_checkpoint(run / "checkpoints" / "step-7", tiny_model())
    (run / "config.toml").write_text("[job]\nname = 'run'\n")
    (run / "train.log").write_text("step 7\n")
    return run


@pytest.fixture(scope="module")
def convert():
    return load_script("convert_checkpoint")


def refused(convert, capsys, tmp_path: Path, args: list[str], message: str) -> None:
    """convert_checkpoint.py ``args``: exit 2, one ``error:`` line containing ``message``, tmp tree unchanged."""
    before = snapshot(tmp_path)
    assert convert.run_cli(convert.main, args) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and out.err.count("\n") == 1, out.err
    assert message in out.err, out.err
    assert "wrote" not in out.out
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------- export output folders

def test_overwrite_never_touches_the_run_folder_the_checkpoint_or_the_working_directory(
    run, tmp_path, convert, capsys, monkeypatch
):
    ckpt = run / "checkpoints" / "step-7"
    cases = [
        (run, "contains the source"),
        (run / "checkpoints", "contains the source"),
        (ckpt, "is the source"),
        (ckpt / "sub", "lies inside the source"),
        (run / "checkpoints" / "export", "inside the run's checkpoints folder"),
        (tmp_path / "outputs", "contains the source"),
    ]
    for out, message in cases:
        refused(convert, capsys, tmp_path, [str(ckpt), str(out), "--overwrite"], message)
    # A folder that is neither: still refused when it holds anything but a previous export.
    other = tmp_path / "notes"
    other.mkdir()
    (other / "thesis.tex").write_text("years of work")
    refused(convert, capsys, tmp_path, [str(ckpt), str(other), "--overwrite"], "is not a torchnlq export")
    # The working directory and its parents, relative or not; cwd = the run folder, then its checkpoints.
    monkeypatch.chdir(run)
    for out in (".", "..", str(run), str(tmp_path), "/"):
        refused(convert, capsys, tmp_path, [str(ckpt), out, "--overwrite"], "is the current directory")
    monkeypatch.chdir(run / "checkpoints")
    refused(convert, capsys, tmp_path, [str(ckpt), "..", "--overwrite"], "is the current directory")
    refused(convert, capsys, tmp_path, [str(ckpt), ".", "--overwrite"], "is the current directory")


def test_home_folder_and_inside_the_source_are_refused_even_when_new(run, tmp_path, convert, capsys, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    ckpt = run / "checkpoints" / "step-7"
    refused(convert, capsys, tmp_path, [str(ckpt), "~", "--overwrite"], "the home folder")
    # Without --overwrite a new folder inside the checkpoint would be created: refused, nothing created.
    refused(convert, capsys, tmp_path, [str(ckpt), str(ckpt / "export")], "lies inside the source")
    refused(convert, capsys, tmp_path, [str(ckpt), str(run / "checkpoints" / "x")], "checkpoints folder")


def test_run_export_is_written_and_replaced_as_export_at_end_does(run, tmp_path, convert, capsys):
    ckpt = run / "checkpoints" / "step-7"
    export_safetensors(ckpt, run / "export", overwrite=True)  # what Trainer.export_final calls
    first = (run / "export" / "config.json").read_text()
    keep = {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("outputs/run/export")}
    export_safetensors(ckpt, run / "export", dtype="bf16", overwrite=True)
    assert json.loads((run / "export" / "config.json").read_text())["dtype"] == "bfloat16" != json.loads(first)["dtype"]
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("outputs/run/export")} == keep
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.toml", "export", "train.log"]  # no temps
    # The script: an existing export needs --overwrite; an HF export is replaced by a safetensors one and back.
    refused(convert, capsys, tmp_path, [str(ckpt), str(run / "export")], "already exists")
    assert convert.run_cli(convert.main, [str(ckpt), str(run / "export"), "--overwrite", "--format", "hf-gpt2"]) == 0
    assert (run / "export" / "torchnlq_export.json").is_file()
    assert convert.run_cli(convert.main, [str(ckpt), str(run / "export"), "--overwrite"]) == 0
    assert sorted(p.name for p in (run / "export").iterdir()) == [
        "config.json", "merges.txt", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
        "tokenizer_config.json", "vocab.json",
    ]
    capsys.readouterr()


def test_an_export_with_foreign_files_a_link_or_a_file_is_not_replaced(run, tmp_path, capsys):
    ckpt = run / "checkpoints" / "step-7"
    exp = export_safetensors(ckpt, tmp_path / "exp")
    (exp / "README.md").write_text("mine")
    sub = export_safetensors(ckpt, tmp_path / "exp2")
    (sub / "extra").mkdir()
    (tmp_path / "plain.txt").write_text("a file")
    (tmp_path / "link").symlink_to(tmp_path / "plain.txt")
    hf_like = tmp_path / "hf_like"  # a Hugging Face folder torchnlq did not write
    hf_like.mkdir()
    (hf_like / "config.json").write_text('{"model_type": "gpt2"}')
    (hf_like / "model.safetensors").write_bytes(b"x")
    before = snapshot(tmp_path)
    for out, message in [
        (exp, "is not a torchnlq export"), (sub, "is not a torchnlq export"), (hf_like, "is not a torchnlq export"),
        (tmp_path / "plain.txt", "is not a folder"), (tmp_path / "link", "symbolic link"),
    ]:
        with pytest.raises(UserError, match=message):
            export_safetensors(ckpt, out, overwrite=True)
        with pytest.raises(UserError, match=message):
            check_export_folder(out, ckpt, overwrite=True)
    assert snapshot(tmp_path) == before
    # An empty folder is fine (nothing to lose).
    (tmp_path / "empty").mkdir()
    export_hf_standard(ckpt, tmp_path / "empty", "hf-gpt2", overwrite=True)
    assert (tmp_path / "empty" / "config.json").is_file()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_exports_get_ordinary_permissions(tmp_path, umask):
    ckpt = write_checkpoint(tmp_path / "ckpt", tiny_model())
    old = os.umask(umask)
    try:
        outs = [export_safetensors(ckpt, tmp_path / "st"), export_hf_standard(ckpt, tmp_path / "hf", "hf-gpt2")]
        outs.append(export_safetensors(ckpt, tmp_path / "st", overwrite=True))  # replaced: same modes
    finally:
        os.umask(old)
    for out in outs:
        assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
        files = list(out.iterdir())
        assert "model.safetensors" in {f.name for f in files}
        for f in files:
            assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f


# ---------------------------------------------------------------- job.name

@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../escape", "/abs", "a\\b", "nul\0byte"])
def test_job_name_must_be_a_plain_folder_name(tmp_path, name):
    cfg = tiny_config(tmp_path, "placeholder")
    cfg.job.name = name
    with pytest.raises(ConfigError, match=r"is not a plain folder name .* set job.dump_folder for the location"):
        Trainer(cfg)
    assert sorted(os.listdir(tmp_path)) == []  # no run folder, no synthetic corpus


def test_job_name_with_dots_and_dashes_is_fine(tmp_path):
    from torchnlq.train.preflight import check_job_config

    for name in ("run-1.b_c", "res_gelu_lr2p6e-3", "..hidden"):
        cfg = tiny_config(tmp_path, name)
        check_job_config(cfg)


# ---------------------------------------------------------------- prepare_data.py --out and --files

def write_docs(folder: Path, n: int = 3) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        paths.append(folder / f"doc{i}.txt")
        paths[-1].write_text(f"document number {i}")
    return [str(p) for p in paths]


def prepare(out: Path | str, files: list[str], **kw) -> dict:
    return prepare_dataset(out, files=files, tokenizer="byte", val_fraction=0.34, **kw)


def test_prepare_refuses_a_non_empty_out_unless_overwrite_of_a_token_folder(tmp_path):
    files = write_docs(tmp_path / "src")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match=r"is not empty \(it holds 'notes.txt'\).*--overwrite"):
        prepare(other, files)
    with pytest.raises(UserError, match="is not a token folder"):
        prepare(other, files, overwrite=True)
    (tmp_path / "afile").write_text("x")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match="is not a folder"):
        prepare(tmp_path / "afile", files, overwrite=True)
    assert snapshot(tmp_path) == before


@pytest.mark.integration  # three datasets runs (~3 s)
def test_prepare_overwrite_replaces_only_the_token_files(tmp_path):
    files = write_docs(tmp_path / "src")
    out = tmp_path / "tokens"
    out.mkdir()  # an empty folder is fine
    first = prepare(out, files)
    (out / "README").write_text("kept")
    with pytest.raises(UserError, match="is not empty"):
        prepare(out, files)
    second = prepare(out, files[:2] + write_docs(tmp_path / "more", 1), overwrite=True)
    assert second["source"]["files"] != first["source"]["files"] and fmt.is_complete(out)
    assert (out / "README").read_text() == "kept"
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def test_prepare_refuses_the_working_directory_and_its_parents(tmp_path, monkeypatch):
    files = write_docs(tmp_path / "src")
    work = tmp_path / "work" / "data"
    work.mkdir(parents=True)
    (work / "train.bin").write_bytes(b"\0\0")  # even a token folder
    monkeypatch.chdir(work)
    before = snapshot(tmp_path)
    for out in (".", "..", str(tmp_path), "/"):
        for overwrite in (False, True):
            with pytest.raises(UserError, match="is the current directory, the home folder or a parent"):
                prepare(out, files, overwrite=overwrite)
    assert snapshot(tmp_path) == before


def test_prepare_refuses_a_file_named_twice(tmp_path):
    files = write_docs(tmp_path / "src")
    with pytest.raises(UserError, match="given more than once: .*doc0.txt; name each file once"):
        prepare(tmp_path / "out", [*files, str(Path(files[0]).parent / "." / "doc0.txt")])
    assert not (tmp_path / "out").exists()


def test_repeated_files_flag_appends():
    parser = load_script("prepare_data").build_parser()
    args = parser.parse_args(["--out", "o", "--files", "a.txt", "b.txt", "--tokenizer", "byte", "--files", "c.txt"])
    assert args.files == ["a.txt", "b.txt", "c.txt"]
    assert parser.parse_args(["--out", "o"]).files is None
    assert "adds to the list" in parser.format_help() and "--overwrite" in parser.format_help()


@pytest.mark.integration  # scripts/prepare_data.py in a subprocess
def test_prepare_cli_refusal_is_one_line_and_repeated_files_are_all_read(tmp_path):
    files = write_docs(tmp_path / "src", 4)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"), *args],
                              check=False, capture_output=True, text=True, cwd=tmp_path, timeout=120)

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("keep")
    before = snapshot(tmp_path)
    for out, extra in (("mine", []), ("mine", ["--overwrite"]), (".", ["--overwrite"])):
        r = cli("--out", out, "--files", *files, "--tokenizer", "byte", *extra)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert snapshot(tmp_path) == before
    r = cli("--out", "tok", "--files", files[0], files[1], "--files", files[2], "--files", files[3],
            "--tokenizer", "byte", "--val-fraction", "0.25")
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "tok" / "meta.json").read_text())
    assert len(meta["source"]["files"]) == 4 and sum(meta["documents"].values()) == 4
    r = cli("--out", "tok", "--files", *files, "--tokenizer", "byte")
    assert r.returncode == 2 and "--overwrite" in r.stderr
    r = cli("--out", "tok", "--files", *files, "--tokenizer", "byte", "--overwrite", "--val-fraction", "0.25")
    assert r.returncode == 0, r.stderr


@pytest.mark.integration  # scripts/convert_checkpoint.py in a subprocess
def test_convert_cli_refuses_the_run_folder(run, tmp_path):
    before = snapshot(tmp_path)
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "convert_checkpoint.py"), str(run / "checkpoints" / "step-7"),
         ".", "--overwrite"], check=False, capture_output=True, text=True, cwd=run, timeout=120,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert snapshot(tmp_path) == before
