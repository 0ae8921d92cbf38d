"""The slurm executor on a real single-node SLURM (tests/helpers/slurm_cluster.py): the same runs as the local
executor, a pre-timeout signal that saves, requeues and resumes bit for bit, --status, a cancelled job, and a
scheduler that refuses or is missing.

The cluster is Debian's slurm-wlm with munge, started by the fixture (skipped where it is not installed or the
tests do not run as root; .ci/run installs it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from helpers.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture
from helpers.train import scalars, script_env

pytestmark = pytest.mark.integration

#: A model and batch small enough that a run's steps take milliseconds: each job's time is its start-up.
TINY = ["--model.n_layers=1", "--model.dim=32", "--model.n_heads=2", "--training.micro_batch_size=4",
        "--training.seq_len=32", "--validation.sequences=16", "--validation.interval=4", "--training.device=cpu",
        "--metrics.log_interval=1", "--metrics.query_diagnostics_interval=0", "--checkpoint.enabled=true",
        "--checkpoint.interval=4", "--data.path=./data"]
#: The executor's settings on a CPU-only test cluster.
ON_SLURM = ["--executor", "slurm", "--executor.gpus_per_run=0", "--executor.poll_seconds=1"]


def write_suite(tmp: Path, runs: dict[str, list[str]], steps: int = 12, name: str = "s.toml") -> Path:
    body = (f'config = "{REPO_ROOT / "train_configs" / "debug_model.toml"}"\ndump_folder = "runs"\n'
            f'baseline = "{next(iter(runs))}"\noverrides = {json.dumps([*TINY, f"--training.steps={steps}"])}\n')
    for run, overrides in runs.items():
        body += f'[[runs]]\nname = "{run}"\noverrides = {json.dumps(overrides)}\n'
    (tmp / name).write_text(body)
    return tmp / name


def run_suite(tmp: Path, cluster: SlurmCluster | None, *args: str, timeout: float = 300,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**script_env(tmp), **(cluster.env if cluster else {}), **(env or {})}
    full["SLURM_CONF"] = cluster.env["SLURM_CONF"] if cluster else full.get("SLURM_CONF", "")
    return subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "run_suite.py"), *args], cwd=tmp, env=full,
                          capture_output=True, text=True, timeout=timeout)


def losses(run_dir: Path) -> tuple[dict[int, float], dict[int, float]]:
    tb = scalars(run_dir / "tb")
    return tb["loss/train"], tb["loss/val"]


def test_a_suite_on_slurm_ends_with_the_local_executors_losses(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    suite = write_suite(tmp_path, {"linear": ["--model.query.type=linear"], "res": ["--model.query.type=residual_mlp"],
                                   "res_lr": ["--model.query.type=residual_mlp", "--optimizer.lr=1e-3"]})
    local = run_suite(tmp_path, None, str(suite), "--job.dump_folder=local")
    assert local.returncode == 0, local.stdout[-2000:] + local.stderr[-2000:]
    t0 = time.monotonic()
    done = run_suite(tmp_path, slurm_cluster, str(suite), "--job.dump_folder=slurm", *ON_SLURM, "--wait")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"3 runs on the test SLURM: {time.monotonic() - t0:.1f}s")
    for run in ("linear", "res", "res_lr"):
        assert json.loads((tmp_path / "slurm" / run / "run_info.json").read_text())["finished"]
        assert losses(tmp_path / "slurm" / run) == losses(tmp_path / "local" / run), run  # bit for bit
    log = (tmp_path / "slurm" / "suite.log").read_text()
    for index, run in enumerate(("linear", "res", "res_lr")):
        assert f"{run} submitted job=" in log and f"_{index} executor=slurm" in log
        assert any(line.split()[2] == run and "state=finished" in line and "seconds=" in line
                   for line in log.splitlines())
    # The last job to finish wrote the comparison (the submitting command only waited).
    table = (tmp_path / "slurm" / "comparison.md").read_text()
    assert "| linear | 1 | linear |" in table and "| res_lr | 1 | residual_mlp |" in table


def wait_until(ready, what: str, timeout: float = 300) -> None:  # noqa: ANN001 - a predicate
    """Poll ``ready``; the timeout only bounds a hang (a full CI run on 2 busy cores took 4 minutes for 1)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_pre_timeout_signal_saves_requeues_and_resumes_bit_for_bit(tmp_path: Path,
                                                                       slurm_cluster: SlurmCluster) -> None:
    suite = write_suite(tmp_path, {"long": ["--checkpoint.interval=5"]}, steps=16)
    plain = run_suite(tmp_path, None, str(suite), "--job.dump_folder=plain")
    assert plain.returncode == 0, plain.stderr[-2000:]
    # The job is held after step 7 (a pause point) while its time limit's signal arrives: B:USR1, as sbatch's
    # --signal=B:USR1@N sends it to the job's shell.
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    env = {"TORCHNLQ_PAUSE_AT": "step:7", "TORCHNLQ_PAUSE_DIR": str(pauses), "TORCHNLQ_PAUSE_SECONDS": "3"}
    t0 = time.monotonic()
    done = run_suite(tmp_path, slurm_cluster, str(suite), "--job.dump_folder=slurm", *ON_SLURM, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    wait_until(lambda: (pauses / "step-7-rank0").is_file(), "the run to reach step 7")
    job = next(iter(slurm_cluster.jobs()))
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    wait_until(lambda: not slurm_cluster.jobs() and (tmp_path / "slurm" / "comparison.md").is_file(),
               "the requeued job to finish", timeout=600)
    print(f"signal, requeue and resume: {time.monotonic() - t0:.1f}s")
    run = tmp_path / "slurm" / "long"
    log = (tmp_path / "slurm" / "suite.log").read_text()
    assert "state=requeued stopped_by=SIGUSR1" in log and "restart=1" in log
    train_log = (run / "train.log").read_text()
    assert "stopped by SIGTERM at step 7; saved step-7" in train_log and "resumed from" in train_log
    assert losses(run) == losses(tmp_path / "plain" / "long")  # every step's loss, bit for bit
    assert json.loads((run / "run_info.json").read_text())["finished"]


def test_status_reports_new_queued_running_finished_failed_and_a_cancelled_run(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    suite = write_suite(tmp_path, {
        # Two runs held at step 5 fill the node's two CPUs, so the other two wait in the queue first.
        "held_a": ["--training.steps=12"], "held_b": ["--training.steps=12"],
        "quick": [], "diverges": ["--optimizer.lr=1e12", "--training.on_nonfinite=stop"]}, steps=4)
    status = run_suite(tmp_path, slurm_cluster, str(suite), *ON_SLURM, "--status")
    assert status.returncode == 0, status.stderr
    assert [line.split()[1] for line in status.stdout.splitlines()[1:]] == ["new"] * 4, status.stdout
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    env = {"TORCHNLQ_PAUSE_AT": "step:5", "TORCHNLQ_PAUSE_DIR": str(pauses), "TORCHNLQ_PAUSE_SECONDS": "25"}
    assert run_suite(tmp_path, slurm_cluster, str(suite), *ON_SLURM, env=env).returncode == 0
    logs = [tmp_path / "runs" / run / "train.log" for run in ("held_a", "held_b")]
    wait_until(lambda: all(log.is_file() and "step      4/12" in log.read_text() for log in logs),
               "both held runs to be past step 4 (held after step 5)")
    states = dict(line.split(None, 1) for line in run_suite(tmp_path, slurm_cluster, str(suite), *ON_SLURM,
                                                           "--status").stdout.splitlines()[1:])
    assert states["held_a"].startswith("running at step") and "(job " in states["held_a"], states
    assert states["quick"].startswith("queued (job ") and "Resources" in states["quick"], states
    # The user cancels the held runs: each saves and stops, and nothing puts them back in the queue.
    held = [job for job, (state, _) in slurm_cluster.jobs().items() if state == "RUNNING"]
    slurm_cluster.run("scancel", *held)
    wait_until(lambda: not slurm_cluster.jobs(), "the queue to empty", timeout=600)
    states = dict(line.split(None, 1) for line in run_suite(tmp_path, slurm_cluster, str(suite), *ON_SLURM,
                                                           "--status").stdout.splitlines()[1:])
    assert states["quick"] == "finished"
    assert states["diverges"].startswith("failed (exit 2): error: non-finite loss"), states
    assert states["held_a"] == "interrupted at step 5/12; the same command resumes it from step-5", states
    assert "stopped by SIGTERM at step 5; saved step-5" in (tmp_path / "runs" / "held_b" / "train.log").read_text()


def test_a_partition_the_scheduler_refuses_is_one_line_and_submits_nothing(tmp_path: Path,
                                                                          slurm_cluster: SlurmCluster) -> None:
    suite = write_suite(tmp_path, {"a": [], "b": []}, steps=4)
    done = run_suite(tmp_path, slurm_cluster, str(suite), *ON_SLURM, "--executor.partition=nope")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: submitting 2 job(s) of s: sbatch said: "), \
        done.stderr
    assert "invalid partition" in done.stderr.lower() and done.stderr.rstrip().endswith("nothing was submitted")
    assert slurm_cluster.jobs() == {} and not (tmp_path / "runs").exists()


def test_a_missing_scheduler_is_one_line(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, {"a": []}, steps=4)
    bare = {"PATH": str(Path(sys.executable).parent)}  # this Python, and no SLURM commands
    done = run_suite(tmp_path, None, str(suite), *ON_SLURM, env=bare)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the slurm executor needs SLURM's sbatch, squeue, scontrol on PATH" in done.stderr
    assert not (tmp_path / "runs").exists()
