"""Where a run starts (train/run_start.py): one decision, one log line, and the drift reference that follows it."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch

from helpers.checkpoints import load_script
from helpers.train import scalars, tiny_config


@pytest.mark.integration  # builds trainers (a second or two each)
def test_fresh_resume_and_initial_loads_each_say_where_the_run_starts(tmp_path: Path) -> None:
    from torchnlq.train.run_start import initial_query_weights
    from torchnlq.train.trainer import Trainer
    from torchnlq.train.weight_dynamics import initial_matrices

    extra = dict(metrics__weight_dynamics_interval=2, validation__enabled=False)
    fresh = Trainer(tiny_config(tmp_path, "src", steps=4, **extra))
    assert (fresh.start.kind, fresh.start.line, fresh.start.weights_from) == ("fresh", None, None)
    fresh.train()
    ckpt = tmp_path / "outputs/src/checkpoints/step-4"
    export = tmp_path / "export"
    convert = load_script("convert_checkpoint")
    assert convert.run_cli(convert.main, [str(ckpt), str(export), "--format", "safetensors"]) == 0

    # Another run's DCP checkpoint, weights only: step 0, and no step-0 weights to measure drift from.
    dcp = Trainer(tiny_config(tmp_path, "from_dcp", steps=4, checkpoint__initial_load_path=ckpt, **extra))
    assert (dcp.start.kind, dcp.start.line, dcp.start.step) == ("initial", f"initialised from {ckpt} (step 0)", 0)
    assert dcp.start.weights_from == ckpt and dcp.start.resume_point is None
    assert initial_query_weights(dcp.cfg.checkpoint, dcp.model_args, dcp.cfg.training.seed) == (
        None, f"the run started from the DCP checkpoint {ckpt}")
    dcp.train()
    log = (tmp_path / "outputs/from_dcp/train.log").read_text()
    assert log.count(f"initialised from {ckpt} (step 0)") == 1
    assert log.count(f"weights/.../drift not logged: the run started from the DCP checkpoint {ckpt}") == 1
    assert not [t for t in scalars(tmp_path / "outputs/from_dcp/tb") if t.endswith("/drift")]

    # Another query type than the checkpoint's (residual_mlp there): every other tensor is the checkpoint's, the
    # run's linear W_Q keeps its init, and the line says what was left out.
    from safetensors.torch import load_file

    swapped = Trainer(tiny_config(tmp_path, "swapped", steps=4, checkpoint__initial_load_path=ckpt,
                                  model__query__type="linear", **extra))
    assert swapped.start.line == (f"initialised from {ckpt} (step 0; its residual_mlp query (8 tensors) is left out: "
                                  "this run's linear queries start from their init, every other tensor is the "
                                  "source's)")
    saved = load_file(str(export / "model.safetensors"))
    ours = swapped.model.state_dict()
    assert {k for k in saved if ".attn.query." not in k} == {k for k in ours if ".attn.query." not in k}
    assert all(torch.equal(ours[k], saved[k]) for k in saved if ".attn.query." not in k)
    assert [k for k in ours if ".attn.query." in k] == ["layers.0.attn.query.w_q.weight",
                                                         "layers.1.attn.query.w_q.weight"]
    swapped.close()

    # An export: the drift reference is the exported weights the run started from.
    cfg = tiny_config(tmp_path, "from_export", steps=4, checkpoint__initial_load_path=export, **extra)
    run = Trainer(cfg)
    assert (run.start.kind, run.start.line) == ("initial", f"initialised from {export} (step 0)")
    reference, _ = initial_query_weights(cfg.checkpoint, run.model_args, cfg.training.seed)
    started = initial_matrices(run.model)
    assert reference.keys() == started.keys() and all(torch.equal(reference[k], started[k]) for k in started)
    run.train()
    assert [t for t in scalars(tmp_path / "outputs/from_export/tb") if t.endswith("/drift")]

    # Its own checkpoint comes first: a resume, whatever initial_load_path says.
    cfg = tiny_config(tmp_path, "from_export", steps=6, checkpoint__initial_load_path=export, **extra)
    resumed = Trainer(cfg)
    point = tmp_path / "outputs/from_export/checkpoints/step-4"
    assert (resumed.start.kind, resumed.start.step, resumed.step) == ("resume", 4, 4)
    assert resumed.start.line == (  # the initial load it was started with is not silently dropped
        f"resumed from {point} (step 4, {resumed.record.tokens_seen:,} tokens seen); checkpoint.initial_load_path "
        f"{cfg.checkpoint.initial_load_path} is not used: the run has its own checkpoints"
    )
    assert resumed.start.resume_point == resumed.start.weights_from == point
    # The lineage is recorded: where the weights started (kept across the resume) and what this session resumed.
    resumed.write_run_info(finished=False)
    info = json.loads((tmp_path / "outputs/from_export/run_info.json").read_text())
    assert (info["initialized_from"], info["resumed_from"]) == (str(export), str(point))
    # The export moved away since: the run resumes and trains on, its drift no longer measured (and says why).
    export.rename(tmp_path / "moved")
    resumed.train()
    log = (tmp_path / "outputs/from_export/train.log").read_text()
    assert log.count(f"weights/.../drift not logged: the run's initial load {export} is no longer there") == 1
    assert json.loads((tmp_path / "outputs/from_export/run_info.json").read_text())["step"] == 6


def test_checkpoints_carry_only_a_gpt2_runs_ranks(tmp_path: Path) -> None:
    from torchnlq.train.run_start import checkpoint_files

    assert checkpoint_files({"name": "byte"}, None, None, logging.getLogger("test")) == {}
    ranks = tmp_path / "r.tiktoken"
    ranks.write_bytes(b"IQ== 0\n")
    desc = {"name": "gpt2", "tiktoken_sha256": hashlib.sha256(ranks.read_bytes()).hexdigest()}
    assert checkpoint_files(desc, None, str(ranks), logging.getLogger("test")) == {"tokenizer.tiktoken": b"IQ== 0\n"}
