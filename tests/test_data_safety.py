"""Writes that cannot destroy: each data-loss case found from outside, tried, and every byte of the user's files checked.

The cases (issue 20): a synthetic corpus over a nanoGPT folder or another tool's meta.json; a fresh
start (``checkpoint.resume = false`` or checkpoints off) beside a run's checkpoints; files of the run
folder that are links to the user's files; compare_runs over the user's own comparison.md; a save
that hits a full disk. Each must end in one ``error:`` line (or succeed) with the user's files unchanged.
"""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from torchnlq.cli import run_cli
from torchnlq.train.__main__ import main as train_main

from helpers.train import tiny_args


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root`` (links read through: their targets must not change)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def train(tmp: Path, capsys: pytest.CaptureFixture[str], *extra: str, **overrides: object) -> tuple[int, str]:
    """The trainer's entry point in this process; (exit code, stderr)."""
    capsys.readouterr()
    code = run_cli(train_main, [*tiny_args(tmp, **overrides), *extra])
    return code, capsys.readouterr().err


def one_error_line(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def nanogpt_folder(folder: Path) -> Path:
    """train.bin / val.bin as nanoGPT writes them (uint16), with no meta.json."""
    folder.mkdir(parents=True)
    for split, n in (("train", 5000), ("val", 800)):
        np.arange(n, dtype=np.uint16).tofile(folder / f"{split}.bin")
    return folder


@pytest.mark.parametrize("meta", [None, '{"tokenizer": "somebody else\'s", "vocab": 5}'])
def test_a_synthetic_corpus_never_overwrites_a_users_data_folder(tmp_path, capsys, meta):
    user = nanogpt_folder(tmp_path / "user" / "data")
    if meta is not None:
        (user / "meta.json").write_text(meta)
    before = snapshot(tmp_path / "user")
    code, err = train(tmp_path, capsys, data__path=user, data__synthetic=True)
    assert code == 2
    one_error_line(err, "torchnlq did not write as its synthetic corpus", "data.synthetic = false")
    assert snapshot(tmp_path / "user") == before
    assert not (tmp_path / "outputs").exists()  # nothing of the run was created either


@pytest.mark.parametrize("why", ["checkpoint.resume=false", "checkpoint.enabled=false"])
def test_a_fresh_start_beside_a_runs_checkpoints_is_refused(tmp_path, capsys, why):
    assert train(tmp_path, capsys, steps=8, checkpoint__interval=4, checkpoint__keep_latest_k=1)[0] == 0
    run = tmp_path / "outputs" / "run"
    before = snapshot(run / "checkpoints")
    code, err = train(tmp_path, capsys, f"--{why}", steps=4, checkpoint__interval=4, checkpoint__keep_latest_k=1)
    assert code == 2
    one_error_line(err, "already holds checkpoints (step-8 the latest)", why.replace("=", " = "))
    assert snapshot(run / "checkpoints") == before


@pytest.mark.integration  # trains three runs
def test_a_second_start_of_a_run_without_checkpoints_is_refused_and_rerun_sets_the_first_aside(tmp_path, capsys):
    """Issue 24.5: never a silent second run appended to the first's train.log and tb/."""
    from helpers.train import scalars

    traced = ["--profiling.enabled=true", "--profiling.wait=0", "--profiling.active=1"]  # profiler/ is the run's too
    assert train(tmp_path, capsys, *traced, steps=4, checkpoint__enabled=False)[0] == 0
    run = tmp_path / "outputs" / "run"
    before = snapshot(run)
    assert any(name.startswith("profiler/") for name in before)
    code, err = train(tmp_path, capsys, steps=4, checkpoint__enabled=False)
    assert code == 2
    one_error_line(err, f"{run} already holds a run finished at step 4 and no checkpoint to resume from",
                   "use a new --job.name, or pass --job.rerun=true")
    assert snapshot(run) == before
    # Asked for: the first run's files, byte for byte, in previous-1/; the new run's log and events are its own.
    assert train(tmp_path, capsys, "--job.rerun=true", steps=4, checkpoint__enabled=False)[0] == 0
    after = snapshot(run)
    assert {k.removeprefix("previous-1/"): v for k, v in after.items() if k.startswith("previous-1/")} == {
        k: v for k, v in before.items() if k != ".lock"}
    log = (run / "train.log").read_text()
    assert log.count(f"run {run} |") == 1 and f"the earlier run is in {run / 'previous-1'}" in log
    assert len(list((run / "tb").iterdir())) == 1 and sorted(scalars(run / "tb")["loss/train"]) == [1, 2, 3, 4]
    assert train(tmp_path, capsys, "--job.rerun=true", steps=4, checkpoint__enabled=False)[0] == 0
    assert (run / "previous-2" / "train.log").read_text() == log  # a third start: the second run aside, the first kept
    assert {k: v for k, v in snapshot(run).items() if k.startswith("previous-1/")} == {
        k: v for k, v in after.items() if k.startswith("previous-1/")}


@pytest.mark.integration  # trains and resumes
def test_a_run_with_checkpoints_resumes_with_or_without_rerun(tmp_path, capsys):
    assert train(tmp_path, capsys, steps=4)[0] == 0
    assert train(tmp_path, capsys, "--job.rerun=true", steps=6, lr_schedule__decay_steps=4)[0] == 0
    run = tmp_path / "outputs" / "run"
    assert not list(run.glob("previous-*")) and "resumed from" in (run / "train.log").read_text()
    assert json.loads((run / "run_info.json").read_text())["step"] == 6


@pytest.mark.parametrize("name", ["config.toml", ".lock", "train.log", "run_info.json"])
def test_run_files_that_are_links_are_refused_and_their_targets_kept(tmp_path, capsys, name):
    user = tmp_path / "user"
    user.mkdir()
    (user / "precious.txt").write_text("the user's own file\n")
    run = tmp_path / "outputs" / "run"
    run.mkdir(parents=True)
    (run / name).symlink_to(user / "precious.txt")
    code, err = train(tmp_path, capsys)
    assert code == 2
    one_error_line(err, f"{run / name} is a symbolic link")
    assert (user / "precious.txt").read_text() == "the user's own file\n"


@pytest.mark.parametrize(("name", "kind"), [("checkpoints", "file"), ("tb", "file"), ("train.log", "folder"),
                                            (".lock", "folder"), ("config.toml", "folder")])
def test_an_entry_of_the_wrong_kind_is_one_line(tmp_path, capsys, name, kind):
    run = tmp_path / "outputs" / "run"
    run.mkdir(parents=True)
    (run / name).mkdir() if kind == "folder" else (run / name).write_text("mine")
    before = snapshot(run)
    code, err = train(tmp_path, capsys)
    assert code == 2
    one_error_line(err, str(run / name))
    assert snapshot(run) == before


@pytest.mark.integration  # trains and resumes
def test_a_full_disk_during_a_save_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    """ENOSPC in the second save: one line naming the resume point; the run then resumes from it."""
    import torch.distributed.checkpoint as dcp

    real_save, calls = dcp.save, []

    def save_until_full(state, checkpoint_id):
        calls.append(checkpoint_id)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", checkpoint_id)
        return real_save(state, checkpoint_id=checkpoint_id)

    monkeypatch.setattr(dcp, "save", save_until_full)
    code, err = train(tmp_path, capsys, steps=8)
    assert code == 2
    one_error_line(err, "saving checkpoint step-8 failed", "the disk is full",
                   "the last complete checkpoint, step-4, is the resume point")
    monkeypatch.setattr(dcp, "save", real_save)
    code, _ = train(tmp_path, capsys, steps=8)
    assert code == 0
    log = (tmp_path / "outputs" / "run" / "train.log").read_text()
    assert "resumed from" in log and "step-4 (step 4" in log


def test_compare_runs_never_replaces_a_users_file(tmp_path, capsys):
    from torchnlq.experiments.compare import main as compare_main

    for name in ("a", "b"):
        assert train(tmp_path, capsys, name=name, steps=4, checkpoint__enabled=False)[0] == 0
    out = tmp_path / "mine"
    out.mkdir()
    (out / "comparison.md").write_text("my notes\n")
    runs = [str(tmp_path / "outputs" / "a"), str(tmp_path / "outputs" / "b")]
    code = run_cli(compare_main, [*runs, "--baseline", "a", "--out", str(out)])
    assert code == 2
    one_error_line(capsys.readouterr().err, f"'{out / 'comparison.md'}' exists and was not written by torchnlq")
    assert [p.name for p in out.iterdir()] == ["comparison.md"] and (out / "comparison.md").read_text() == "my notes\n"
    # Its own previous output it replaces; the same run given twice (through a link) is refused.
    assert run_cli(compare_main, [*runs, "--baseline", "a", "--out", str(tmp_path / "cmp")]) == 0
    assert run_cli(compare_main, [*runs, "--baseline", "a", "--out", str(tmp_path / "cmp")]) == 0
    (tmp_path / "again").symlink_to(tmp_path / "outputs" / "a")
    capsys.readouterr()
    assert run_cli(compare_main, [*runs, str(tmp_path / "again"), "--baseline", "a", "--out", str(out)]) == 2
    one_error_line(capsys.readouterr().err, "are the same run folder")


def test_sigterm_during_an_export_removes_its_temporaries_and_a_rerun_finishes(tmp_path, capsys, monkeypatch):
    """SIGTERM in the middle of writing the weights: one line, no hidden partial folder, and the rerun exports."""
    import os
    import signal

    import safetensors.torch

    from helpers.checkpoints import load_script, tiny_model, write_checkpoint

    write_checkpoint(tmp_path / "ckpt", tiny_model("residual_mlp"))
    script = load_script("convert_checkpoint")
    real_save = safetensors.torch.save_file

    def save_then_terminated(*args, **kwargs):
        real_save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler or `kill` would, mid-export

    monkeypatch.setattr(safetensors.torch, "save_file", save_then_terminated)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = run_cli(script.main, [str(tmp_path / "ckpt"), str(tmp_path / "out")])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 143
    assert capsys.readouterr().err.strip().startswith("terminated:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no partial export, hidden or not
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    assert run_cli(script.main, [str(tmp_path / "ckpt"), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()


def _sleep_in_a_worker() -> None:
    import time

    time.sleep(60)


def test_a_worker_forked_by_a_tool_dies_of_sigterm_instead_of_raising() -> None:
    """A process a tool forks (datasets' worker pool) gets SIGTERM's default action back: Pool.terminate, which
    datasets calls at the end of every multi-process load and map, must kill it. With run_cli's handler inherited,
    a worker raised Terminated while holding its pool's queue lock and left a sibling blocked on that lock (or,
    stuck in C code after the fork, never ran the handler), and the tool hung for ever (seen with prepare_data.py
    --num-proc 2, twice in a day of test runs)."""
    import multiprocessing
    import os
    import signal
    import time

    def main(argv: list[str]) -> int:
        worker = multiprocessing.get_context("fork").Process(target=_sleep_in_a_worker)
        worker.start()
        worker.terminate()  # SIGTERM, as Pool.terminate sends it
        worker.join(timeout=30)
        assert worker.exitcode == -signal.SIGTERM, worker.exitcode  # killed by the signal, not exit code 1
        os.kill(os.getpid(), signal.SIGTERM)  # the tool itself still stops with its one line
        time.sleep(5)
        return 0

    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert run_cli(main, []) == 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_fp16_export_never_writes_inf_and_integer_weights_are_refused(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from torchnlq.errors import UserError
    from torchnlq.interop.export import export_safetensors
    from torchnlq.interop.load import LoadedModel, load_model

    from helpers.checkpoints import BYTE_TOKENIZER, tiny_model

    model = tiny_model("linear")
    with torch.no_grad():
        model.tok_emb.weight[0, 0] = 70000.0  # beyond fp16's 65,504
    loaded = LoadedModel(model, model.args, dict(BYTE_TOKENIZER), {}, tmp_path, "test")
    with pytest.raises(UserError, match="tok_emb.weight reaches 7e\\+04, beyond float16's range"):
        export_safetensors(loaded, tmp_path / "fp16", dtype="fp16")
    assert not (tmp_path / "fp16").exists()
    out = export_safetensors(loaded, tmp_path / "bf16", dtype="bf16")
    tensors = load_file(str(out / "model.safetensors"))
    tensors["ln_f.weight"] = tensors["ln_f.weight"].to(torch.int64)
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(UserError, match="holds ln_f.weight as torch.int64, not floating point weights"):
        load_model(out)


def test_an_edit_anywhere_in_the_corpus_is_noticed(tmp_path):
    """meta.json records each file's sha256, size and mtime: an edited byte is refused when the folder is opened;
    one whose mtime was put back is caught by data.verify_content = true."""
    import os

    from torchnlq.config.job_config import Data
    from torchnlq.data.batches import open_token_files
    from torchnlq.data.synthetic import ensure_synthetic_corpus
    from torchnlq.errors import UserError

    folder = ensure_synthetic_corpus(tmp_path / "data")
    meta = json.loads((folder / "meta.json").read_text())
    train = folder / "train.bin"
    assert meta["files"]["train"]["sha256"] == hashlib.sha256(train.read_bytes()).hexdigest()  # independent hash
    data = Data(path=str(folder), tokenizer="byte")
    open_token_files(data, 16)
    middle = train.stat().st_size // 2 + 1
    with train.open("r+b") as f:  # one byte, in the middle: no sampled window needs to cover it
        f.seek(middle)
        old = f.read(1)
        f.seek(middle)
        f.write(bytes([(old[0] + 1) % 200]))
    with pytest.raises(UserError, match="train.bin is not the file meta.json records"):
        open_token_files(data, 16)
    recorded = meta["files"]["train"]["mtime_ns"]
    os.utime(train, ns=(recorded, recorded))  # the edit hidden from the cheap check
    open_token_files(data, 16)
    with pytest.raises(UserError, match="train.bin is not the file meta.json records"):
        open_token_files(Data(path=str(folder), tokenizer="byte", verify_content=True), 16)


def test_a_tokenizer_that_does_not_fit_is_refused_at_export_and_a_flag_that_does_nothing_is_an_error(tmp_path, capsys):
    from torchnlq.errors import UserError
    from torchnlq.interop.export import export_safetensors
    from torchnlq.interop.load import LoadedModel

    from helpers.checkpoints import load_script, tiny_model, write_checkpoint

    model = tiny_model("linear", vocab_size=260)  # a byte model's 257 ids fit; GPT-2's 50,257 do not
    gpt2 = {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    with pytest.raises(UserError, match="has 50,257 ids but the model only 260 embedding rows"):
        export_safetensors(LoadedModel(model, model.args, gpt2, {}, tmp_path, "test"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    write_checkpoint(tmp_path / "ckpt", tiny_model("linear"))  # a byte model
    script = load_script("generate")
    capsys.readouterr()
    assert run_cli(script.main, [str(tmp_path / "ckpt"), "--tiktoken-file", str(tmp_path / "r.tiktoken")]) == 2
    one_error_line(capsys.readouterr().err, "--tiktoken-file gives GPT-2 ranks, but this model's tokenizer is 'byte'")
