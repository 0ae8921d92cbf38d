"""Downstream accuracy in the loop (``[downstream]``, torchnlq/train/downstream.py, issue 34.2).

The reference for the logged figures is ``evaluate.py --multiple-choice`` (the library call behind it) on the
checkpoint the run saved at the same step; the loss rows of a run with tasks must equal, bit for bit, those
of the same run without; a task file that cannot be read is one line before the run folder exists.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers.train import scalars, tiny_config

from torchnlq.errors import UserError
from torchnlq.train.trainer import Trainer

WORDS = ["the king", "a ship", "my lord", "the sea", "good night", "fair wind", "sweet love", "dark hour"]


def write_task(path: Path, rows: int, seed: int = 0) -> Path:
    """A HellaSwag-format file of short byte-level questions (the labels arbitrary: accuracy is what a model
    makes of them)."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            endings = rng.sample(WORDS, 4)
            f.write(json.dumps({"ctx": f"ROMEO: {rng.choice(WORDS)} and", "endings": endings,
                                "label": rng.randrange(4), "ind": i}) + "\n")
    return path


@pytest.mark.integration  # trains twice, evaluates a checkpoint
def test_the_logged_accuracy_is_evaluate_pys_on_the_saved_checkpoint_and_the_losses_do_not_move(
        tmp_path: Path) -> None:
    from torchnlq.inference.multiple_choice import evaluate_multiple_choice

    tales = write_task(tmp_path / "tales.jsonl", 30)
    with_tasks = Trainer(tiny_config(tmp_path, "with", 8, downstream__tasks=str(tales), downstream__interval=4,
                                     downstream__max_examples=20))
    with_tasks.train()
    Trainer(tiny_config(tmp_path, "without", 8)).train()
    logged = scalars(tmp_path / "outputs/with/tb")
    for step in (4, 8):
        result = evaluate_multiple_choice(tmp_path / f"outputs/with/checkpoints/step-{step}", tales, limit=20)
        assert logged["downstream/tales/acc"][step] == pytest.approx(result.acc, abs=1e-7)
        assert logged["downstream/tales/acc_norm"][step] == pytest.approx(result.acc_norm, abs=1e-7)
    plain = scalars(tmp_path / "outputs/without/tb")
    assert logged["loss/train"] == plain["loss/train"] and logged["loss/val"] == plain["loss/val"]
    log = (tmp_path / "outputs/with/train.log").read_text()
    assert "downstream tasks every 4 steps: tales (20 rows); 80 endings scored per evaluation" in log


def test_a_task_file_that_cannot_be_read_is_one_line_before_the_run_folder(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ctx": "a", "endings": ["b"]}\n')  # no label
    for tasks, fragment in ((str(tmp_path / "missing.jsonl"), "does not exist"), (str(bad), "line 1")):
        with pytest.raises(UserError, match=fragment):
            Trainer(tiny_config(tmp_path, "bad", 4, downstream__tasks=tasks))
        assert not (tmp_path / "outputs" / "bad").exists()


def test_compare_runs_tables_and_plots_the_tasks_beside_the_loss(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from test_compare import make_run
    from torchnlq.experiments.compare import compare_runs

    base = make_run(tmp_path, "base", {10: 3.0, 20: 2.8})
    other = make_run(tmp_path, "res", {10: 2.9, 20: 2.7}, query="residual_mlp")
    for run, accs in ((base, {10: 0.25, 20: 0.30}), (other, {10: 0.26, 20: 0.35})):
        writer = SummaryWriter(str(run / "tb"))
        for step, acc in accs.items():
            writer.add_scalar("downstream/hellaswag/acc_norm", acc, step)
        writer.close()
    written = compare_runs([base, other], base, tmp_path / "cmp")
    table = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "| hellaswag acc_norm |" in table.splitlines()[2]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert rows["base"].rstrip().endswith("| 0.3000 |") and rows["res"].rstrip().endswith("| 0.3500 |")
    pytest.importorskip("matplotlib")
    assert tmp_path / "cmp" / "downstream.png" in written
