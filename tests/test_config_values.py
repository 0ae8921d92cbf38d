"""Numbers a config must not hold: non-finite floats, seeds torch cannot take, min_lr above lr; what a stop says."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest

from torchnlq.checkpoint.record import RunRecord
from torchnlq.config.job_config import JobConfig
from torchnlq.config.manager import load_job_config
from torchnlq.config.render import iter_options
from torchnlq.errors import ConfigError
from torchnlq.models.args import ModelArgs
from torchnlq.train.preflight import check_job_config
from torchnlq.train.trainer import Trainer

from helpers.train import tiny_config


def _float_options() -> list[str]:
    names = []
    for name, f, _ in iter_options(JobConfig()):
        hint = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if "float" in str(hint):
            names.append(name)
    return names


FLOAT_OPTIONS = _float_options()


def test_there_are_float_options_to_check() -> None:
    # The list is read from the schema; it must see at least the optimizer's lr and the schedule's min_lr.
    assert {"optimizer.lr", "lr_schedule.min_lr", "training.max_norm"} <= set(FLOAT_OPTIONS)


@pytest.mark.parametrize("name", FLOAT_OPTIONS)
@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "1e999"])
def test_a_non_finite_float_is_one_line_at_load(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{name} must be a finite number, got -?(nan|inf)$"):
        load_job_config([f"--{name}={raw}"])


def test_a_non_finite_float_in_a_toml_file_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[optimizer]\nlr = nan\n")
    with pytest.raises(ConfigError, match="optimizer.lr must be a finite number"):
        load_job_config([str(path)])


@pytest.mark.parametrize("key", ["training.seed", "data.seed", "validation.seed"])
def test_seeds_must_fit_torchs_generator(key: str) -> None:
    import torch

    largest = 2**64 - 1
    torch.Generator().manual_seed(largest)  # the bound is torch's own: the largest seed it takes ...
    with pytest.raises(ValueError):
        torch.Generator().manual_seed(largest + 1)  # ... and one more overflows
    section, name = key.split(".")
    assert getattr(getattr(load_job_config([f"--{key}={largest}"]), section), name) == largest
    for bad in (largest + 1, -1):
        with pytest.raises(ConfigError, match=rf"^{key} must be"):
            load_job_config([f"--{key}={bad}"])


def test_min_lr_above_lr_is_refused(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "lr", optimizer__lr=1e-3, lr_schedule__min_lr=2e-3)
    with pytest.raises(ConfigError, match=r"lr_schedule.min_lr=0.002 is above optimizer.lr=0.001"):
        check_job_config(cfg)
    check_job_config(tiny_config(tmp_path, "lr", optimizer__lr=1e-3, lr_schedule__min_lr=1e-3))  # equal is fine


def test_run_info_is_strict_json_when_the_validation_loss_is_nan(tmp_path: Path) -> None:
    record = RunRecord(model_args=ModelArgs(), tokenizer={"name": "byte"}, name="nan", steps=3, last_val_loss=math.nan)
    record.write_run_info(tmp_path, finished=False)

    def refuse(constant: str) -> None:
        raise AssertionError(f"run_info.json holds a bare {constant}")

    info = json.loads((tmp_path / "run_info.json").read_text(), parse_constant=refuse)
    assert info["last_val_loss"] is None


@pytest.mark.integration
def test_a_stop_without_checkpoints_does_not_promise_a_resume(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "nockpt", steps=12, checkpoint__enabled=False))
    real_loss, sent = trainer.micro_batch_loss, []

    def loss_fn(x, y):
        if trainer.step + 1 == 3 and not sent:
            sent.append(True)
            signal.raise_signal(signal.SIGTERM)
        return real_loss(x, y)

    trainer.micro_batch_loss = loss_fn
    trainer.train()
    log = (tmp_path / "outputs" / "nockpt" / "train.log").read_text()
    assert trainer.step == 3
    assert "nothing was saved" in log and "run the same command to resume" not in log
    assert not (tmp_path / "outputs" / "nockpt" / "checkpoints").exists()


def test_runs_that_cannot_do_what_they_look_like_warn_before_they_start(tmp_path) -> None:
    from torchnlq.train.preflight import config_warnings

    assert config_warnings(tiny_config(tmp_path)) == []  # warmup 2 of 12 steps, 16 validation sequences
    warmup = config_warnings(tiny_config(tmp_path, lr_schedule__warmup_steps=12))
    # lr x steps / (warmup + 1) = 3e-3 x 12 / 13: the peak the schedule reaches, written out here.
    assert any("never reaches optimizer.lr=0.003" in w and f"{3e-3 * 12 / 13:.3g}" in w for w in warmup), warmup
    # 4 steps x 4 sequences x 2 micro-batches = 32 sequences of training between validations;
    # 120 forward-only sequences cost about 40 of them.
    slow = config_warnings(tiny_config(tmp_path, validation__sequences=120))
    assert any("each validation (120 sequences) takes longer" in w for w in slow), slow
    assert config_warnings(tiny_config(tmp_path, validation__sequences=90)) == []
    # A WSD run that ends before its decay starts is a stable phase to branch from: never advised away.
    wsd = dict(lr_schedule__name="wsd", lr_schedule__decay_steps=100, lr_schedule__decay_length=20)
    stable = config_warnings(tiny_config(tmp_path, **wsd))  # 12 steps; the decay starts at step 100 - 20
    assert len(stable) == 1 and "in the stable phase (the wsd decay starts at step 80)" in stable[0]
    assert "right for a stable run that decays branch from" in stable[0]
    midway = config_warnings(tiny_config(tmp_path, **{**wsd, "lr_schedule__decay_steps": 16,
                                                      "lr_schedule__decay_length": 8}))  # stops in the decay
    assert len(midway) == 1 and "stops before the schedule reaches min_lr" in midway[0]
