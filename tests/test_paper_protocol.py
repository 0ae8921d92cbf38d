"""The paper's validation rows (``validation.protocol = "paper"``) against the paper's own recipe.

The reference below is the paper's index notebook and evaluation loop, written out here from its
description (MarkoKarbevski/beyond_query_linearity: Generate_Indices.ipynb cell 2, train.py
``get_batch`` and ``estimate_loss``): re-seed one CPU generator, draw the 600-row evaluation
table of the train split, then from the same generator the one of the validation split;
evaluation k reads row k, columns 12j..12j+11 for micro-batch j, as windows ``data[i:i+L]`` and
``data[i+1:i+1+L]`` of the memory-mapped file, and reports the mean and the (unbiased) standard
deviation of the micro-batch losses: of the validation table's row (``loss/val``) and of the train
table's same row on the train split (its ``eval_train`` estimate, ``loss/eval_train``). The loop
evaluates whenever ``iter_num % eval_interval == 0``, first at iteration 0, before any update.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchnlq.config.job_config import Validation
from torchnlq.data.batches import PaperValidationRows, build_validation_set
from torchnlq.data.token_file import TokenFile
from torchnlq.errors import UserError

from helpers.data import write_token_folder
from helpers.train import scalars, tiny_config

SEQ_LEN, SEQUENCES, MICRO = 32, 24, 4


def notebook_tables(train_size: int, val_size: int, seq_len: int, seed: int = 42) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate_Indices.ipynb, cell 2, at a general window length (1024 in the paper)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    ix_train = torch.randint(train_size - seq_len, (600000 // 1000, SEQUENCES), generator=gen)
    ix_val = torch.randint(val_size - seq_len, (600000 // 1000, SEQUENCES), generator=gen)
    return ix_train, ix_val


def paper_get_batch(data: np.ndarray, table: torch.Tensor, row: int, micro_step: int) -> tuple[torch.Tensor, ...]:
    """train.py's get_batch for an evaluation split: columns micro_step*B .. of the row."""
    ix = table[row, micro_step * MICRO : (micro_step + 1) * MICRO]
    x = torch.stack([torch.from_numpy(data[i : i + SEQ_LEN].astype(np.int64)) for i in ix.tolist()])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + SEQ_LEN].astype(np.int64)) for i in ix.tolist()])
    return x, y


