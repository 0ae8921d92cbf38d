"""scripts/loss_compare.py: two runs' per-step losses, read (run folders, loss files) or trained (configs, commits)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO_ROOT
from helpers.loss_baselines import FOLDER, overrides

from torchnlq.cli import run_cli
from torchnlq.experiments.loss_compare import difference_table, main


def write_run(folder: Path, train: dict[int, float], val: dict[int, float]) -> Path:
    """A run folder as the trainer leaves its losses: TensorBoard's loss/train and loss/val in tb/."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder / "tb"))
    for tag, losses in (("loss/train", train), ("loss/val", val)):
        for step, loss in losses.items():
            writer.add_scalar(tag, loss, step)
    writer.close()
    return folder


def test_the_table_shows_each_steps_difference_and_flags_those_beyond_the_tolerance() -> None:
    one_ulp_above_3 = float(np.nextafter(np.float32(3.0), np.float32(4.0)))
    a = {"train": {1: 5.0, 2: 4.0, 3: 3.0, 4: math.nan, 5: 2.0}, "val": {2: 4.5}}
    b = {"train": {1: 5.0, 2: 4.0 * (1 + 3e-6), 3: one_ulp_above_3, 4: math.nan, 5: math.nan}, "val": {2: 4.5, 4: 1.0}}
    table, problems = difference_table(a, b, 0.0)  # bitwise: one float32 ulp is a difference
    assert problems == ["train step 2: rel diff 3.00e-06", f"train step 3: rel diff {(one_ulp_above_3 - 3) / 3:.2e}",
                        "train step 5: rel diff nan", "val step 4 is only in B"]
    row = next(line for line in table.splitlines() if line.startswith("train      2"))
    assert row.split()[-3:] == [f"{4.0 * 3e-6:+.2e}", "3.00e-06", "*"]  # B - A, |B - A| / |A|, beyond
    assert "train: max |B - A| 1.200e-05, max rel diff inf (step 5)" in table  # NaN against a number counts as inf
    _, problems = difference_table(a, b, 1e-5)
    assert problems == ["train step 5: rel diff nan", "val step 4 is only in B"]


def test_two_run_folders_exit_1_under_assert_equal_only_beyond_the_tolerance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a", {1: 5.5, 2: 4.25}, {2: 4.5})
    b = write_run(tmp_path / "b", {1: 5.5, 2: 4.25}, {2: 4.5})
    c = write_run(tmp_path / "c", {1: 5.5, 2: 4.375}, {2: 4.5})  # 3% higher at step 2
    assert run_cli(main, [str(a), str(b), "--assert-equal"]) == 0
    assert "equal within tolerance 0" in capsys.readouterr().out
    assert run_cli(main, [str(a), str(c), "--assert-equal"]) == 1
    out = capsys.readouterr().out
    assert "train      2            4.25           4.375   +1.25e-01  2.94e-02 *" in out
    assert run_cli(main, [str(a), str(c)]) == 0  # a report, not an assertion
    assert run_cli(main, [str(a), str(c), "--assert-equal", "--tolerance", "0.03"]) == 0
    capsys.readouterr()


def test_a_loss_file_compares_with_the_run_folder_of_the_same_losses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", {1: 5.5, 2: 4.25}, {2: 4.5})
    (tmp_path / "losses.json").write_text(json.dumps({"train_loss": {"1": 5.5, "2": 4.25}, "val_loss": {"2": 4.5}}))
    assert run_cli(main, [str(tmp_path / "losses.json"), str(run), "--assert-equal"]) == 0
    (tmp_path / "short.json").write_text(json.dumps({"train_loss": {"1": 5.5}}))
    assert run_cli(main, [str(tmp_path / "short.json"), str(run), "--assert-equal"]) == 1
    assert "train step 2 is only in B" in capsys.readouterr().out


@pytest.mark.integration
def test_run_train_sh_repeats_a_stored_loss_file_bit_for_bit(tmp_path: Path) -> None:
    """The stored losses (trained in-process) against the command the file records, run by loss_compare."""
    stored = FOLDER / "linear.json"
    sets = [f"--set={arg[2:]}" for arg in overrides("linear")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "loss_compare.py"), str(stored),
                           str(REPO_ROOT / json.loads(stored.read_text())["command"].split()[2]), *sets,
                           "--assert-equal"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "equal within tolerance 0" in done.stdout and "train     30" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"] and not any((tmp_path / "tmp").iterdir())


@pytest.mark.integration
def test_a_commit_against_the_working_tree_runs_each_ones_code_and_leaves_the_checkout_alone(tmp_path: Path) -> None:
    repo = tmp_path / "repo"  # a repository of its own: this checkout's git state is never touched by a test
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, capture_output=True,
                            text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO_ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, repo / name)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    layers = repo / "torchnlq" / "models" / "layers.py"  # the working tree's init differs from the commit's
    source = layers.read_text()
    drawn = "nn.init.normal_(self.proj.weight, mean=0.0, std=residual_std)"
    assert drawn in source
    layers.write_text(source.replace(drawn, drawn.replace("std=residual_std", "std=residual_std * 1.01"), 1))
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout
    tiny = ["training.steps=3", "training.micro_batch_size=4", "training.seq_len=32", "training.device=cpu",
            "validation.interval=3", "validation.sequences=8"]
    done = subprocess.run(
        [sys.executable, str(repo / "scripts" / "loss_compare.py"), "HEAD:train_configs/debug_model.toml",
         str(repo / "train_configs" / "debug_model.toml"), *[f"--set={s}" for s in tiny], "--assert-equal"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=400)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count(" *") == 4  # all three training steps and the validation at 3
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout == status
    worktrees = subprocess.run([*git, "worktree", "list", "--porcelain"], capture_output=True, text=True).stdout
    assert worktrees.count("worktree ") == 1  # the temporary one is gone


def test_a_branch_against_a_straight_run_compares_from_the_branch_point(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    straight = write_run(tmp_path / "straight", {s: 6.0 - 0.1 * s for s in range(1, 16)}, {5: 5.6, 10: 5.1, 15: 4.6})
    branch = write_run(tmp_path / "branch", {s: 6.0 - 0.1 * s for s in range(11, 16)}, {10: 5.1, 15: 4.6})
    assert run_cli(main, [str(straight), str(branch), "--assert-equal"]) == 0
    out = capsys.readouterr().out
    assert "train: A starts at step 1, B at step 11; compared from step 11" in out
    assert "val: A starts at step 5, B at step 10; compared from step 10" in out
    assert "equal within tolerance 0" in out and "only in" not in out
    # After the branch point a missing or different step is still a problem.
    short = write_run(tmp_path / "short", {s: 6.0 - 0.1 * s for s in range(11, 15)}, {10: 5.1, 15: 4.7})
    assert run_cli(main, [str(straight), str(short), "--assert-equal"]) == 1
    out = capsys.readouterr().out
    assert "train step 15 is only in A" in out and "val step 15: rel diff" in out
