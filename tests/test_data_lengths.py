"""A run's length is not part of its data order (issue 40.1), for every data layout.

docs/data.md promises that a batch is a function of (step, micro-step, rank) alone, so the first N steps of an
M-step run read the batches an N-step run reads, and a run resumed from step N with ``--training.steps M`` reads
the batches a straight M-step run reads. The layouts: one prepared folder, a mixture of two (``[[data.sources]]``)
and a nanoGPT folder adopted as it is (``prepare_data.py --adopt``), alone and mixed. The token files hold random
ids, so a window read at another offset (or from another source) shows as other tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.data import write_token_folder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchnlq.checkpoint.checkpointer import compare_fingerprints
from torchnlq.config.job_config import Data, DataSource, Training, Validation
from torchnlq.data.adopt_nanogpt import adopt_folder
from torchnlq.data.loader import RunData, build_data
from torchnlq.errors import UserError

SETTINGS = dict(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
LAYOUTS = ("one folder", "mixture", "nanogpt", "nanogpt mixture")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three prepared folders of random byte ids (of other lengths) and one nanoGPT folder, adopted."""
    root, rng = tmp_path_factory.mktemp("lengths"), np.random.default_rng(40)
    made = {name: write_token_folder(root / name, rng.integers(0, 256, n), rng.integers(0, 256, 800))
            for name, n in (("books", 5_000), ("code", 1_300), ("web", 2_100))}
    nano = root / "nanogpt"
    nano.mkdir()
    rng.integers(0, 256, 3_000).astype("<u2").tofile(nano / "train.bin")
    rng.integers(0, 256, 700).astype("<u2").tofile(nano / "val.bin")
    adopt_folder(nano, tokenizer="byte")
    return made | {"nanogpt": nano}


def data_config(folders: dict[str, Path], layout: str, weights: tuple[float, float], seed: int) -> Data:
    if layout in ("one folder", "nanogpt"):
        return Data(path=str(folders["books" if layout == "one folder" else "nanogpt"]), tokenizer="byte", seed=seed)
    second = "code" if layout == "mixture" else "nanogpt"
    return Data(tokenizer="byte", seed=seed, sources=[DataSource(path=str(folders["books"]), weight=weights[0]),
                                                       DataSource(path=str(folders[second]), weight=weights[1])])


def every_batch(data: Data, steps: int, seq_len: int, micro: int, accum: int, world: int) -> tuple[list, list[str]]:
    """Every rank's micro-batches of every step ([step][rank] -> [(x, y)]) and each rank's batch fingerprint."""
    training = Training(steps=steps, seq_len=seq_len, micro_batch_size=micro, grad_accum_steps=accum)
    runs: list[RunData] = [build_data(data, training, Validation(sequences=4), rank, world) for rank in range(world)]
    batches = [[list(run.loader.micro_batches(step)) for run in runs] for step in range(steps)]
    return batches, [run.schedule.fingerprint() for run in runs]


def same(a: list, b: list) -> bool:
    """Equal [step][rank] -> [(x, y)] tables."""
    flat = [[pair for ranks in table for micro_batches in ranks for pair in micro_batches] for table in (a, b)]
    return len(a) == len(b) and len(flat[0]) == len(flat[1]) and all(
        torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(*flat))


@settings(max_examples=40, **SETTINGS)
@given(layout=st.sampled_from(LAYOUTS), n=st.integers(1, 12), extra=st.integers(1, 20),
       seq_len=st.integers(2, 64), micro=st.integers(1, 4), accum=st.integers(1, 3), world=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31), weights=st.tuples(st.floats(0.05, 5.0), st.floats(0.05, 5.0)))
def test_the_first_n_steps_of_a_longer_run_are_the_n_step_runs(folders, layout, n, extra, seq_len, micro, accum,
                                                                 world, seed, weights) -> None:
    data = data_config(folders, layout, weights, seed)
    short, short_prints = every_batch(data, n, seq_len, micro, accum, world)
    long, long_prints = every_batch(data, n + extra, seq_len, micro, accum, world)
    assert same(short, long[:n])  # step for step, micro-step for micro-step, rank for rank
    # One fingerprint for both (every rank computes the same), so compare_runs and resume treat them as one order.
    assert len(set(short_prints + long_prints)) == 1
    # A resume from step n draws the table again for n + extra steps: its steps from n on are the straight run's.
    resumed, _ = every_batch(data, n + extra, seq_len, micro, accum, world)
    assert same(resumed[n:], long[n:])


@settings(max_examples=25, **SETTINGS)
@given(layout=st.sampled_from(("mixture", "nanogpt mixture")), steps=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       seeds=st.tuples(st.integers(0, 3), st.integers(0, 3)),
       weights=st.tuples(st.sampled_from([0.3, 0.5, 1.0]), st.sampled_from([0.3, 0.5, 1.0])))
