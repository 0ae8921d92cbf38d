"""The multi-process launcher (torchnlq/train/launch.py): how a torchrun job ends, in one line.

A worker's user mistake becomes one ``error:`` line from the launcher (exit 2), whichever rank
found it; a bug keeps torchrun's report (exit 1). Signals and resumes under the launcher are
tested end to end in tests/test_faults.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT

from torchnlq.cli import LAUNCH_DIR_ENV, run_cli
from torchnlq.errors import UserError

WORKER = REPO_ROOT / "tests" / "workers" / "launch_worker.py"


def test_a_worker_hands_its_error_line_to_the_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")

    def main(args: list[str]) -> int:
        raise UserError("what is wrong; how to fix it")

    assert run_cli(main, []) == 2
    assert capsys.readouterr().err == ""  # the launcher prints it, once
    assert (tmp_path / "error-rank3.txt").read_text() == "what is wrong; how to fix it"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error-rank3.txt"]


def test_without_the_launcher_the_line_is_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv(LAUNCH_DIR_ENV, raising=False)

    def main(args: list[str]) -> int:
        raise UserError("what is wrong")

    assert run_cli(main, []) == 2
    assert capsys.readouterr().err == "error: what is wrong\n"


def launch(tmp: Path, scenario: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-m", "torchnlq.train.launch", "--standalone", "--nproc_per_node", "2",
           "--tee", "3", str(WORKER), scenario]
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.integration  # torchrun with 2 processes
def test_a_mistake_found_by_one_rank_is_one_error_line(tmp_path: Path) -> None:
    proc = launch(tmp_path, "rank1-mistake")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and "ChildFailedError" not in output
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert errors == ["error: training.device 'cuda:1' does not exist on this node; use NGPU <= the GPUs it has"]
    assert list(tmp_path.glob("torchnlq-launch-*")) == []  # the hand-over folder is gone


@pytest.mark.integration  # torchrun with 2 processes
def test_a_bug_keeps_torchruns_report(tmp_path: Path) -> None:
    proc = launch(tmp_path, "crash")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ZeroDivisionError" in proc.stdout + proc.stderr  # the worker's traceback is not hidden
    assert "launch_worker.py FAILED" in proc.stderr  # torchrun's failure report, as torchrun prints it
