"""The trainer's seams: config checks before any file, the data loader, the run record, own schedules."""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from torchnlq.checkpoint.checkpointer import compare_fingerprints, list_checkpoints
from torchnlq.checkpoint.record import RunRecord
from torchnlq.config.job_config import Data, Training, Validation
from torchnlq.data.loader import build_data
from torchnlq.data.synthetic import ensure_synthetic_corpus
from torchnlq.errors import ConfigError, UserError
from torchnlq.inference.evaluation import evaluation_autocast
from torchnlq.train.preflight import check_job_config
from torchnlq.train.trainer import Trainer

from helpers.train import tiny_config

# ----- config checks: one place, before anything is written ------------------------------------

BAD_CONFIGS = [
    ({"training__seq_len": 4096}, "exceeds the model's max_seq_len"),
    ({"data__tokenizer": "gpt2"}, "data.synthetic = true writes a byte-level corpus"),
    ({"checkpoint__enabled": False, "checkpoint__export_at_end": True}, "set checkpoint.enabled = true"),
    ({"model__query__activation": "gleu"}, "did you mean 'gelu'"),
    # A knob of residual_mlp is checked even when the query type would not read it.
    ({"model__query__type": "linear", "model__query__output_norm": "batch"}, "model.query.output_norm: unknown"),
    ({"model__flavor": "gpt_smal"}, "did you mean 'gpt_small'"),
    ({"model__family": "paralel"}, "model.family: unknown 'paralel'"),
    ({"model__vocab_size": 100}, "smaller than the data's 257 tokens"),  # checked once the data is open
    ({"data__synthetic": False, "data__path": "missing-folder"}, "does not exist"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_CONFIGS)
def test_a_config_that_cannot_run_fails_before_the_run_folder_exists(tmp_path, overrides, message) -> None:
    cfg = tiny_config(tmp_path, "bad", **overrides)
    with pytest.raises(UserError, match=message):
        Trainer(cfg)
    assert not (tmp_path / "outputs" / "bad").exists()


def test_check_job_config_writes_nothing_and_resolves_the_model(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "pure")
    args = check_job_config(cfg)
    # tiny_config: dim 32, 2 layers, byte tokenizer (257 ids) padded to the default multiple of 64.
    assert (args.dim, args.n_layers, args.vocab_size) == (32, 2, 320)
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "data").exists()


def test_check_job_config_names_the_key_of_a_bad_registry_name(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "pure", model__query__type="residual_mpl")
    with pytest.raises(ConfigError, match=r"^model.query.type: unknown 'residual_mpl'; did you mean 'residual_mlp'"):
        check_job_config(cfg)


# ----- the data loader ---------------------------------------------------------------------------


def test_loader_yields_each_ranks_slice_of_the_schedule_row(tmp_path: Path) -> None:
    """Independent reference: the windows cut by hand from the token array at the schedule's offsets."""
    folder = ensure_synthetic_corpus(tmp_path / "data")
    training = Training(steps=3, seq_len=16, micro_batch_size=2, grad_accum_steps=3)
    data = Data(path=str(folder), tokenizer="byte", seed=5)
    tokens = np.fromfile(folder / "train.bin", dtype=np.uint16).astype(np.int64)
    world = 2
    per_rank = [build_data(data, training, Validation(sequences=4), rank, world) for rank in range(world)]
    row = per_rank[0].schedule.offsets[1]  # step 1's global batch: 2 x 3 x 2 = 12 start offsets
    assert len(row) == 12
    for rank, run_data in enumerate(per_rank):
        got = list(run_data.loader.micro_batches(1))
        assert len(got) == 3
        for micro, (x, y) in enumerate(got):
            starts = row[(rank * 3 + micro) * 2:(rank * 3 + micro) * 2 + 2].tolist()
            want_x = np.stack([tokens[o:o + 16] for o in starts])
            want_y = np.stack([tokens[o + 1:o + 17] for o in starts])
            assert np.array_equal(x.numpy(), want_x) and np.array_equal(y.numpy(), want_y)


@pytest.mark.integration
def test_a_wrapped_loader_is_what_the_trainer_reads(tmp_path: Path) -> None:
    """The seam benchmarks use: replace trainer.loader by a wrapper; train_step reads through it."""
    trainer = Trainer(tiny_config(tmp_path, "wrapped", steps=2, checkpoint__enabled=False, validation__enabled=False))
    seen: list[int] = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def micro_batches(self, step):
            seen.append(step)
            yield from self.inner.micro_batches(step)

    trainer.loader = Counting(trainer.loader)
    trainer.train()
    assert seen == [0, 1]


# ----- the run record ----------------------------------------------------------------------------

