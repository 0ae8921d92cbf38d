"""The memory estimate (torchnlq/train/memory_estimate.py) against the memory a real training step allocates.

The reference is independent of the estimate: a real Trainer step on the CPU, its allocations and
frees recorded by torch's profiler (what ``python -m benchmarks.train_step`` reports as peak memory:
parameters and optimizer state, plus the highest point the step reaches above them). The estimate runs the same
step on fake tensors. The issue's target is 15%; at these shapes both agree to a few percent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.train import tiny_config

from benchmarks.timing import measure_allocations
from benchmarks.train_step_support import tensor_bytes
from torchnlq.train.memory_estimate import GIB, MemoryEstimate, estimate_memory, fit_warning
from torchnlq.train.preflight import check_job_config
from torchnlq.train.trainer import Trainer
from torchnlq.models.counts import num_params

SHAPE = dict(model__n_layers=4, model__dim=128, model__n_heads=4, training__seq_len=128, training__micro_batch_size=8)
CASES = {
    "residual_mlp": {},
    "ac-full": {"activation_checkpoint__mode": "full"},
    "ac-op": {"activation_checkpoint__mode": "op"},
    "ac-selective": {"activation_checkpoint__mode": "selective", "activation_checkpoint__every": 2},
    "full-logits": {"training__loss_chunk_tokens": 0},
    # the compiled head loss, where the logits are most of the step (without the estimate's stand-in for
    # inductor's fused cross-entropy, its eager count is 1.45x the measured peak)
    "compiled-full-logits": {"training__loss_chunk_tokens": 0, "training__compile": True, "model__vocab_size": 16384},
    "accumulation": {"training__grad_accum_steps": 2},
    "linear-gqa-rope": {"model__query__type": "linear", "model__n_kv_heads": 2, "model__positions": "rope"},
    "longer-sequences": {"training__seq_len": 256, "training__micro_batch_size": 4, "model__max_seq_len": 256},
}


def measured_peak(trainer: Trainer) -> int:
    """Parameters + optimizer state + the peak a step allocates above them (as benchmarks.train_step measures)."""
    trainer.train_step()  # creates the optimizer state
    trainer.optimizer.zero_grad(set_to_none=True)
    static = tensor_bytes(trainer.model.parameters())
    static += tensor_bytes(v for state in trainer.optimizer.state.values() for v in state.values())
    _, _, peak = measure_allocations(trainer.train_step)
    return static + peak


@pytest.mark.integration
@pytest.mark.parametrize("case", CASES)
def test_the_estimate_is_within_15_percent_of_a_measured_step(tmp_path: Path, case: str) -> None:
    cfg = tiny_config(tmp_path, case, steps=4, validation__enabled=False, **{**SHAPE, **CASES[case]})
    estimate = estimate_memory(cfg, check_job_config(cfg), world_size=1, device_type="cpu")
    measured = measured_peak(Trainer(cfg))
    assert abs(estimate.total / measured - 1) <= 0.15, (estimate.describe(), measured / 2**20)


def test_the_parts_follow_the_parameter_count_and_sharding(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "parts", **SHAPE)
    args = check_job_config(cfg)
    one = estimate_memory(cfg, args, 1, "cpu")
    n_params = num_params(args)
    assert one.weights == one.gradients == 4 * n_params  # fp32 master weights and gradients
    assert one.optimizer == 8 * n_params  # AdamW's two fp32 moments
    four = estimate_memory(cfg, args, 4, "cpu")
    assert four.weights == -(-4 * n_params // 4) and four.optimizer == -(-8 * n_params // 4)
    cfg.optimizer.name = "adamw8bit"
    assert estimate_memory(cfg, args, 1, "cpu").optimizer < one.optimizer / 3


def test_bf16_on_cuda_holds_less_than_fp32_and_checkpointing_less_than_none(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "bf16", **SHAPE)
    args = check_job_config(cfg)
    cfg.training.mixed_precision = "bf16"
    bf16 = estimate_memory(cfg, args, 1, "cuda")
    fp32 = estimate_memory(cfg, args, 1, "cpu")  # the CPU always trains in fp32
    assert (bf16.precision, fp32.precision) == ("bf16", "fp32") and bf16.step < fp32.step
    cfg.activation_checkpoint.mode = "full"
    assert estimate_memory(cfg, args, 1, "cuda").step < bf16.step


def test_a_config_that_does_not_fit_gets_a_warning_with_what_to_change() -> None:
    estimate = MemoryEstimate(weights=GIB, gradients=GIB, optimizer=2 * GIB, step=26 * GIB, world_size=1,
                              precision="bf16")
    warning = fit_warning(estimate, 32 * GIB, "a 32 GiB card")
    assert warning and "30.0 GiB" in warning and "micro_batch_size" in warning and "activation_checkpoint" in warning
    assert fit_warning(estimate, 40 * GIB, "a 40 GiB card") is None


def test_model_summary_reports_the_estimate_and_warns_when_it_does_not_fit(capsys: pytest.CaptureFixture) -> None:
    from helpers import REPO_ROOT

    from torchnlq.train.summary import main

    config = str(REPO_ROOT / "train_configs" / "gpt_small_res_gelu.toml")
    assert main([config, "--model.n_layers=2", "--training.device=cuda"]) == 0
    out = capsys.readouterr()
    gib = float(next(line for line in out.out.splitlines() if line.startswith("memory_estimate_gib:")).split()[1])
    assert 0 < gib < 32 and "warning: memory" not in out.err
    assert "; bf16) (eager blocks, compiled head loss from the full logits, on CUDA" in out.out
    assert main([config, "--model.n_layers=2", "--training.device=cuda", "--card-gib", str(gib / 2)]) == 0
    assert "warning: memory estimate" in capsys.readouterr().err
    # A CPU run is estimated as the trainer runs it there: fp32, no autocast (the config asks for bf16 on CUDA),
    # and the head's loss in chunks (on CUDA the compiled full logits).
    assert main([config, "--model.n_layers=2", "--training.device=cpu"]) == 0
    out = capsys.readouterr().out
    assert "; fp32) (eager blocks, compiled head loss in 4096-token chunks, on CPU: training.device = cpu;" in out
    cpu_gib = float(next(line for line in out.splitlines() if line.startswith("memory_estimate_gib:")).split()[1])
    assert main([config, "--model.n_layers=2", "--training.device=cuda", "--training.loss_chunk_tokens=4096"]) == 0
    out = capsys.readouterr().out
    chunked_gib = float(next(line for line in out.splitlines() if line.startswith("memory_estimate_gib:")).split()[1])
    assert cpu_gib > chunked_gib  # fp32 activations


@pytest.mark.integration
def test_every_shipped_config_fits_a_32_gb_card_with_headroom() -> None:
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.memory_estimate import DEFAULT_CARD_GIB

    from helpers import REPO_ROOT

    for path in sorted((REPO_ROOT / "train_configs").glob("*.toml")):
        cfg = load_job_config([str(path)])
        if cfg.model.from_checkpoint:  # its model is the folder's a user names: no model of its own to estimate
            continue
        estimate = estimate_memory(cfg, check_job_config(cfg), 1, "cuda")
        assert fit_warning(estimate, int(DEFAULT_CARD_GIB * GIB), "a 32 GiB card") is None, (path.name, estimate.describe())


def test_the_optimizer_state_follows_the_runs_own_groups() -> None:
    """A Muon group from [[optimizer.groups]] (the MLP matrices only) under optimizer.name = adamw: the estimate's
    optimizer state is Muon's momentum (4 bytes) for exactly those tensors and AdamW's two moments (8) for the rest."""
    import fnmatch

    import torch

    from torchnlq.config.job_config import OptimizerGroup
    from torchnlq.config.manager import load_job_config
    from torchnlq.models import build_model
    from torchnlq.train.preflight import check_job_config

    cfg = load_job_config(["--model.dim=32", "--model.n_heads=2", "--training.seq_len=32",
                           "--training.micro_batch_size=2", "--data.tokenizer=byte"])
    cfg.optimizer.groups = [OptimizerGroup(name="mlp_muon", params=["layers.*.mlp.*.weight"], optimizer="muon")]
    args = check_job_config(cfg)
    with torch.device("meta"):
        named = dict(build_model(args).named_parameters())
    muon = sum(p.numel() for name, p in named.items() if fnmatch.fnmatchcase(name, "layers.*.mlp.*.weight"))
    total = sum(p.numel() for p in named.values())
    assert 0 < muon < total
    assert estimate_memory(cfg, args, 1, "cpu").optimizer == 4 * muon + 8 * (total - muon)


@pytest.mark.integration  # a fresh process
def test_the_estimate_of_a_bf16_qk_norm_model_prints_nothing() -> None:
    """The estimate's fake CPU step of a GPU config (QK-norm: a bf16 input beside an fp32 gain) says nothing on
    stderr: ATen's CPU remark that its fused RMSNorm is not taken is about the fake step, not the user's run.
    A fresh process, since torch gives that remark once per process."""
    import subprocess
    import sys

    from helpers import REPO_ROOT

    code = ("from torchnlq.config.manager import load_job_config\n"
            "from torchnlq.train.preflight import check_job_config\n"
            "from torchnlq.train.memory_estimate import estimate_memory\n"
            "cfg = load_job_config(['train_configs/moe_gpt_small.toml'])\n"
            "print(estimate_memory(cfg, check_job_config(cfg), 1, 'cuda').weights > 0)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    assert done.stderr == ""
