"""Data mixtures (``[[data.sources]]``, torchnlq/data/mixture.py, issue 34.3): the data side.

Two token folders whose tokens say where they come from (every token of A is 1, of B 2; ids bounded by the
byte vocabulary): every training sequence must come wholly from the source the schedule names, the sources'
shares over many steps must match the weights (binomial bounds written out here), the table must not depend
on the world size or on being drawn again (a resume), and what cannot be a mixture is one line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.data import write_token_folder

from torchnlq.config.job_config import Data, DataSource, Training, Validation
from torchnlq.data.loader import build_data
from torchnlq.data.mixture import MixtureSchedule
from torchnlq.errors import UserError


def folders(tmp_path: Path, tokenizer: str = "byte") -> tuple[Path, Path]:
    a = write_token_folder(tmp_path / "books", np.full(20_000, 1, np.uint16), np.full(3_000, 1, np.uint16), tokenizer)
    b = write_token_folder(tmp_path / "code", np.full(9_000, 2, np.uint16), np.full(2_000, 2, np.uint16), tokenizer)
    return a, b


def mixture(a: Path, b: Path, weights: tuple[float, float] = (0.7, 0.3), **data: object) -> Data:
    return Data(tokenizer="byte", sources=[DataSource(path=str(a), weight=weights[0]),
                                           DataSource(path=str(b), weight=weights[1], name="py")], **data)


def test_each_sequence_comes_from_its_source_and_the_shares_follow_the_weights(tmp_path: Path) -> None:
    a, b = folders(tmp_path)
    training = Training(steps=200, micro_batch_size=8, grad_accum_steps=4, seq_len=32)
    run = build_data(mixture(a, b), training, Validation(sequences=8), rank=0, world_size=1)
    schedule = run.loader.schedule
    assert isinstance(schedule, MixtureSchedule) and run.train_tokens == 29_000
    for step in (0, 57, 199):
        for micro, (x, y) in enumerate(run.loader.micro_batches(step)):
            which = schedule.sources_for(step, micro, 0, 1, 8, 4)
            assert torch.equal(x[:, 0], which + 1) and bool((x == x[:, :1]).all()) and bool((y == x).all())
    share = (schedule.sources == 0).double().mean().item()
    draws = schedule.sources.numel()  # 200 steps x 32 sequences
    assert abs(share - 0.7) < 4 * math.sqrt(0.7 * 0.3 / draws)  # four binomial standard deviations
    assert int(schedule.offsets[schedule.sources == 1].max()) <= 9_000 - 32 - 1  # every window fits its source


def test_the_table_is_the_same_for_any_world_size_and_when_drawn_again(tmp_path: Path) -> None:
    a, b = folders(tmp_path)
    one = build_data(mixture(a, b), Training(steps=20, micro_batch_size=8, grad_accum_steps=2, seq_len=32),
                     Validation(sequences=8), 0, 1)
    two = [build_data(mixture(a, b), Training(steps=20, micro_batch_size=8, grad_accum_steps=1, seq_len=32),
                      Validation(sequences=8), rank, 2) for rank in (0, 1)]
    for step in (0, 13):
        whole = torch.cat([x for x, _ in one.loader.micro_batches(step)])
        split = torch.cat([x for r in two for x, _ in r.loader.micro_batches(step)])
        assert torch.equal(whole, split)
    again = build_data(mixture(a, b), Training(steps=20, micro_batch_size=8, grad_accum_steps=2, seq_len=32),
                       Validation(sequences=8), 0, 1)
    assert torch.equal(again.loader.schedule.sources, one.loader.schedule.sources)
    assert again.schedule.fingerprint() == one.schedule.fingerprint()
    reweighted = build_data(mixture(a, b, (0.5, 0.5)), Training(steps=20, micro_batch_size=8, grad_accum_steps=2,
                                                                seq_len=32), Validation(sequences=8), 0, 1)
    assert reweighted.schedule.fingerprint() != one.schedule.fingerprint()
    assert [s["name"] for s in one.sources] == ["books", "py"] and one.sources[1]["weight"] == 0.3


def test_validation_has_a_fixed_set_per_source(tmp_path: Path) -> None:
    a, b = folders(tmp_path)
    run = build_data(mixture(a, b), Training(steps=4, micro_batch_size=4, seq_len=32), Validation(sequences=8), 0, 1)
    parts = run.validation.parts_at(0)
    assert [(name, weight, len(batches)) for name, weight, batches in parts] == [("books", 0.7, 2), ("py", 0.3, 2)]
    assert all(bool((x == index + 1).all()) for index, (_, _, batches) in enumerate(parts) for x, _ in batches)
    assert parts == run.validation.parts_at(10)  # fixed: the same windows at every validation


@pytest.mark.parametrize("change, fragment", [
    ({"synthetic": True}, "a mixture ([[data.sources]]) reads folders prepared"),
    ({"sources": [DataSource(path="", weight=1.0)]}, "data.sources[0] has no path"),
])
def test_what_cannot_be_a_mixture_is_one_line(tmp_path: Path, change: dict, fragment: str) -> None:
    a, b = folders(tmp_path)
    data = mixture(a, b)
    for key, value in change.items():
        setattr(data, key, value)
    with pytest.raises(UserError, match=re.escape(fragment)):
        build_data(data, Training(steps=4, seq_len=32), Validation(sequences=8), 0, 1)


def test_sources_of_other_tokenizers_or_one_name_twice_are_refused(tmp_path: Path) -> None:
    a, _ = folders(tmp_path)
    gpt2 = write_token_folder(tmp_path / "gpt2", np.full(9_000, 2, np.uint16), np.full(2_000, 2, np.uint16), "gpt2")
    mixed = Data(tokenizer="byte", sources=[DataSource(path=str(a)), DataSource(path=str(gpt2))])
    with pytest.raises(UserError, match=r"data.sources\[1\] \(gpt2\): data.path .* was tokenized with 'gpt2'"):
        build_data(mixed, Training(steps=4, seq_len=32), Validation(sequences=8), 0, 1)
    twice = Data(tokenizer="byte", sources=[DataSource(path=str(a)), DataSource(path=str(a))])
    with pytest.raises(UserError, match="is named 'books' like another source"):
        build_data(twice, Training(steps=4, seq_len=32), Validation(sequences=8), 0, 1)
    with pytest.raises(UserError, match="validates with validation.protocol = 'fixed'"):
        build_data(mixture(a, a.parent / "code"), Training(steps=4, seq_len=32),
                   Validation(sequences=8, protocol="paper"), 0, 1)


@pytest.mark.integration  # trains
def test_a_mixture_run_logs_each_sources_loss_records_its_sources_and_resumes_bitwise(tmp_path: Path) -> None:
    from helpers.train import scalars

    from torchnlq.config.manager import load_job_config
    from torchnlq.train.trainer import Trainer

    a, b = folders(tmp_path)
    config = tmp_path / "mix.toml"
    config.write_text(f'[data]\ntokenizer = "byte"\n[[data.sources]]\npath = "{a}"\nweight = 0.7\n'
                      f'[[data.sources]]\npath = "{b}"\nweight = 0.3\nname = "py"\n')

    def run(name: str, steps: int) -> Trainer:
        cfg = load_job_config([str(config), "--model.flavor=debug", "--model.n_layers=1", "--model.dim=32",
                               "--model.n_heads=2", "--training.seq_len=32", "--training.micro_batch_size=4",
                               f"--training.steps={steps}", "--training.device=cpu", "--validation.interval=4",
                               "--validation.sequences=8", "--metrics.log_interval=1", "--checkpoint.interval=4",
                               f"--job.dump_folder={tmp_path / 'out'}", f"--job.name={name}",
                               "--lr_schedule.warmup_steps=1", "--lr_schedule.decay_steps=8"])
        trainer = Trainer(cfg)
        trainer.train()
        return trainer

    run("straight", 8)
    run("resumed", 4)
    run("resumed", 8)  # the same command, raised: resumes from step-4
    straight, resumed = scalars(tmp_path / "out/straight/tb"), scalars(tmp_path / "out/resumed/tb")
    assert straight["loss/train"] == resumed["loss/train"]  # bit for bit
    for step in (4, 8):
        books, py = straight["loss/val/books"][step], straight["loss/val/py"][step]
        assert straight["loss/val"][step] == pytest.approx(0.7 * books + 0.3 * py, rel=1e-6)
    info = __import__("json").loads((tmp_path / "out/straight/run_info.json").read_text())
    assert [(s["name"], s["weight"]) for s in info["data_sources"]] == [("books", 0.7), ("py", 0.3)]