# torchnlq.json exactly as the trainer wrote it before RunRecord existed (keys and nesting).
OLD_META = {
    "data_fingerprint": "befa3c999342c159", "data_path": "/data", "skipped_steps": 1, "step": 20,
    "fingerprint": {
        "data": {"global_batch": 16, "seed": 42, "seq_len": 128, "tokenizer": "byte", "train_tokens": 1506303},
        "model": None,  # filled in below
    },
    "model_args": {
        "dim": 32, "head_dim": 16, "init_std": 0.02, "max_seq_len": 128, "mlp_hidden": 128, "n_heads": 2,
        "n_kv_heads": 2, "n_layers": 2, "norm_eps": 1e-05, "positions": "learned", "rope_theta": 10000.0,
        "tie_embeddings": True, "vocab_size": 320,
        "query": {"activation": "gelu", "bottleneck_ratio": 0.5, "fuse_kv": False, "half_scale": True,
                  "input_norm": "rms", "output_norm": "layer", "type": "residual_mlp"},
    },
    "seq_len": 128,
    "tokenizer": {"eot_id": 256, "name": "byte", "tokenizer": "byte", "vocab_size": 257},
    "tokens_seen": 40960,
    "validation": {"micro_batch_size": 16, "seed": 2357, "sequences": 64},
    "world_size": 1,
}
OLD_META["fingerprint"]["model"] = OLD_META["model_args"]


def test_a_checkpoint_written_before_the_record_reads_and_resumes_with_the_same_fingerprint() -> None:
    record = RunRecord.from_meta(json.loads(json.dumps(OLD_META)), "old/torchnlq.json")
    assert (record.step, record.tokens_seen, record.skipped_steps, record.seq_len) == (20, 40960, 1, 128)
    assert record.validation.sequences == 64 and record.validation.micro_batch_size == 16
    assert record.mixed_precision is None  # the old trainer never recorded it
    # What resume compares must be exactly what the old trainer saved, less the removed fuse_kv option
    # (the same function either way), which the fingerprint check skips.
    current = OLD_META["model_args"] | {"query": {k: v for k, v in OLD_META["model_args"]["query"].items() if k != "fuse_kv"}}
    expected = OLD_META | {"model_args": current, "fingerprint": OLD_META["fingerprint"] | {"model": current}}
    assert record.resume_fingerprint() == expected["fingerprint"]
    compare_fingerprints(OLD_META["fingerprint"], record.resume_fingerprint(), "old checkpoint")
    written = record.to_meta()
    for key, value in expected.items():
        assert written[key] == value, key


@pytest.mark.integration
def test_record_of_a_run_is_in_its_checkpoint_and_run_info(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "rec", steps=4, validation__interval=2, checkpoint__interval=2))
    trainer.train()
    run = tmp_path / "outputs" / "rec"
    meta = json.loads((run / "checkpoints" / "step-4" / "torchnlq.json").read_text())
    info = json.loads((run / "run_info.json").read_text())
    saved = RunRecord.from_meta(meta, "step-4")
    assert saved.step == info["step"] == 4 and info["finished"] is True
    assert saved.mixed_precision == info["mixed_precision"] == "fp32"  # a CPU run computes in fp32
    assert saved.data.batch_fingerprint == info["batch_fingerprint"] == trainer.data.schedule.fingerprint()
    assert saved.validation.fingerprint == info["validation_fingerprint"]
    assert info["last_val_loss"] == pytest.approx(trainer.last_val_loss)
    assert saved.resume_fingerprint() == trainer.record.resume_fingerprint()


def test_evaluation_uses_bf16_autocast_only_for_a_bf16_run_on_cuda() -> None:
    record = RunRecord.from_meta(json.loads(json.dumps(OLD_META)), "m")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert evaluation_autocast(record, cuda) is contextlib.nullcontext  # unknown precision: fp32
    record.mixed_precision = "bf16"
    assert evaluation_autocast(record, cpu) is contextlib.nullcontext
    with contextlib.ExitStack() as expected:
        if not torch.cuda.is_available():  # torch says a CUDA autocast built without CUDA does nothing: it is only built
            expected.enter_context(pytest.warns(UserWarning, match="CUDA is not available"))
        autocast = evaluation_autocast(record, cuda)()
    assert isinstance(autocast, torch.autocast) and autocast.fast_dtype == torch.bfloat16


# ----- pieces own their schedules ----------------------------------------------------------------


@pytest.mark.integration
def test_a_signal_on_a_checkpoint_step_stops_there_with_one_save(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "sig", steps=12, checkpoint__interval=4))
    saves: list[int] = []
    real_save = trainer.checkpointer.save

    def save(record, model, optimizer):
        saves.append(record.step)
        real_save(record, model, optimizer)

    trainer.checkpointer.save = save
    real_loss = trainer.micro_batch_loss

    sent: list[int] = []

    def loss_fn(x, y):
        if trainer.step + 1 == 4 and not sent:  # the signal arrives during step 4, a checkpoint step
            sent.append(4)  # once: a second SIGTERM falls back to the default action (kill)
            signal.raise_signal(signal.SIGTERM)
        return real_loss(x, y)

    trainer.micro_batch_loss = loss_fn
    trainer.train()
    assert trainer.step == 4 and saves == [4]
    assert list_checkpoints(tmp_path / "outputs" / "sig" / "checkpoints") == [4]


