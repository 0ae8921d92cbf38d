"""End to end: ./run_train.sh trains the debug model, the loss falls, TensorBoard has the tags,
and bad input ends in one clear line with exit code 2."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from helpers.train import run_train, scalars

pytestmark = pytest.mark.integration  # subprocess / torchrun / end-to-end trainer runs: see pyproject.toml

TAGS = {"loss/train", "loss/val", "loss/val_std", "lr", "grad_norm", "throughput/tokens_per_s",
        "memory/peak_gib", "tokens_seen"}


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("e2e")
    proc = run_train(tmp)  # no argument: train_configs/debug_model.toml
    return tmp, proc


def test_debug_run_learns(debug_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    tmp, proc = debug_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == "", proc.stderr[-2000:]  # a clean run warns about nothing (issue 40.5)
    run = tmp / "outputs" / "debug_model"
    assert (run / "config.toml").is_file() and (run / "train.log").is_file()
    data = scalars(run / "tb")
    assert TAGS <= set(data), f"missing tags: {TAGS - set(data)}"
    train = [v for _, v in sorted(data["loss/train"].items())]
    val = [v for _, v in sorted(data["loss/val"].items())]
    assert train[0] > train[-1] + 1.0, train
    from torchnlq.data.synthetic import unigram_entropy

    entropy = unigram_entropy(tmp / "outputs" / "data" / "synthetic" / "val.bin")
    # Falling well below the unigram entropy shows the model learned context, not just frequencies.
    assert val[-1] < 0.75 * entropy, (val, entropy)
    assert val[-1] < math.log(257) - 2.0
    assert max(data["loss/val"]) == 150  # final validation at the last step
    assert max(data["tokens_seen"].items()) == (150, 150 * 16 * 128)
    assert "step    150/150" in proc.stdout


def test_help_lists_every_option(tmp_path: Path) -> None:
    proc = run_train(tmp_path, "--help")
    assert proc.returncode == 0
    for key in ("--training.steps", "--model.query.type", "--data.path", "--lr_schedule.min_lr", "--metrics.peak_tflops"):
        assert key in proc.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["missing.toml"], "config file 'missing.toml' not found"),
        (["--training.stesp=3"], "did you mean 'steps'"),
        (["--data.synthetic=false", "--data.path=nowhere"], "prepare_data.py"),
        (["--training.device=cuda"], "no CUDA device"),
        (["--training.seq_len=4096"], "max_seq_len"),
        (["--model.n_heads=5"], "model.n_heads"),
        (["--model.n_kv_heads=3"], "model.n_kv_heads"),
        (["--training.max_consecutive_skips=0"], "training.max_consecutive_skips must be >= 1"),
        (["--optimizer.lr=inf"], "optimizer.lr must be a finite number"),
        (["--lr_schedule.min_lr=1"], "is above optimizer.lr"),
        (["--job.name=../elsewhere"], "job.name"),
        (["--training.seed=-1"], "training.seed must be >= 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = run_train(tmp_path, *args, "--training.steps=1")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert fragment in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--training.seq_len=4096"], "max_seq_len"),
        (["--data.synthetic=false", "--data.path=nowhere"], "prepare_data.py"),
        (["--optimizer.lr=nan"], "finite"),
    ],
)
def test_a_multi_process_mistake_is_one_line_before_torchrun(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = run_train(tmp_path, *args, "--training.steps=1", "--training.device=cpu", ngpu=2)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], proc.stderr
    assert not (tmp_path / "outputs" / "debug_model").exists()


def test_a_multi_process_run_on_a_folder_in_use_is_one_line(tmp_path: Path) -> None:
    import os

    from torchnlq.train.run_lock import RunLock

    run = tmp_path / "outputs" / "debug_model"
    run.mkdir(parents=True)
    held = RunLock(run).acquire()  # this test process plays the running trainer
    try:
        proc = run_train(tmp_path, "--training.steps=1", "--training.device=cpu", ngpu=2)
    finally:
        held.release()
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"in use by process {os.getpid()}" in lines[0]
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing else written
