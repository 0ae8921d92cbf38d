"""An executor from outside the package: a test module's in-process executor, registered when a suite's
``plugins`` imports it, runs the suite (the local executor's losses, bit for bit), answers --status and adds to
the dry run, with nothing in torchnlq edited (docs/extending.md, "A new executor")."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from helpers.train import script_env

from torchnlq.cli import run_cli
from torchnlq.experiments.suite_run import main

from test_executor_slurm import losses, write_suite

#: The plugin: its own [executor] key (label), tasks run in turn by this process, a "held" file marks a task it
#: still holds (what --status reads), and a line in the dry run.
PLUGIN = '''
import subprocess
from dataclasses import dataclass

from torchnlq.config.job_config import option
from torchnlq.experiments.executors import Activity, Executor, ExecutorConfig, Outcome, register_executor, task_env

RAN = []


@dataclass(frozen=True)
class InlineConfig(ExecutorConfig):
    """[executor] of the inline executor."""

    label: str = option("inline", "What --status calls a task it holds.")


@register_executor
class Inline(Executor):
    name = "inline"
    Config = InlineConfig

    def run(self, tasks, dump, context, after_job, out):
        failed = []
        for task in tasks:
            if task.done():
                continue
            RAN.append(task.name)
            if subprocess.run(list(task.argv), env=task_env(task)).returncode:
                failed.append(task.name)
        return Outcome(tuple(failed))

    def alive(self, dump, names):
        return {n: Activity(False, self.config.label, "held") for n in names if (dump / f"{n}.held").exists()}

    def plan(self, suite_name, dump, count):
        return f"# {count} task(s) for the {self.config.label} executor of {suite_name}\\n"
'''


@pytest.fixture(autouse=True)
def own_registry() -> Iterator[None]:
    """The plugin is imported afresh by each test, and gone from the registry after it."""
    from torchnlq.experiments.executors import EXECUTORS

    before = dict(EXECUTORS)
    yield
    EXECUTORS.clear()
    EXECUTORS.update(before)
    sys.modules.pop("inline_executor", None)


def plugin_suite(tmp: Path, monkeypatch: pytest.MonkeyPatch, steps: int = 8) -> Path:
    """The two-run suite of the executor tests, with ``plugins = ["inline_executor"]`` and ``[executor] inline``."""
    (tmp / "inline_executor.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp))
    monkeypatch.chdir(tmp)
    suite = write_suite(tmp, {"linear": ["--model.query.type=linear"], "res": ["--model.query.type=residual_mlp"]},
                        steps=steps)
    suite.write_text('plugins = ["inline_executor"]\n' + suite.read_text() + '[executor]\ntype = "inline"\n'
                     'label = "in this process"\n')
    return suite


def test_a_plugin_executor_plans_and_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    suite = plugin_suite(tmp_path, monkeypatch)
    assert run_cli(main, [str(suite), "--dry-run"]) == 0
    assert "# 2 task(s) for the in this process executor of s" in capsys.readouterr().out
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "res.held").touch()
    assert run_cli(main, [str(suite), "--status", "--executor.label=queue Q"]) == 0
    states = capsys.readouterr().out.splitlines()
    assert states[0].endswith("executor inline") and "res     running, starting (queue Q)" in states
    assert run_cli(main, [str(suite), "--dry-run", "--executor.lable=x"]) == 2
    assert "unknown key 'executor.lable'; did you mean 'label'?" in capsys.readouterr().err
    assert run_cli(main, [str(suite), "--wait"]) == 2  # it waits for its tasks itself
    assert "--wait is for --executor slurm (the inline executor" in capsys.readouterr().err


@pytest.mark.integration  # four tiny training runs
def test_a_plugin_executor_runs_a_suite_as_the_local_one_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    suite = plugin_suite(tmp_path, monkeypatch)
    for key, value in script_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    assert run_cli(main, [str(suite)]) == 0  # in this process: the plugin runs the trainers
    import inline_executor

    assert inline_executor.RAN == ["linear", "res"]
    assert (tmp_path / "runs" / "comparison.md").is_file()
    assert run_cli(main, [str(suite)]) == 0 and inline_executor.RAN == ["linear", "res"]  # finished: skipped
    local = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "run_suite.py"), str(suite),
                            "--executor", "local", "--job.dump_folder=local"], cwd=tmp_path, env=script_env(tmp_path),
                           capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stdout[-2000:] + local.stderr[-2000:]
    for run in ("linear", "res"):
        assert losses(tmp_path / "runs" / run) == losses(tmp_path / "local" / run), run
    capsys.readouterr()