def test_each_piece_decides_when_it_runs(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "due", steps=12, validation__interval=4, checkpoint__interval=6,
                      metrics__query_diagnostics_interval=5)
    trainer = Trainer(cfg)
    steps = range(1, 13)
    assert [s for s in steps if trainer.validator.schedule.due(s, s == 12)] == [4, 8, 12]
    assert [s for s in steps if trainer.checkpointer.schedule.due(s, s == 12)] == [6, 12]
    assert [s for s in steps if trainer.diagnostics.schedule.due(s, s == 12)] == [5, 10, 12]
    assert [s for s in steps if trainer.metrics.schedule.due(s, s == 12)] == list(steps)  # log_interval 1


def test_a_knob_the_query_type_does_not_read_is_a_warning_not_an_error(tmp_path: Path) -> None:
    from torchnlq.train.preflight import config_warnings

    cfg = tiny_config(tmp_path, "knobs", model__query__type="linear", model__query__activation="relu2")
    check_job_config(cfg)  # legal: one config file may serve several query types
    assert config_warnings(cfg) == [
        "model.query.activation set but model.query.type='linear' does not read it; it has no effect"
    ]
    assert config_warnings(tiny_config(tmp_path, "knobs", model__query__activation="relu2")) == []  # residual_mlp


@pytest.mark.integration
def test_resume_refuses_another_corpus_of_the_same_size(tmp_path: Path) -> None:
    Trainer(tiny_config(tmp_path, "corpus", steps=4, checkpoint__interval=2, training__steps=2)).train()
    train_bin = tmp_path / "data" / "train.bin"
    tokens = np.fromfile(train_bin, dtype=np.uint16)
    np.random.default_rng(0).permutation(tokens).tofile(train_bin)  # same length, same meta.json, other text
    run = tmp_path / "outputs" / "corpus"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(UserError, match=r"train.bin is not the file meta.json records"):  # edited in place
        Trainer(tiny_config(tmp_path, "corpus", steps=4, checkpoint__interval=2))
    # Prepared again (meta.json records the new file): the run's fingerprint refuses the other corpus.
    from torchnlq.data.token_format import file_identity

    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    meta["files"]["train"] = file_identity(train_bin)
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"data.content(_sha256)? '"):
        Trainer(tiny_config(tmp_path, "corpus", steps=4, checkpoint__interval=2))
    # A refused resume touches none of the run's files (config.toml, train.log, run_info.json).
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.integration
def test_a_checkpoint_without_a_content_fingerprint_still_resumes(tmp_path: Path) -> None:
    Trainer(tiny_config(tmp_path, "older", steps=4, checkpoint__interval=2, training__steps=2)).train()
    meta_file = tmp_path / "outputs" / "older" / "checkpoints" / "step-2" / "torchnlq.json"
    meta = json.loads(meta_file.read_text())
    del meta["fingerprint"]["data"]["content"]  # as written before the content check existed
    meta_file.write_text(json.dumps(meta))
    resumed = Trainer(tiny_config(tmp_path, "older", steps=4, checkpoint__interval=2))
    assert resumed.step == 2


@pytest.mark.integration
def test_resume_logs_each_changed_setting_once_and_says_when_it_does_nothing(tmp_path: Path) -> None:
    Trainer(tiny_config(tmp_path, "chg", steps=4, checkpoint__interval=2, training__steps=2)).train()
    Trainer(tiny_config(tmp_path, "chg", steps=4, checkpoint__interval=2, optimizer__lr=1e-3, training__seed=7))
    log = (tmp_path / "outputs" / "chg" / "train.log").read_text().splitlines()
    changed = [line for line in log if "changed on resume" in line]
    assert len(changed) == 3, changed  # steps 2 -> 4, lr 3e-3 -> 1e-3, seed 1337 -> 7
    assert any("training.steps changed on resume: 2 -> 4" in line for line in changed)
    assert any("optimizer.lr changed on resume: 0.003 -> 0.001" in line for line in changed)
    seed = [line for line in changed if "training.seed" in line]
    assert seed and "it has no effect" in seed[0]


