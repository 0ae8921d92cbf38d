"""Tests that run the trainer: tiny configs, launching ./run_train.sh, reading TensorBoard."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torchnlq.config.job_config import JobConfig
from torchnlq.config.manager import load_job_config

from helpers import REPO_ROOT


def tiny_args(tmp: Path, name: str = "run", steps: int = 12, **extra: object) -> list[str]:
    """Overrides for a model small enough that a step takes milliseconds on the CPU."""
    args = {
        "job.dump_folder": tmp / "outputs", "job.name": name,
        "model.flavor": "debug", "model.n_layers": 2, "model.dim": 32, "model.n_heads": 2,
        "model.query.type": "residual_mlp",
        "training.steps": steps, "training.seq_len": 32, "training.micro_batch_size": 4,
        "training.grad_accum_steps": 2, "training.device": "cpu",
        "optimizer.lr": 3e-3, "lr_schedule.warmup_steps": 2, "lr_schedule.decay_steps": steps,
        "data.path": tmp / "data", "data.tokenizer": "byte", "data.synthetic": True,
        "validation.interval": 4, "validation.sequences": 16, "metrics.log_interval": 1,
        "checkpoint.interval": 4, "checkpoint.enabled": True,
    }
    args.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"--{k}={v}" for k, v in args.items()]


def tiny_config(tmp: Path, name: str = "run", steps: int = 12, **extra: object) -> JobConfig:
    return load_job_config(tiny_args(tmp, name, steps, **extra))


def scalars(tb_dir: Path) -> dict[str, dict[int, float]]:
    """TensorBoard scalars as {tag: {step: value}} (later events at a step win, as TensorBoard shows)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def script_env(tmp: Path) -> dict[str, str]:
    """Environment for run_train.sh: this interpreter first on PATH (no re-install), caches in tmp.

    One OpenMP thread per process unless the caller's environment says otherwise: the tests' models
    are tiny, and on a shared machine a second thread only adds waiting (see conftest.one_torch_thread).
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["TORCHNLQ_CACHE"] = str(tmp / "cache")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_train(
    tmp: Path, *args: object, ngpu: int = 1, timeout: float = 300, wait: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess | subprocess.Popen:
    """Run ./run_train.sh in ``tmp`` (``ngpu`` > 1: torchrun) with ``script_env``, the one launcher of the tests.

    ``wait=True``: wait up to ``timeout`` seconds and return the CompletedProcess (stdout, stderr captured).
    ``wait=False``: return the running Popen at once, stderr merged into its stdout pipe, in a session
    of its own (``os.killpg(proc.pid, sig)`` signals every process of the run, as a scheduler or Ctrl-C does).
    ``env``: extra environment variables.
    """
    full_env = {**script_env(tmp), "NGPU": str(ngpu), **(env or {})}
    cmd = [str(REPO_ROOT / "run_train.sh"), *map(str, args)]
    if not wait:
        return subprocess.Popen(
            cmd, cwd=tmp, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )
    return subprocess.run(cmd, cwd=tmp, env=full_env, capture_output=True, text=True, timeout=timeout)
