"""Fault tests: a run stopped or killed at an exact moment resumes to the uninterrupted run's weights, bitwise.

Each scenario holds the trainer at a named moment (``torchnlq/pause_points.py``: inside the save
of a step after its shards are written, or at the start of a validation), delivers a signal
there, then runs the same command again and compares the final weights with those of a run that
was never interrupted, for 1 process and for 2 (torchrun, FSDP2, gloo).

Signals go where real ones come from: to every process of the run (a scheduler's SIGTERM, a
machine that dies: SIGKILL; torchrun starts its workers in sessions of their own, so this means
the launcher's group and each worker), or to the launcher alone (``kill PID``, Ctrl-C in its
terminal), which passes SIGTERM/SIGINT on to its workers.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from helpers.train import run_train, tiny_args

from torchnlq.checkpoint.checkpointer import list_checkpoints
from torchnlq.interop.load import load_model

pytestmark = pytest.mark.integration  # trainer subprocesses, torchrun

STEPS = 12
# Validation every 3 steps and checkpoints every 4: a signal during the validation of step 6 stops on a
# step without a scheduled save (so the stop itself saves), one during the save of step 8 on a step with one.
SCHEDULE = {"checkpoint__interval": 4, "validation__interval": 3}
TWO_PROC = ["--training.grad_accum_steps=1"]  # the same global batch as 1 process x 2 accumulation steps


def command(tmp: Path, name: str, ngpu: int) -> list[str]:
    return [*tiny_args(tmp, name, steps=STEPS, **SCHEDULE), *(TWO_PROC if ngpu > 1 else [])]


def final_weights(tmp: Path, name: str) -> dict[str, torch.Tensor]:
    return load_model(tmp / "outputs" / name / "checkpoints" / f"step-{STEPS}").model.state_dict()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, torch.Tensor]]:
    """Final weights of the uninterrupted run, per process count (1 and 2 agree to 1e-7, not bitwise)."""
    tmp = tmp_path_factory.mktemp("faults-ref")
    weights = {}
    for ngpu in (1, 2):
        proc = run_train(tmp, *command(tmp, f"ref{ngpu}", ngpu), ngpu=ngpu)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        weights[ngpu] = final_weights(tmp, f"ref{ngpu}")
    return weights


def interrupt(tmp: Path, name: str, ngpu: int, moment: str, sig: signal.Signals, everyone: bool) -> tuple[int, str]:
    """Start the run, wait until every worker is held at ``moment``, send ``sig``; return (exit code, output).

    ``everyone``: to the launcher's process group and to each worker; else to the launcher alone.
    """
    pause_dir = tmp / f"paused-{name}"
    pause_dir.mkdir()
    env = {"TORCHNLQ_PAUSE_AT": moment, "TORCHNLQ_PAUSE_DIR": str(pause_dir), "TORCHNLQ_PAUSE_SECONDS": "2"}
    proc = run_train(tmp, *command(tmp, name, ngpu), ngpu=ngpu, wait=False, env=env)
    try:
        deadline = time.monotonic() + 240
        while len(list(pause_dir.iterdir())) < ngpu:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"the run never reached {moment}"
            time.sleep(0.05)
        if everyone:
            os.killpg(proc.pid, sig)
            for marker in pause_dir.iterdir():  # each worker wrote its pid there
                pid = int(marker.read_text())
                if os.getpgid(pid) != proc.pid:  # a torchrun worker, in a session of its own
                    os.kill(pid, sig)
        else:
            proc.send_signal(sig)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


def resume_and_compare(tmp: Path, name: str, ngpu: int, from_step: int, reference: dict[str, torch.Tensor]) -> None:
    proc = run_train(tmp, *command(tmp, name, ngpu), ngpu=ngpu)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"checkpoints/step-{from_step} (step {from_step}," in proc.stdout, proc.stdout[-3000:]  # resumed there
    weights = final_weights(tmp, name)
    assert weights.keys() == reference.keys()
    for key, value in reference.items():
        assert torch.equal(weights[key], value), key  # bitwise


STOPS = [  # (ngpu, moment, signal, to every process?, the step the run stops and saves at)
    pytest.param(1, "save:8", signal.SIGTERM, True, 8, id="1proc-sigterm-mid-save"),
    pytest.param(1, "validation:6", signal.SIGTERM, True, 6, id="1proc-sigterm-mid-validation"),
    pytest.param(2, "validation:6", signal.SIGTERM, True, 6, id="2proc-scheduler-sigterm-mid-validation"),
    pytest.param(2, "save:8", signal.SIGINT, False, 8, id="2proc-ctrl-c-to-launcher-mid-save"),
]


@pytest.mark.parametrize("ngpu, moment, sig, everyone, stop_step", STOPS)
def test_a_signal_saves_exits_0_and_the_resume_is_bitwise(
    tmp_path: Path, reference: dict[int, dict[str, torch.Tensor]],
    ngpu: int, moment: str, sig: signal.Signals, everyone: bool, stop_step: int,
) -> None:
    code, out = interrupt(tmp_path, "run", ngpu, moment, sig, everyone)
    assert code == 0, out[-3000:]
    assert "Traceback" not in out
    hint = f"stopped by {sig.name} at step {stop_step}; saved step-{stop_step}: run the same command to resume"
    assert hint in out, out[-3000:]
    if ngpu > 1:  # the launcher ends with the hint itself, not torchrun's report
        assert out.strip().splitlines()[-1] == hint, out[-3000:]
    assert list_checkpoints(tmp_path / "outputs/run/checkpoints")[-1] == stop_step
    resume_and_compare(tmp_path, "run", ngpu, stop_step, reference[ngpu])


@pytest.mark.parametrize("ngpu", [1, 2], ids=["1proc", "2proc"])
def test_sigkill_mid_save_resumes_from_the_previous_checkpoint_bitwise(
    tmp_path: Path, reference: dict[int, dict[str, torch.Tensor]], ngpu: int,
) -> None:
    code, out = interrupt(tmp_path, "run", ngpu, "save:8", signal.SIGKILL, everyone=True)
    assert code == -signal.SIGKILL, out[-3000:]
    folder = tmp_path / "outputs/run/checkpoints"
    assert list_checkpoints(folder) == [4]  # the half-written step-8 is not taken for a checkpoint
    assert (folder / "step-8.partial").is_dir()
    resume_and_compare(tmp_path, "run", ngpu, 4, reference[ngpu])