def test_a_mixtures_fingerprint_is_shared_only_by_the_same_batches(folders, layout, steps, seeds, weights) -> None:
    """Two mixture runs of the same draw (seed, weights) share a batch fingerprint and their resume fingerprints
    agree, whatever their lengths; runs that share a fingerprint read the same batches at every step both have;
    and a resume of a run of another draw is refused."""
    runs = [every_batch(data_config(folders, layout, (weights[i], 1.0), seeds[i]), steps[i], 16, 2, 1, 1)
            for i in range(2)]
    same_draw = seeds[0] == seeds[1] and weights[0] == weights[1]
    assert (runs[0][1] == runs[1][1]) == same_draw
    if same_draw:
        assert same(runs[0][0][:min(steps)], runs[1][0][:min(steps)])
    records = [_record(folders, layout, (weights[i], 1.0), seeds[i], steps[i]) for i in range(2)]
    if same_draw:
        compare_fingerprints(records[0], records[1], "checkpoint x")
    else:
        with pytest.raises(UserError, match="was saved with other settings"):
            compare_fingerprints(records[0], records[1], "checkpoint x")


def _record(folders: dict[str, Path], layout: str, weights: tuple[float, float], seed: int, steps: int) -> dict:
    """The resume fingerprint a trainer of this mixture records (the data part)."""
    from torchnlq.checkpoint.record import DataRecord, RunRecord
    from torchnlq.models.args import ModelArgs

    run = build_data(data_config(folders, layout, weights, seed), Training(steps=steps, seq_len=16,
                                                                          micro_batch_size=2), Validation(), 0, 1)
    data = DataRecord(path="", train_tokens=run.train_tokens, seed=seed, global_batch=2,
                      batch_fingerprint=run.schedule.fingerprint(), content_fingerprint=run.content_fingerprint,
                      sources=run.sources)
    args = ModelArgs(dim=8, n_layers=1, n_heads=1, vocab_size=257, max_seq_len=16)
    return RunRecord(model_args=args, tokenizer={"name": "byte"}, seq_len=16, data=data).resume_fingerprint()


def test_a_checkpoint_of_the_earlier_mixture_draw_is_refused_not_continued(folders) -> None:
    """Checkpoints of a mixture written before issue 40 hold no ``batches`` key: their order depended on the
    run's length, so a resume (which would read other batches) is refused with one line saying why."""
    current = _record(folders, "mixture", (0.7, 0.3), 1, 8)
    earlier = json.loads(json.dumps(current))
    del earlier["data"]["batches"]
    with pytest.raises(UserError, match=re.escape("drawn by an earlier torchnlq, whose batches depended on "
                                                  "training.steps")):
        compare_fingerprints(earlier, current, "checkpoint outputs/mix/checkpoints/step-4")
    one = _record(folders, "mixture", (0.7, 0.3), 1, 8)
    assert one == current  # drawn again: the same record


# ----- the trainer: batches recorded from outside its loader, resumed N -> M against a straight M --------------


def _train(tmp: Path, folders: dict[str, Path], layout: str, name: str, steps: int) -> tuple[list, dict]:
    from helpers.train import tiny_config

    from torchnlq.train.trainer import Trainer

    cfg = tiny_config(tmp, name, steps=steps, checkpoint__interval=3, validation__interval=3,
                      lr_schedule__decay_steps=9, data__synthetic=False)
    cfg.data = data_config(folders, layout, (0.6, 0.4), 7)
    trainer = Trainer(cfg)
    seen: list = []

    class Recording:  # what the model is fed, read at the loader's boundary, step by step
        def __init__(self, inner) -> None:
            self.inner = inner

        def micro_batches(self, step: int):
            for x, y in self.inner.micro_batches(step):
                seen.append((step, x.clone(), y.clone()))
                yield x, y

    trainer.loader = Recording(trainer.loader)
    trainer.train()
    info = json.loads((tmp / "outputs" / name / "run_info.json").read_text())
    return seen, info


@pytest.mark.integration  # trains nine tiny runs
@pytest.mark.parametrize("layout", LAYOUTS[:3])
def test_a_resume_to_a_longer_run_reads_the_straight_runs_batches(tmp_path: Path, folders, layout: str) -> None:
    from helpers.train import scalars

    straight, straight_info = _train(tmp_path, folders, layout, "straight", 9)
    short, short_info = _train(tmp_path, folders, layout, "short", 6)
    first_part = [b for b in straight if b[0] < 6]
    assert [s for s, *_ in short] == [s for s, *_ in first_part]
    assert all(torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) for a, b in zip(short, first_part))
    resumed, resumed_info = _train(tmp_path, folders, layout, "short", 9)  # the same run, raised to 9 steps
    rest = [b for b in straight if b[0] >= 6]
    assert [s for s, *_ in resumed] == [s for s, *_ in rest] == sorted(s for s, *_ in rest)
    assert all(torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) for a, b in zip(resumed, rest))
    assert straight_info["batch_fingerprint"] == short_info["batch_fingerprint"] == resumed_info["batch_fingerprint"]
    losses = [scalars(tmp_path / "outputs" / name / "tb")["loss/train"] for name in ("straight", "short")]
    assert losses[0] == losses[1]  # bit for bit: the same batches, the same updates
