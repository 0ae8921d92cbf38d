"""Divergence is loud: skipped updates have a limit, and non-finite weights are never saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchnlq.checkpoint.checkpointer import list_checkpoints
from torchnlq.train.trainer import Trainer, TrainingDiverged

from helpers.train import tiny_config

pytestmark = pytest.mark.integration  # each test runs the trainer for a few steps


def test_too_many_skipped_updates_in_a_row_stop_the_run(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "nan", steps=12, checkpoint__interval=2, training__on_nonfinite="skip",
                                  training__max_consecutive_skips=3))
    real = trainer.micro_batch_loss
    # From step 5 on every loss is NaN: steps 5, 6, 7 are skipped, and the third in a row stops the run.
    trainer.micro_batch_loss = lambda x, y: real(x, y) * (float("nan") if trainer.step >= 4 else 1.0)
    with pytest.raises(TrainingDiverged, match=r"3 updates in a row had a non-finite loss"):
        trainer.train()
    assert trainer.skipped_steps == 3
    # A skipped update leaves the weights as they were, so step 6 (weights of step 4) was a good save;
    # the run stopped at step 7 without saving anything of it.
    assert trainer.step == 6
    assert list_checkpoints(tmp_path / "outputs" / "nan" / "checkpoints") == [2, 4, 6]


def test_weights_made_non_finite_by_a_finite_step_are_not_saved(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "inf", steps=12, checkpoint__interval=2, checkpoint__export_at_end=True))
    real_step = trainer.optimizer.step

    def step(*args, **kwargs):
        out = real_step(*args, **kwargs)
        if trainer.step == 3:  # the update of step 4, a checkpoint step: its loss was finite, the weights are not
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("inf"))
        return out

    trainer.optimizer.step = step
    with pytest.raises(TrainingDiverged, match=r"weights are non-finite after step 4; not saved"):
        trainer.train()
    assert list_checkpoints(tmp_path / "outputs" / "inf" / "checkpoints") == [2]
    assert not (tmp_path / "outputs" / "inf" / "export").exists()