@pytest.fixture
def token_folder(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    return write_token_folder(tmp_path / "data", rng.integers(0, 256, 5000), rng.integers(0, 256, 1500))


def test_each_validation_reads_the_notebooks_row_of_that_step(token_folder: Path) -> None:
    train, val = TokenFile(token_folder / "train.bin"), TokenFile(token_folder / "val.bin")
    cfg = Validation(protocol="paper", seed=42, sequences=SEQUENCES, interval=1000)
    rows = build_validation_set(val, cfg, SEQ_LEN, MICRO, train=train)
    assert isinstance(rows, PaperValidationRows)
    ix_train, ix_val = notebook_tables(len(train), len(val), SEQ_LEN)
    val_data = np.memmap(token_folder / "val.bin", dtype=np.uint16, mode="r")
    train_data = np.memmap(token_folder / "train.bin", dtype=np.uint16, mode="r")
    for step, row in ((0, 0), (999, 0), (1000, 1), (59000, 59), (60002, 60)):
        # The validation row, and the same row of the eval_train table on the train split.
        for batches, data, table in ((rows.batches_at(step), val_data, ix_val),
                                     (rows.train_batches_at(step), train_data, ix_train)):
            assert len(batches) == SEQUENCES // MICRO
            for k, (x, y) in enumerate(batches):
                ref_x, ref_y = paper_get_batch(data, table, row, k)
                assert torch.equal(x, ref_x) and torch.equal(y, ref_y), (step, k)


def test_the_train_split_length_is_part_of_the_draw(token_folder: Path) -> None:
    """The validation table comes second from the generator, so the train table's bound changes it."""
    val = TokenFile(token_folder / "val.bin")
    a = PaperValidationRows(5000, val, SEQ_LEN, SEQUENCES, MICRO, seed=42, interval=10)
    b = PaperValidationRows(5000 + 2**33, val, SEQ_LEN, SEQUENCES, MICRO, seed=42, interval=10)
    assert a.fingerprint() != b.fingerprint()


def test_a_step_past_the_table_is_one_line(token_folder: Path) -> None:
    val = TokenFile(token_folder / "val.bin")
    rows = PaperValidationRows(5000, val, SEQ_LEN, SEQUENCES, MICRO, seed=42, interval=10)
    rows.batches_at(5999)  # row 599, the last
    with pytest.raises(UserError, match=r"validation.protocol = 'paper' has 600 rows.*raise validation.interval"):
        rows.batches_at(6000)


def paper_estimate(model: torch.nn.Module, data: np.ndarray, table: torch.Tensor, row: int) -> tuple[float, float]:
    """train.py's estimate_loss for one split: mean and std of the micro-batch losses of the row."""
    model.eval()
    with torch.no_grad():
        losses = torch.tensor([
            F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()).item()
            for x, y in (paper_get_batch(data, table, row, k) for k in range(SEQUENCES // MICRO))
        ])
    return losses.mean().item(), losses.std().item()


def paper_run_config(tmp_path: Path, token_folder: Path, name: str, steps: int = 8, **extra: object):
    return tiny_config(
        tmp_path, name, steps=steps, data__path=token_folder, data__synthetic=False,
        training__seq_len=SEQ_LEN, validation__protocol="paper", validation__seed=42,
        validation__sequences=SEQUENCES, validation__micro_batch_size=MICRO, validation__interval=3,
        checkpoint__interval=3, **extra,
    )


@pytest.mark.integration  # runs the trainer
def test_the_runs_validation_loss_is_the_papers_estimate_on_its_row(tmp_path: Path, token_folder: Path) -> None:
    import copy

    from torchnlq.interop.load import load_model
    from torchnlq.train.trainer import Trainer

    trainer = Trainer(paper_run_config(tmp_path, token_folder, "paper_rows"))
    initial = copy.deepcopy(trainer.model)  # the model before any update: the paper's iteration-0 evaluation
    trainer.train()
    logged = scalars(tmp_path / "outputs/paper_rows/tb")
    # Iteration 0 (before any update), then every validation.interval steps and the last one.
    for tag in ("loss/val", "loss/val_std", "loss/eval_train", "loss/eval_train_std"):
        assert sorted(logged[tag]) == [0, 3, 6, 8], tag
    ix_train, ix_val = notebook_tables(5000, 1500, SEQ_LEN)
    val_data = np.memmap(token_folder / "val.bin", dtype=np.uint16, mode="r")
    train_data = np.memmap(token_folder / "train.bin", dtype=np.uint16, mode="r")
    models = {0: initial} | {step: load_model(tmp_path / f"outputs/paper_rows/checkpoints/step-{step}").model
                             for step in (3, 6, 8)}
    for step, model in models.items():  # rows 0, 1, 2 and 2 (8 // 3)
        for name, data, table in (("val", val_data, ix_val), ("eval_train", train_data, ix_train)):
            mean, std = paper_estimate(model, data, table, step // 3)
            assert logged[f"loss/{name}"][step] == pytest.approx(mean, rel=1e-6), (name, step)
            assert logged[f"loss/{name}_std"][step] == pytest.approx(std, rel=1e-5), (name, step)
    log = (tmp_path / "outputs/paper_rows/train.log").read_text()
    assert f"step      0/8  val_loss {logged['loss/val'][0]:.4f}" in log and "eval_train_loss" in log
    for step in (3, 6, 8):
        # evaluate.py on the checkpoint evaluates the same row: what the run logged at that step.
        from torchnlq.inference.evaluation import evaluate_source

        result = evaluate_source(tmp_path / f"outputs/paper_rows/checkpoints/step-{step}", token_folder)
        assert result.val_loss == pytest.approx(logged["loss/val"][step], rel=1e-6), step


@pytest.mark.integration  # runs the trainer three times
def test_a_resumed_paper_run_logs_what_an_uninterrupted_one_did(tmp_path: Path, token_folder: Path) -> None:
    """Step 0 is evaluated once, on the fresh start; a resume adds nothing of its own: every figure bitwise equal."""
    from torchnlq.train.trainer import Trainer

    def run(name: str, steps: int) -> None:
        Trainer(paper_run_config(tmp_path, token_folder, name, steps=steps, lr_schedule__decay_steps=8)).train()

    run("full", 8)
    run("split", 6)  # stopped after step 6 (a checkpoint), then resumed to 8
    run("split", 8)
    full, split = scalars(tmp_path / "outputs/full/tb"), scalars(tmp_path / "outputs/split/tb")
    for tag in ("loss/train", "loss/val", "loss/val_std", "loss/eval_train", "loss/eval_train_std"):
        assert split[tag] == full[tag], tag  # bitwise, not approx
    assert sorted(full["loss/eval_train"]) == [0, 3, 6, 8]
    log = (tmp_path / "outputs/split/train.log").read_text()
    assert log.count("step      0/") == 1 and "resumed from" in log
    assert log.count("val_loss") == 4  # steps 0, 3, 6 of the first start and 8 of the resume: none repeated


def test_a_run_longer_than_the_table_is_refused_before_it_starts(tmp_path: Path) -> None:
    from torchnlq.errors import ConfigError
    from torchnlq.train.preflight import check_job_config

    cfg = tiny_config(tmp_path, steps=6000, validation__protocol="paper", validation__interval=10)
    with pytest.raises(ConfigError, match="raise validation.interval to at least 11 or use validation.protocol = 'fixed'"):
        check_job_config(cfg)
    check_job_config(tiny_config(tmp_path, steps=5999, validation__protocol="paper", validation__interval=10))
