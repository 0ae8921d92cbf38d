"""The pool executor: several runs at once on this machine, each with its share of the CPU threads (or its own
GPUs), with the results of the one-after-another local executor; [executor] and --executor.KEY mistakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from helpers.train import script_env

from torchnlq.errors import UserError
from torchnlq.experiments.suite_command import build_executor, table_options
from torchnlq.experiments.pool import PoolConfig, pool_slots

from test_executor_slurm import losses, write_suite


def test_table_options_come_off_the_command_line() -> None:
    rest, tables = table_options(
        ["--executor", "pool", "--training.steps=3", "--executor.workers=4", "--executor.devices", "[0, 1]",
         "--sweep.storage", "sqlite:///x.db", "--executor.time=4:00:00"], ("executor", "sweep"))
    assert rest == ["--training.steps=3"]
    assert tables == {"executor": {"type": "pool", "workers": "4", "devices": "[0, 1]", "time": "4:00:00"},
                      "sweep": {"storage": "sqlite:///x.db"}}
    executor = build_executor("s.toml", {"type": "slurm", "partition": "gpu"}, tables["executor"])
    assert executor.name == "pool" and executor.config == PoolConfig("pool", workers=4, devices=[0, 1])  # slurm's
    # partition is kept for another run and ignored here; each value is read by its option's type


@pytest.mark.parametrize("table,fragment", [
    ({"type": "pol"}, "executor.type: 'pol' is not one of local, pool, slurm; did you mean 'pool'?"),
    ({"workrs": 2}, "unknown key 'executor.workrs'; did you mean 'workers'?"),
    ({"workers": 0}, "executor.workers must be >= 1, got 0"),
    ({"gpus_per_run": -1}, "executor.gpus_per_run must be >= 0, got -1"),
    ({"type": "pool", "devices": [0, -1]}, "executor.devices[1] must be >= 0, got -1"),
    ({"type": "slurm", "partition": 5}, "executor.partition expects str, got int 5"),
    ({"type": "slurm", "sbatch_args": "--exclusive"}, "executor.sbatch_args expects a list of str"),
])
def test_executor_mistakes_are_one_line(table: dict, fragment: str) -> None:
    with pytest.raises(UserError, match=None) as excinfo:
        build_executor("s.toml", table, {})
    assert fragment in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_a_pool_refuses_a_gpu_listed_twice() -> None:
    with pytest.raises(UserError, match="lists a GPU twice"):
        pool_slots(PoolConfig("pool", devices=[0, 0]))


def test_a_cpu_pool_divides_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    slots = pool_slots(PoolConfig("pool", workers=3, gpus_per_run=0))
    assert slots == [{"OMP_NUM_THREADS": "2", "NGPU": "1"}] * 3
    with pytest.raises(UserError, match="lists GPU 1, but this machine shows 0 CUDA device"):
        pool_slots(PoolConfig("pool", devices=[1]))


def test_a_gpu_pool_gives_each_run_its_own_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    slots = pool_slots(PoolConfig("pool", gpus_per_run=2))
    assert [s["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0,1", "2,3", "4,5", "6,7"]
    assert {s["NGPU"] for s in slots} == {"2"}
    slots = pool_slots(PoolConfig("pool", devices=[3, 5, 7], gpus_per_run=1))
    assert [s["CUDA_VISIBLE_DEVICES"] for s in slots] == ["3", "5", "7"]


@pytest.mark.integration  # six trainer processes
def test_a_pool_runs_at_once_what_local_runs_in_turn_with_the_same_results(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    suite = write_suite(tmp_path, {"linear": ["--model.query.type=linear"], "res": ["--model.query.type=residual_mlp"],
                                   "res_lr": ["--model.query.type=residual_mlp", "--optimizer.lr=1e-3"]}, steps=40)
    script = str(REPO_ROOT / "scripts" / "run_suite.py")
    env = script_env(tmp_path)
    for folder, options in (("local", []), ("pool", ["--executor", "pool", "--executor.workers=2"])):
        done = subprocess.run([sys.executable, script, str(suite), f"--job.dump_folder={folder}", *options],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    windows = {}
    for run in ("linear", "res", "res_lr"):
        assert losses(tmp_path / "pool" / run) == losses(tmp_path / "local" / run), run  # bit for bit
        acc = EventAccumulator(str(tmp_path / "pool" / run / "tb"))
        acc.Reload()
        times = [e.wall_time for e in acc.Scalars("loss/train")]
        windows[run] = (min(times), max(times))  # first and last training step, as TensorBoard stamped them
    (a0, a1), (b0, b1) = windows["linear"], windows["res"]
    assert a0 < b1 and b0 < a1, windows  # the pool's two places trained at the same time
    assert windows["res_lr"][0] > min(a1, b1)  # the third waited for a free place
    log = (tmp_path / "pool" / "suite.log").read_text()
    assert log.count("executor=pool slot=") == 3 and (tmp_path / "pool" / "logs" / "res.out").is_file()
    assert (tmp_path / "pool" / "comparison.md").is_file()
    assert json.loads((tmp_path / "pool" / "res_lr" / "run_info.json").read_text())["finished"]
