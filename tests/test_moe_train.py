"""An MoE run in the trainer: resumed bit for bit with its balancing bias, on two processes as on one (FSDP2,
with compile and activation checkpointing), its routers' scalars in TensorBoard, and the graph breaks of its
compiled blocks as documented (docs/performance.md, "MoE")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchnlq.checkpoint.checkpointer import list_checkpoints
from torchnlq.train.trainer import Trainer

from helpers.train import run_train, scalars, tiny_args, tiny_config

pytestmark = pytest.mark.integration  # end-to-end trainer runs, torchrun

MOE = {"model__flavor": "moe_debug", "model__moe__expert_hidden": 16, "model__moe__bias_update_rate": 0.01,
       "model__moe__aux_loss_coef": 0.01, "model__moe__z_loss_coef": 0.001}


def biases(trainer: Trainer) -> list[torch.Tensor]:
    return [b.mlp.router.expert_bias.clone() for b in trainer.model.layers]


def test_an_moe_resumes_bit_for_bit_with_its_balancing_bias(tmp_path: Path) -> None:
    full = Trainer(tiny_config(tmp_path, "full", 12, **MOE))
    full.train()
    Trainer(tiny_config(tmp_path, "split", 12, training__steps=6, checkpoint__interval=3, **MOE)).train()  # decay at 12
    assert list_checkpoints(tmp_path / "outputs/split/checkpoints") == [3, 6]
    resumed = Trainer(tiny_config(tmp_path, "split", 12, checkpoint__interval=3, **MOE))
    resumed.train()
    full_losses, split_losses = (scalars(tmp_path / "outputs" / n / "tb")["loss/train"] for n in ("full", "split"))
    assert split_losses == full_losses and set(full_losses) == set(range(1, 13))
    log = (tmp_path / "outputs/split/train.log").read_text()
    changed = [line for line in log.splitlines() if "changed on resume" in line]
    assert "resumed from" in log and all("training.steps" in line for line in changed), changed  # model: resolved
    assert all(torch.equal(a, b) for a, b in zip(biases(full), biases(resumed)))
    assert any(b.abs().sum() > 0 for b in biases(full))  # the bias moved: the resume carried it
    tags = scalars(tmp_path / "outputs/full/tb")
    for tag in ("moe/layer0/load_max", "moe/layer1/load_min", "moe/mean/entropy", "moe/layer0/aux_loss",
                "moe/layer1/z_loss", "moe/layer0/load/3"):
        assert tag in tags, sorted(t for t in tags if t.startswith("moe"))
    assert abs(sum(tags[f"moe/layer0/load/{e}"][12] for e in range(4)) - 1.0) < 1e-6


def losses(tmp: Path, name: str) -> dict[int, float]:
    return scalars(tmp / "outputs" / name / "tb")["loss/train"]


def test_an_moe_on_two_processes_matches_one(tmp_path: Path) -> None:
    """4 sequences x 2 accumulation steps on one process, x 1 on each of two: the same batches, the same losses
    (the routers' loads summed over both, so the balancing bias moves alike), with compile and checkpointing."""
    extra = [f"--{k.replace('__', '.')}={v}" for k, v in MOE.items()]
    one = run_train(tmp_path, *tiny_args(tmp_path, "one"), *extra)
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_train(tmp_path, *tiny_args(tmp_path, "two"), *extra, "--training.grad_accum_steps=1",
                    "--training.compile", "--activation_checkpoint.mode=full", ngpu=2, timeout=600)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    ref, got = losses(tmp_path, "one"), losses(tmp_path, "two")
    assert ref.keys() == got.keys()
    for step in ref:
        assert abs(ref[step] - got[step]) <= 1e-6 * abs(ref[step]), (step, ref[step], got[step])  # docs/parallelism.md


def test_the_compiled_moe_blocks_have_no_graph_breaks_as_the_trainer_compiles_them() -> None:
    """fullgraph, as parallelize compiles every block: the looped experts' row counts (fp32 on a CPU) are traced
    as unbacked sizes, so no break, no recompilation when the routing changes, and the eager model's numbers."""
    from torch._dynamo.utils import counters

    from torchnlq.models import ModelArgs, build_model
    from torchnlq.models.moe.config import MoE
    from torchnlq.parallel.parallelize import apply_compile

    torch._dynamo.reset()
    args = ModelArgs(n_layers=3, dim=32, n_heads=2, vocab_size=64, max_seq_len=32, family="moe", norm="rms",
                     mlp_activation="swiglu", positions="rope",
                     moe=MoE(n_experts=4, top_k=2, expert_hidden=16, first_dense=1))
    torch.manual_seed(0)
    model = build_model(args)
    tokens = torch.randint(0, 64, (2, 16))
    eager = model(tokens, targets=tokens)
    apply_compile(model, fullgraph=True)  # a break would be an error
    counters.clear()
    compiled = model(tokens, targets=tokens)
    compiled.backward()
    assert sum(counters["graph_break"].values()) == 0
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    graphs = counters["stats"]["unique_graphs"]
    other = torch.randint(0, 64, (2, 16))
    model(other, targets=other).backward()  # another routing: the same graphs
    assert counters["stats"]["unique_graphs"] == graphs


def test_experts_split_over_two_processes_give_one_process_losses(tmp_path: Path) -> None:
    """parallelism.expert_parallel on 2 processes (2 of the 4 experts each, tokens exchanged by all-to-all): the
    losses and gradient norms of the 1-process run within 1e-6 relative (docs/parallelism.md); a resume of it is
    bitwise, the checkpoint read on one process."""
    from torchnlq.interop.load import load_model

    extra = [f"--{k.replace('__', '.')}={v}" for k, v in MOE.items()]
    one = run_train(tmp_path, *tiny_args(tmp_path, "one"), *extra)
    assert one.returncode == 0, one.stderr[-3000:]
    split = [*tiny_args(tmp_path, "ep"), *extra, "--training.grad_accum_steps=1", "--parallelism.expert_parallel"]
    two = run_train(tmp_path, *split, "--training.steps=6", ngpu=2, timeout=600)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    resumed = run_train(tmp_path, *split, ngpu=2, timeout=600)
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    ref, got = losses(tmp_path, "one"), losses(tmp_path, "ep")
    assert ref.keys() == got.keys()
    for step in ref:
        assert abs(ref[step] - got[step]) <= 1e-6 * abs(ref[step]), (step, ref[step], got[step])  # docs/parallelism.md
    # The gradient norm (the experts' gradients in it, which AdamW's updates would not show scaled wrong).
    ref_norm, got_norm = (scalars(tmp_path / "outputs" / name / "tb")["grad_norm"] for name in ("one", "ep"))
    for step in ref_norm:
        assert abs(ref_norm[step] - got_norm[step]) <= 1e-6 * ref_norm[step], (step, ref_norm[step], got_norm[step])
    single = load_model(tmp_path / "outputs/one/checkpoints/step-12").model
    split_model = load_model(tmp_path / "outputs/ep/checkpoints/step-12").model  # every expert, one process
    assert [p.shape for p in single.parameters()] == [p.shape for p in split_model.parameters()]
    tokens = torch.randint(0, single.args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # AdamW amplifies rounding where a gradient is ~0: the functions, not the bits
        a, b = single(tokens), split_model(tokens)
    assert ((a - b).abs().max() / a.abs().max()).item() <= 1e-3
