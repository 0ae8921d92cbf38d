"""The trainer across processes (torchrun, gloo, 2 CPU processes) and preemption by signal.

One process with 2 accumulation steps and two processes with 1 each read the same
global batch per step, so their losses must agree; resumes keep the data order
whatever the world size.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.train import run_train, scalars, tiny_args

pytestmark = pytest.mark.integration  # subprocess / torchrun / end-to-end trainer runs: see pyproject.toml

TWO_PROC = ["--training.grad_accum_steps=1"]  # 4 sequences x 1 step x 2 ranks = 8, as 4 x 2 x 1


def train_losses(tmp: Path, name: str) -> dict[int, float]:
    return scalars(tmp / "outputs" / name / "tb")["loss/train"]


def check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def assert_close(a: dict[int, float], b: dict[int, float], rel: float) -> None:
    assert a.keys() == b.keys()
    for step in a:
        assert abs(a[step] - b[step]) <= rel * abs(b[step]), (step, a[step], b[step])


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """The 1-process reference run (12 steps)."""
    tmp = tmp_path_factory.mktemp("mp")
    check(run_train(tmp, *tiny_args(tmp, "single")))
    return tmp, train_losses(tmp, "single")


def test_two_processes_match_one(single: tuple[Path, dict[int, float]]) -> None:
    tmp, ref = single
    proc = run_train(tmp, *tiny_args(tmp, "fsdp2"), *TWO_PROC, ngpu=2)
    check(proc)
    assert "2 process(es)" in proc.stdout
    assert_close(train_losses(tmp, "fsdp2"), ref, 1e-5)
    val = scalars(tmp / "outputs/fsdp2/tb")["loss/val"]
    assert_close(val, scalars(tmp / "outputs/single/tb")["loss/val"], 1e-5)


def test_two_processes_with_compile_and_checkpointing_match_one(single: tuple[Path, dict[int, float]]) -> None:
    tmp, ref = single
    args = [*tiny_args(tmp, "fsdp2_compile_ac"), *TWO_PROC, "--training.compile", "--activation_checkpoint.mode=full"]
    check(run_train(tmp, *args, ngpu=2, timeout=600))
    assert_close(train_losses(tmp, "fsdp2_compile_ac"), ref, 1e-5)


def test_two_process_resume_is_exact(single: tuple[Path, dict[int, float]]) -> None:
    tmp, _ = single
    check(run_train(tmp, *tiny_args(tmp, "full2"), *TWO_PROC, ngpu=2))
    check(run_train(tmp, *tiny_args(tmp, "split2"), *TWO_PROC, "--training.steps=6", ngpu=2))
    proc = run_train(tmp, *tiny_args(tmp, "split2"), *TWO_PROC, ngpu=2)
    check(proc)
    assert "resumed from" in proc.stdout
    assert train_losses(tmp, "split2") == train_losses(tmp, "full2")  # bitwise


def test_resume_one_process_run_on_two(single: tuple[Path, dict[int, float]]) -> None:
    tmp, ref = single
    check(run_train(tmp, *tiny_args(tmp, "grow"), "--training.steps=6"))
    check(run_train(tmp, *tiny_args(tmp, "grow"), *TWO_PROC, ngpu=2))
    assert_close(train_losses(tmp, "grow"), ref, 1e-5)


def test_sigterm_saves_and_resume_finishes(tmp_path: Path) -> None:
    args = tiny_args(tmp_path, "preempt", steps=3000)
    args += ["--checkpoint.interval=100000", "--validation.interval=100000", "--metrics.log_interval=5"]
    proc = run_train(tmp_path, *args, wait=False)
    log = tmp_path / "outputs/preempt/train.log"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.is_file() and "step     20/" in log.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "stopped by SIGTERM" in out
    ckpts = sorted((tmp_path / "outputs/preempt/checkpoints").glob("step-*"))
    assert len(ckpts) == 1 and not ckpts[0].name.endswith(".partial")
    stopped_at = int(ckpts[0].name.split("-")[1])
    assert 20 <= stopped_at < 3000
    # Same command, with fewer total steps so the test ends soon (decay_steps stays 3000).
    resumed = run_train(tmp_path, *args, f"--training.steps={stopped_at + 10}")
    check(resumed)
    assert "resumed from" in resumed.stdout and f"done: step {stopped_at + 10}," in resumed.stdout


def test_a_mistake_only_the_workers_find_is_one_error_line(single: tuple[Path, dict[int, float]]) -> None:
    """Resuming with another model shape is found by the workers (the preflight does not open checkpoints)."""
    tmp, _ = single
    run_dir = tmp / "outputs/single"
    before = {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    proc = run_train(tmp, *tiny_args(tmp, "single"), *TWO_PROC, "--model.dim=64", "--training.steps=20", ngpu=2)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: checkpoint "), proc.stderr
    assert "model.dim 32 there, 64 here" in errors[0]
    assert {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()} == before  # nothing touched


def test_muon_replicated_on_two_processes_matches_one(tmp_path: Path) -> None:
    """Muon sees whole matrices when the processes replicate (dp_shard = 1): the losses are one process's.
    Sharded by FSDP it would orthogonalise shards, another update: refused in one line, nothing trained."""
    muon = ["--optimizer.name=muon", "--checkpoint.enabled=false"]
    check(run_train(tmp_path, *tiny_args(tmp_path, "one"), *muon))
    proc = run_train(tmp_path, *tiny_args(tmp_path, "replicated"), *muon, *TWO_PROC, "--parallelism.dp_replicate=2",
                     "--parallelism.dp_shard=1", ngpu=2)
    check(proc)
    assert_close(train_losses(tmp_path, "replicated"), train_losses(tmp_path, "one"), 1e-5)
    sharded = run_train(tmp_path, *tiny_args(tmp_path, "sharded"), *muon, *TWO_PROC, ngpu=2)
    assert sharded.returncode == 2 and "Traceback" not in sharded.stdout + sharded.stderr
    errors = [line for line in sharded.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: Muon cannot orthogonalise FSDP-sharded matrices"), errors
    assert not (tmp_path / "outputs/sharded/checkpoints").exists()
