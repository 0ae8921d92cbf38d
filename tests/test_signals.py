"""Signals compose (issue 31.3): any number of SIGINT/SIGTERM at any moment leave a run that the same command
resumes from its last complete checkpoint or, before the first, starts again (no --job.rerun).

Real signals go to a real ``python -m torchnlq.train`` process held at a named moment
(``torchnlq/pause_points.py``: after a step, inside a save, at a validation, before the final export);
the same command then runs again in this process. A second signal during a save waits until the save
is written; outside a save, a second signal of the same kind stops the process at once (SIGINT:
KeyboardInterrupt; SIGTERM: its default action), which leaves nothing half-written that a start would
take for a result; a ``step-N.partial`` a killed save left is removed by the next start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchnlq.checkpoint.checkpointer import list_checkpoints, step_folders
from torchnlq.cli import run_cli
from torchnlq.interop.load import load_model
from torchnlq.train.__main__ import main as train_main

from helpers import REPO_ROOT
from helpers.train import tiny_args

STEPS = 6
INT, TERM, KILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL


def command(tmp: Path, **overrides: object) -> list[str]:
    schedule = {"checkpoint__interval": 4, "validation__interval": 2, "steps": STEPS, **overrides}
    return tiny_args(tmp, **schedule)


def interrupt(tmp: Path, args: list[str], plan: list[tuple[str, list[signal.Signals]]]) -> tuple[int, str]:
    """Run the trainer, and at each moment of ``plan`` (in order) send its signals while it is held there;
    return (exit code, output)."""
    pauses = tmp / f"paused-{len(list(tmp.glob('paused-*')))}"
    pauses.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHNLQ_PAUSE_AT": ",".join(m for m, _ in plan),
           "TORCHNLQ_PAUSE_DIR": str(pauses), "TORCHNLQ_PAUSE_SECONDS": "2", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "torchnlq.train", *args], cwd=tmp, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for moment, signals in plan:
            marker = pauses / f"{moment.replace(':', '-')}-rank0"
            deadline = time.monotonic() + 120
            while not marker.exists():
                if proc.poll() is not None:  # it ended before the moment: the signals before said so
                    return proc.returncode, proc.communicate()[0]
                assert time.monotonic() < deadline, f"the run never reached {moment}"
                time.sleep(0.02)
            for sig in signals:
                proc.send_signal(sig)
                time.sleep(0.2)  # each its own delivery
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def again(args: list[str], capfd: pytest.CaptureFixture[str]) -> str:
    """The same command, in this process: it must finish the run; returns its output."""
    capfd.readouterr()
    code = run_cli(train_main, args)
    out, err = capfd.readouterr()
    assert code == 0, out[-2000:] + err
    return out


def checkpoints(tmp: Path) -> Path:
    return tmp / "outputs" / "run" / "checkpoints"


SCENARIOS = [  # (moments and the signals sent there, exit code, the last complete checkpoint then, what it says)
    pytest.param([("step:1", [INT]), ("save:1", [INT])], 0, 1, "stopped by SIGINT at step 1; saved step-1",
                 id="ctrl-c-twice-the-second-during-the-save-the-first-asked-for"),
    pytest.param([("save:4", [TERM, TERM, INT])], 0, 4, "stopped by SIGTERM at step 4; saved step-4",
                 id="three-signals-during-a-scheduled-save"),
    pytest.param([("validation:2", [INT, INT])], 130, None, "interrupted",
                 id="a-second-sigint-during-a-validation-before-any-checkpoint"),
    pytest.param([("step:5", [TERM, TERM])], -TERM, 4, "",
                 id="a-second-sigterm-after-a-step-kills-it"),
    pytest.param([("save:4", [KILL])], -KILL, None, "",
                 id="sigkill-during-the-first-save"),
]


@pytest.mark.integration  # a trainer subprocess per scenario
@pytest.mark.parametrize("plan, code, last, says", SCENARIOS)
def test_any_signals_leave_a_run_the_same_command_finishes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str],
    plan: list[tuple[str, list[signal.Signals]]], code: int, last: int | None, says: str,
) -> None:
    args = command(tmp_path)
    returncode, out = interrupt(tmp_path, args, plan)
    assert returncode == code, out[-3000:]
    assert says in out and "Traceback" not in out, out[-3000:]
    complete = list_checkpoints(checkpoints(tmp_path))
    assert complete == ([last] if last else [])
    assert step_folders(checkpoints(tmp_path)) == complete  # no step-N folder is half a checkpoint
    partials = list(checkpoints(tmp_path).glob("*.partial"))
    assert partials == ([checkpoints(tmp_path) / "step-4.partial"] if code == -KILL else [])

    out = again(args, capfd)  # no --job.rerun
    if last:
        assert f"resumed from {checkpoints(tmp_path) / f'step-{last}'} (step {last}," in out
    else:
        run = tmp_path / "outputs" / "run"
        assert f"the earlier run is in {run / 'previous-1'}" in out  # its train.log and tb/ kept, set aside
        assert (run / "previous-1" / "train.log").is_file()
    for partial in partials:
        assert f"removed {partial}" in out and not partial.exists()
    assert list_checkpoints(checkpoints(tmp_path))[-1] == STEPS


@pytest.mark.integration
def test_a_signal_during_the_final_export_is_finished_by_the_same_command(
    tmp_path: Path, capfd: pytest.CaptureFixture[str],
) -> None:
    args = command(tmp_path, checkpoint__export_at_end=True)
    code, out = interrupt(tmp_path, args, [(f"export:{STEPS}", [TERM])])
    assert code == 143 and "terminated: stopped before finishing" in out, out[-3000:]
    run = tmp_path / "outputs" / "run"
    assert not (run / "export").exists() and not list(run.glob(".export.tmp-*"))
    out = again(args, capfd)
    assert "nothing to do: the run is complete" in out and f"exported {run / 'export'}" in out
    assert load_model(run / "export").args.n_layers == 2


@pytest.mark.parametrize("info, start_step, enabled, expected", [
    ({"step": 0, "finished": False}, 0, True, "set aside"),  # stopped before its first checkpoint
    ({"step": 20000, "finished": False}, 20000, True, "set aside"),  # a branch (initial load at 20000), the same
    ({"step": 37, "finished": False}, 0, True, "refused"),  # it recorded progress: its logs are a result
    ({"step": 4, "finished": True}, 0, True, "refused"),  # a finished run
    ({"step": 0, "finished": False}, 0, False, "refused"),  # checkpoints off: its logs are all it leaves
])
def test_which_earlier_start_is_set_aside_unasked(tmp_path: Path, info: dict, start_step: int, enabled: bool,
                                                  expected: str) -> None:
    """Run folders without a checkpoint (no trainer): set aside without --job.rerun only when nothing is lost."""
    import json

    from torchnlq.config.job_config import Checkpoint
    from torchnlq.errors import UserError
    from torchnlq.train.run_start import RunStart, must_set_aside

    (tmp_path / "run_info.json").write_text(json.dumps({**info, "steps": 30000}))
    start = RunStart("initial" if start_step else "fresh", step=start_step)
    if expected == "refused":
        with pytest.raises(UserError, match="no checkpoint to resume from"):
            must_set_aside(tmp_path, start, False, Checkpoint(enabled=enabled))
    else:
        assert must_set_aside(tmp_path, start, False, Checkpoint(enabled=enabled)) is not None
    assert must_set_aside(tmp_path, start, True, Checkpoint(enabled=enabled)) == "job.rerun"


def test_a_start_removes_only_the_partial_saves_that_hold_nothing_but_a_saves_files(tmp_path: Path) -> None:
    import logging

    from torchnlq.checkpoint.checkpointer import Checkpointer
    from torchnlq.config.job_config import Checkpoint

    folder = tmp_path / "checkpoints"
    killed = {"step-4.partial": ["__0_0.distcp", "rng-rank0.pt", "torchnlq.json", ".metadata.tmp"],
              "step-5.partial": [], "step-8.partial": ["__0_0.distcp", "notes.txt"], "step-x.partial": []}
    for name, entries in killed.items():
        (folder / name).mkdir(parents=True)
        for entry in entries:
            (folder / name / entry).write_text("x")
    (folder / "step-9.partial").symlink_to(tmp_path)  # a link: never followed into, never removed
    removed = Checkpointer(Checkpoint(), tmp_path, 0, logging.getLogger("test")).remove_abandoned_saves()
    assert removed == [folder / "step-4.partial", folder / "step-5.partial"]
    assert sorted(p.name for p in folder.iterdir()) == ["step-8.partial", "step-9.partial", "step-x.partial"]
    assert (folder / "step-8.partial" / "notes.txt").read_text() == "x"
