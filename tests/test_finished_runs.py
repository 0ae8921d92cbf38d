"""A finished run is read-only to every later command that meets it (issue 47.1): its command run again (as a job
script or the suite's ``--dry-run`` line prints it), with ``job.rerun``, with settings changed, in this process or
through ./run_train.sh, changes no byte or time stamp of its record, checkpoints, log or events."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from helpers.train import run_train, tiny_args, tiny_config

STEPS = 4


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run trained to its end (validated and saved at its last step), its folder copied by each test."""
    from torchnlq.train.trainer import Trainer

    root = tmp_path_factory.mktemp("finished")
    Trainer(tiny_config(root, "done", STEPS)).train()
    return root


def tree(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file below ``folder``: (mtime, size, bytes), and every folder (its mtime)."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, *((p.stat().st_size, p.read_bytes()) if p.is_file()
                                                                  else (0, b"")))
            for p in sorted(folder.rglob("*"))}


#: The commands that can meet the finished run: the same one, and variants a user or a script may add.
VARIANTS = {
    "same-command": {},
    "job-rerun": {"job.rerun": True},
    "changed-learning-rate": {"optimizer.lr": 1e-3},
    "validation-off": {"validation.enabled": False},
    "tensorboard-off": {"metrics.tensorboard": False},
    "other-validation-interval": {"validation.interval": 2},
}


#: Every variant in this process; through ./run_train.sh (a subprocess: the same code path) the two kinds of command.
CASES = [("trainer", v) for v in VARIANTS] + [("run_train.sh", v) for v in ("same-command", "job-rerun")]


@pytest.mark.parametrize("entry, variant", CASES)
def test_a_finished_run_is_read_only_to_a_later_command(finished: Path, tmp_path: Path, variant: str,
                                                        entry: str, capsys: pytest.CaptureFixture) -> None:
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True, copy_function=shutil.copy2)
    run = tmp_path / "outputs" / "done"
    before = tree(run)
    info = json.loads((run / "run_info.json").read_text())
    assert info["finished"] and info["last_val_loss"] is not None  # the record that must survive
    extra = {k.replace(".", "__"): v for k, v in VARIANTS[variant].items()}
    if entry == "trainer":
        from torchnlq.train.trainer import Trainer

        Trainer(tiny_config(tmp_path, "done", STEPS, **extra)).train()
        said = "".join(capsys.readouterr())
    else:
        args = [a.replace("=True", "=true").replace("=False", "=false") for a in tiny_args(tmp_path, "done", STEPS,
                                                                                          **extra)]
        proc = run_train(tmp_path, *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        said = proc.stdout + proc.stderr
    assert "nothing to do: the run is complete at step 4" in said, said[-2000:]
    assert tree(run) == before, sorted(set(tree(run).items()) ^ set(before.items()))[:4]
    assert sorted(os.listdir(tmp_path / "outputs")) == sorted(os.listdir(finished / "outputs"))