def test_token_ids_beyond_the_tokenizer_are_refused_when_the_data_is_opened(tmp_path: Path) -> None:
    from torchnlq.data.batches import open_token_files

    folder = ensure_synthetic_corpus(tmp_path / "data")
    val = folder / "val.bin"
    tokens = np.fromfile(val, dtype=np.uint16)
    tokens[0] = 300  # the byte tokenizer has 257 ids (meta.json); 300 would index past its embedding rows
    tokens.tofile(val)
    with pytest.raises(UserError, match=r"val.bin is not the file meta.json records"):  # its recorded sha256
        open_token_files(Data(path=str(folder), tokenizer="byte"), 16)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["files"]  # a folder prepared before meta.json recorded its files: the ids are still checked
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"val.bin holds token id 300, but its tokenizer 'byte' has only 257 ids"):
        open_token_files(Data(path=str(folder), tokenizer="byte"), 16)


@pytest.mark.integration
def test_a_truncated_latest_checkpoint_names_the_file_and_the_load_step_to_use(tmp_path: Path) -> None:
    Trainer(tiny_config(tmp_path, "cut", steps=6, checkpoint__interval=3)).train()
    step6 = tmp_path / "outputs" / "cut" / "checkpoints" / "step-6"
    shard = sorted(step6.glob("*.distcp"))[0]
    with shard.open("r+b") as f:
        f.truncate(1000)
    with pytest.raises(UserError, match=rf"{shard.name} is truncated \(1,000 of .* bytes\).*--checkpoint.load_step=3"):
        Trainer(tiny_config(tmp_path, "cut", steps=9, checkpoint__interval=3))
    resumed = Trainer(tiny_config(tmp_path, "cut", steps=9, checkpoint__interval=3, checkpoint__load_step=3))
    assert resumed.step == 3


def test_a_checkpoint_is_its_records_step_and_a_latest_without_record_is_damaged(tmp_path: Path) -> None:
    import shutil

    Trainer(tiny_config(tmp_path, "ids", steps=6, checkpoint__interval=3)).train()
    ckpts = tmp_path / "outputs" / "ids" / "checkpoints"
    shutil.copytree(ckpts / "step-6", ckpts / "step-9")  # a copy under another step's name
    with pytest.raises(UserError, match=r"step-9 records step 6 but its folder is named step-9: it was renamed"):
        Trainer(tiny_config(tmp_path, "ids", steps=12, checkpoint__interval=3))
    (ckpts / "step-9" / "torchnlq.json").unlink()  # now the latest has lost its record
    with pytest.raises(UserError, match=r"step-9 is damaged \(its torchnlq.json or .metadata is missing\).*"
                                        r"--checkpoint.load_step=6"):
        Trainer(tiny_config(tmp_path, "ids", steps=12, checkpoint__interval=3))
    assert Trainer(tiny_config(tmp_path, "ids", steps=12, checkpoint__interval=3, checkpoint__load_step=6)).step == 6


def test_prepared_folders_record_the_largest_id_and_opening_checks_it(tmp_path: Path) -> None:
    from torchnlq.data import token_format as fmt
    from torchnlq.data.batches import open_token_files

    folder = ensure_synthetic_corpus(tmp_path / "data")
    meta = fmt.read_meta(folder)
    for split in ("train", "val"):  # independent reference: the maximum of the file itself
        assert meta["max_token_id"][split] == int(np.fromfile(folder / f"{split}.bin", dtype=np.uint16).max())
    # A meta.json that records an id beyond the vocabulary (a file replaced after preparing) is refused,
    # even where the sampled windows of the file would not reach it.
    meta["max_token_id"]["train"] = 400
    (folder / fmt.META_NAME).write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"train.bin holds token id 400"):
        open_token_files(Data(path=str(folder), tokenizer="byte"), 16)


def test_the_header_shows_the_settings_that_decide_whether_a_run_works(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "head", steps=12, lr_schedule__warmup_steps=3, optimizer__lr=2e-3,
                      activation_checkpoint__mode="full")
    trainer = Trainer(cfg)
    trainer.train()
    log = (tmp_path / "outputs" / "head" / "train.log").read_text()
    settings = next(line for line in log.splitlines() if "| compile " in line)
    sequences = sum(len(x) for x, _ in trainer.data.validation.batches_at(0))
    for part in ("steps 12 |", "lr 0.002 -> ", "warmup 3 steps", "precision fp32 (cpu)", "compile off",
                 "activation checkpointing full", f"validation every {cfg.validation.interval} steps "
                 f"({sequences:,} fixed sequences)"):
        assert part in settings, (part, settings)


def test_a_long_validation_reports_its_progress(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "slowval", steps=2, validation__sequences=16,
                                  validation__micro_batch_size=2))
    lines: list[str] = []
    trainer.validator.report, trainer.validator.report_every = lines.append, 0.0  # report after every forward
    trainer.validator.run(trainer.model, 1)
    # 8 micro-batches: a line after each but the last, counting up to 7 of 8.
    assert [line.split(",")[0] for line in lines] == [f"validating: {i}/8 micro-batches" for i in range(1, 8)]
