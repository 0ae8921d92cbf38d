"""Checkpoints: exact resume, atomic saves, fingerprints, non-finite handling, async saves (one process)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import torchnlq.checkpoint.checkpointer as checkpoint_mod
from torchnlq.errors import UserError
from torchnlq.checkpoint.checkpointer import list_checkpoints
from torchnlq.train.trainer import Trainer, TrainingDiverged

from helpers.train import scalars, tiny_config

pytestmark = pytest.mark.integration  # every test runs the Trainer end to end (seconds each)


def train(tmp: Path, name: str, steps: int = 12, **extra: object) -> Trainer:
    trainer = Trainer(tiny_config(tmp, name, steps, **extra))
    trainer.train()
    return trainer


def losses(tmp: Path, name: str) -> tuple[dict[int, float], dict[int, float]]:
    data = scalars(tmp / "outputs" / name / "tb")
    return data["loss/train"], data["loss/val"]


def test_resume_is_bitwise_identical(tmp_path: Path) -> None:
    train(tmp_path, "full")
    # The interrupted run: same schedule (decay_steps is pinned to 12), stopped after step 6.
    train(tmp_path, "split", training__steps=6, checkpoint__interval=3)
    assert list_checkpoints(tmp_path / "outputs/split/checkpoints") == [3, 6]
    resumed = train(tmp_path, "split", checkpoint__interval=3)
    assert resumed.step == 12
    full_train, full_val = losses(tmp_path, "full")
    split_train, split_val = losses(tmp_path, "split")
    assert set(split_train) == set(range(1, 13))
    for step in range(1, 13):
        assert split_train[step] == full_train[step], step  # bitwise, not approx
    for step in (4, 8, 12):
        assert split_val[step] == full_val[step], step
    # The weights themselves end identical too (a new Trainer resumes from full's last checkpoint).
    full = Trainer(tiny_config(tmp_path, "full"))
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name


def test_muon_groups_and_wsd_resume_bitwise(tmp_path: Path) -> None:
    """Muon (its momentum buffers in the DCP optimizer entry beside AdamW's moments), a group with its own
    LR multiplier and a WSD schedule: stopped at step 6 and resumed, the run is the uninterrupted one, bit for
    bit; each group's LR is the schedule's times its multiplier."""
    from torchnlq.config.job_config import OptimizerGroup

    def config(name: str, steps: int = 12, **extra: object):
        cfg = tiny_config(tmp_path, name, steps, optimizer__name="muon", lr_schedule__name="wsd",
                          lr_schedule__decay_shape="1-sqrt", lr_schedule__decay_length=4, lr_schedule__decay_steps=12,
                          lr_schedule__min_lr=3e-5, checkpoint__interval=3, **extra)
        cfg.optimizer.groups = [OptimizerGroup(name="query_mlp", kind="query_mlp", lr_multiplier=2.0)]
        return cfg

    def run(name: str, steps: int = 12) -> Trainer:
        trainer = Trainer(config(name, steps))
        trainer.train()
        return trainer

    run("full")
    run("split", steps=6)
    resumed = run("split")
    full = scalars(tmp_path / "outputs/full/tb")
    split = scalars(tmp_path / "outputs/split/tb")
    for step in range(1, 13):
        assert split["loss/train"][step] == full["loss/train"][step], step
    for step in range(1, 13):  # lr/<group> = schedule (steps 0..11: warmup 2, stable to 7, 1-sqrt over 8..11)
        it = step - 1
        base = 3e-3 * (it + 1) / 3 if it < 2 else 3e-3 if it < 8 else 3e-5 + (3e-3 - 3e-5) * (1 - ((it - 8) / 4) ** 0.5)
        assert full["lr/query_mlp"][step] == pytest.approx(2 * base, rel=1e-6), step
        assert full["lr/muon"][step] == pytest.approx(base, rel=1e-6), step
    fresh = Trainer(config("full"))
    assert fresh.step == 12
    for (name, p), q in zip(resumed.model.named_parameters(), fresh.model.parameters()):
        assert torch.equal(p, q), name
    # Resuming with other optimizer groups is refused by the record, in one line, before any state is read.
    with pytest.raises(UserError, match="optimizer.muon 'muon, 8 tensors' there, 'muon, 12 tensors' here"):
        cfg = config("full", training__steps=14)
        cfg.optimizer.groups = []
        Trainer(cfg)
    with pytest.raises(UserError, match="optimizer.decay 'adamw, 2 tensors' there, "):
        Trainer(tiny_config(tmp_path, "full", 14))


def test_rerun_of_a_finished_run_does_nothing(tmp_path: Path) -> None:
    train(tmp_path, "done", steps=4)
    again = train(tmp_path, "done", steps=4)
    assert again.step == 4 and again.last_val_loss is None  # nothing trained, nothing validated


def test_keep_latest_k_and_load_step(tmp_path: Path) -> None:
    train(tmp_path, "keep", checkpoint__interval=2, checkpoint__keep_latest_k=2)
    folder = tmp_path / "outputs/keep/checkpoints"
    assert list_checkpoints(folder) == [10, 12]
    trainer = Trainer(tiny_config(tmp_path, "keep", checkpoint__load_step=10))
    assert trainer.step == 10
    with pytest.raises(UserError, match="load_step=4 not found"):
        Trainer(tiny_config(tmp_path, "keep", checkpoint__load_step=4))


def test_killed_save_leaves_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train(tmp_path, "kill", steps=4)  # saves step-4
    real_save = checkpoint_mod.dcp.save

    def dying_save(state, checkpoint_id):  # writes part of the files, then the process "dies"
        real_save({"model": state["model"]}, checkpoint_id=checkpoint_id)
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(checkpoint_mod.dcp, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, "kill", steps=8)
    folder = tmp_path / "outputs/kill/checkpoints"
    assert list_checkpoints(folder) == [4]
    assert (folder / "step-8.partial").is_dir()  # the half-written save is not taken for a checkpoint
    monkeypatch.setattr(checkpoint_mod.dcp, "save", real_save)
    resumed = Trainer(tiny_config(tmp_path, "kill", steps=8))
    assert resumed.step == 4
    resumed.train()
    assert list_checkpoints(folder) == [4, 8] and not (folder / "step-8.partial").exists()


@pytest.mark.parametrize(
    "override, key",
    [({"model__dim": 64}, "model.dim"), ({"model__query__type": "linear"}, "model.query.type"),
     ({"data__seed": 7}, "data.seed"), ({"training__seq_len": 16}, "data.seq_len")],
)
def test_resume_with_other_model_or_data_is_refused(tmp_path: Path, override: dict, key: str) -> None:
    train(tmp_path, "fp", steps=4)
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        Trainer(tiny_config(tmp_path, "fp", steps=8, **override))


def test_initial_load_path_loads_weights_only(tmp_path: Path) -> None:
    src = train(tmp_path, "src", steps=4)
    path = tmp_path / "outputs/src/checkpoints/step-4"
    dst = Trainer(tiny_config(tmp_path, "dst", steps=4, checkpoint__initial_load_path=path))
    assert dst.step == 0
    for p, q in zip(src.model.parameters(), dst.model.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(UserError, match="model.dim"):
        Trainer(tiny_config(tmp_path, "dst2", steps=4, model__dim=64, checkpoint__initial_load_path=path))


def _poison_step(trainer: Trainer, bad_step: int) -> None:
    real = trainer.micro_batch_loss

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = real(x, y)
        return loss * float("nan") if trainer.step + 1 == bad_step else loss

    trainer.micro_batch_loss = loss_fn


def test_nonfinite_loss_stops_and_saves_nothing_bad(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "nan"))
    _poison_step(trainer, 7)
    with pytest.raises(TrainingDiverged, match="at step 7"):
        trainer.train()
    assert list_checkpoints(tmp_path / "outputs/nan/checkpoints") == [4]


def test_nonfinite_loss_between_log_steps_stops_at_the_next_one_logging_nothing_of_it(tmp_path: Path) -> None:
    # The stop check is read only where something is logged, evaluated or saved (no per-step wait for
    # the device): a bad step 3 is found at the next such step (validation every 4 here), named as
    # step 3, and nothing from step 3 on is written.
    trainer = Trainer(tiny_config(tmp_path, "late", metrics__log_interval=5, checkpoint__enabled=False))
    _poison_step(trainer, 3)
    with pytest.raises(TrainingDiverged, match="at step 3;"):
        trainer.train()
    assert 3 < trainer.step < 12
    logged = scalars(tmp_path / "outputs/late/tb")
    assert not [step for values in logged.values() for step in values if step >= 3]


def test_nonfinite_loss_skip_mode(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "skip", training__on_nonfinite="skip"))
    _poison_step(trainer, 3)
    trainer.train()
    assert trainer.step == 12 and trainer.skipped_steps == 1
    data = scalars(tmp_path / "outputs/skip/tb")
    assert data["skipped_steps"][2] == 0 and data["skipped_steps"][3] == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_async_save_equals_sync_save(tmp_path: Path) -> None:
    sync = train(tmp_path, "sync", steps=4)
    train(tmp_path, "async", steps=4, checkpoint__async_mode=True)
    a = Trainer(tiny_config(tmp_path, "async", steps=8))
    assert a.step == 4
    for p, q in zip(sync.model.parameters(), a.model.parameters()):
        assert torch.equal(p, q)
    shutil.rmtree(tmp_path / "outputs")


def test_export_at_end_loads_with_equal_logits(tmp_path: Path) -> None:
    import torchnlq

    trainer = train(tmp_path, "exp", steps=4, checkpoint__export_at_end=True)
    model = torchnlq.load_pretrained(tmp_path / "outputs/exp/export")
    x = trainer.data.validation.batches_at(trainer.step)[0][0]
    with torch.no_grad():
        assert torch.equal(model(x), trainer.model.eval()(x))
    with pytest.raises(UserError, match="export_at_end"):
        Trainer(tiny_config(tmp_path, "exp2", checkpoint__export_at_end=True, checkpoint__enabled=False))


def test_a_branched_decay_continues_the_source_run_at_its_step(tmp_path: Path) -> None:
    """WSD branching: a stable-phase run saved at step 6 feeds a decay of 4 steps in a new run
    (initial_load_path + initial_load_model_only = false): its steps 7..10 are, bit for bit, those of a run
    trained straight through with that schedule; run_info and compare_runs name the source."""
    import json

    from torchnlq.experiments.compare import compare_runs

    wsd = dict(lr_schedule__name="wsd", lr_schedule__decay_length=4, lr_schedule__min_lr=3e-5, checkpoint__interval=3)
    train(tmp_path, "stable", steps=6, lr_schedule__decay_steps=40, **wsd)  # still at its peak at step 6
    source = tmp_path / "outputs/stable/checkpoints/step-6"
    branch = train(tmp_path, "decay4", steps=10, lr_schedule__decay_steps=10, checkpoint__initial_load_path=source,
                   checkpoint__initial_load_model_only=False, **wsd)
    assert branch.step == 10
    train(tmp_path, "straight", steps=10, lr_schedule__decay_steps=10, **wsd)
    branched, straight = losses(tmp_path, "decay4")[0], losses(tmp_path, "straight")[0]
    assert set(branched) == set(range(7, 11))
    for step in range(7, 11):
        assert branched[step] == straight[step], step
    # The branch validates at its branch point, on the trunk's weights there: the trunk's loss at step 6.
    branch_val, trunk_val = losses(tmp_path, "decay4")[1], losses(tmp_path, "stable")[1]
    assert 6 in branch_val and branch_val[6] == trunk_val[6]
    info = json.loads((tmp_path / "outputs/decay4/run_info.json").read_text())
    assert info["initialized_from"] == str(source)
    compare_runs([tmp_path / "outputs/straight", tmp_path / "outputs/decay4"], tmp_path / "outputs/straight",
                 tmp_path / "cmp")
    assert f"- decay4: started from {source}" in (tmp_path / "cmp/comparison.md").read_text()


def test_every_differing_setting_is_named_at_once_in_the_terms_of_the_operation(tmp_path: Path) -> None:
    train(tmp_path, "source", steps=4)
    source = tmp_path / "outputs/source/checkpoints/step-4"
    changed = dict(model__dim=48, model__n_layers=3, model__rope_theta=500000.0)
    with pytest.raises(UserError) as loading:
        Trainer(tiny_config(tmp_path, "other", 4, checkpoint__initial_load_path=str(source), **changed))
    message = str(loading.value)
    assert "holds another model than this run describes" in message and "to load its weights" in message
    assert "model.dim 32 there, 48 here" in message and "model.n_layers 2 there, 3 here" in message
    assert "resume" not in message and "\n" not in message
    with pytest.raises(UserError) as resuming:
        Trainer(tiny_config(tmp_path, "source", 8, **changed))
    message = str(resuming.value)
    assert "was saved with other settings than this run has" in message and "resume with the original" in message
    assert "model.dim 32 there, 48 here" in message and "model.n_layers 2 there, 3 here" in message
