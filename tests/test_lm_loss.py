"""The chunked LM head + cross-entropy (models/lm_loss.py) against the full-logits loss, written out here.

The reference is ``F.cross_entropy`` on the whole ``hidden @ weight.T`` in fp32 and autograd's own
gradients through it; the chunked path must give the same loss and the same gradients of the
hidden states, the head and (through the model) every parameter, to 1e-6 relative in fp32, for
chunks smaller than, equal to and larger than the token count, with ignored targets, tied and
untied heads, in the Trainer, and under compile and FSDP on two processes (integration).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers.train import run_train, scalars, tiny_args, tiny_config

from torchnlq.config.job_config import Query
from torchnlq.models import ModelArgs
from torchnlq.config.job_config import loss_chunk_tokens
from torchnlq.models.lm_loss import DEFAULT_CHUNK_TOKENS, HeadLoss, linear_cross_entropy
from torchnlq.models import build_model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


@pytest.mark.parametrize("chunk", [1, 7, 24, 1000])
def test_loss_and_gradients_equal_the_full_logits(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 8, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (3, 8), generator=g)
    targets[1, 2] = targets[2, 7] = -100  # ignored positions count neither in the loss nor in the mean

    ours = linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk)
    (ours * 0.37).backward()  # a scaled loss, as gradient accumulation divides it
    ours_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    logits = (hidden @ weight.T).float()
    reference = F.cross_entropy(logits.view(-1, 40), targets.view(-1), ignore_index=-100)
    (reference * 0.37).backward()
    assert abs(ours.item() - reference.item()) <= 1e-6 * abs(reference.item())
    assert rel(ours_grads[0], hidden.grad) <= 1e-6 and rel(ours_grads[1], weight.grad) <= 1e-6
    assert ours_grads[0][1, 2].abs().max() == 0  # an ignored position gets no gradient


def test_without_grad_it_only_computes_the_loss() -> None:
    hidden, weight = torch.randn(10, 8), torch.randn(20, 8)
    targets = torch.randint(0, 20, (10,))
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=3)
    assert loss.item() == pytest.approx(F.cross_entropy(hidden @ weight.T, targets).item(), rel=1e-6)


@pytest.mark.parametrize("tied", [True, False])
def test_the_models_loss_path_gives_every_parameter_the_same_gradient(tied: bool) -> None:
    args = ModelArgs(n_layers=2, dim=32, n_heads=4, vocab_size=64, max_seq_len=16, tie_embeddings=tied,
                     query=Query(type="residual_mlp"))
    torch.manual_seed(0)
    model = build_model(args)
    model.init_weights()
    x, y = torch.randint(0, 64, (2, 2, 16), generator=torch.Generator().manual_seed(1))
    model(x, targets=y, loss_chunk_tokens=5).backward()
    chunked = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()).backward()
    for name, p in model.named_parameters():
        assert rel(chunked[name], p.grad) <= 1e-6, name


@pytest.mark.integration  # trains
def test_the_trainer_takes_the_same_steps_with_either_loss(tmp_path: Path) -> None:
    from torchnlq.train.trainer import Trainer

    losses = {}
    for name, chunk in (("full", 0), ("chunked", 24)):
        Trainer(tiny_config(tmp_path, name, steps=6, training__loss_chunk_tokens=chunk)).train()
        losses[name] = scalars(tmp_path / f"outputs/{name}/tb")["loss/train"]
    assert losses["full"].keys() == losses["chunked"].keys()
    for step, value in losses["full"].items():
        assert losses["chunked"][step] == pytest.approx(value, rel=1e-6), step


@pytest.mark.integration  # torchrun, 2 processes, compile
def test_fsdp_and_compile_take_the_same_steps_with_either_loss(tmp_path: Path) -> None:
    losses = {}
    for name, chunk in (("full", 0), ("chunked", 24)):
        args = [*tiny_args(tmp_path, name, steps=4), "--training.grad_accum_steps=1", "--training.compile",
                f"--training.loss_chunk_tokens={chunk}"]
        proc = run_train(tmp_path, *args, ngpu=2, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        losses[name] = scalars(tmp_path / f"outputs/{name}/tb")["loss/train"]
    for step, value in losses["full"].items():
        assert losses["chunked"][step] == pytest.approx(value, rel=1e-6), step


@pytest.mark.integration  # inductor compiles two graphs on the CPU
@pytest.mark.parametrize("chunk", [0, 7])
def test_the_compiled_head_loss_equals_the_full_logits(chunk: int, tmp_path: Path, monkeypatch) -> None:
    """What training.compile runs (HeadLoss under torch.compile, fullgraph) against the reference written out here."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 12, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (2, 12), generator=g)
    head_loss = HeadLoss()
    head_loss.compile(fullgraph=True)
    ours = head_loss(hidden, weight, targets, chunk)
    (ours * 0.37).backward()
    ours_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    reference = F.cross_entropy((hidden @ weight.T).float().view(-1, 40), targets.view(-1))
    (reference * 0.37).backward()
    assert abs(ours.item() - reference.item()) <= 1e-6 * abs(reference.item())
    assert rel(ours_grads[0], hidden.grad) <= 1e-5 and rel(ours_grads[1], weight.grad) <= 1e-5


def test_the_loss_path_follows_the_device_and_compile_unless_set(tmp_path: Path) -> None:
    """Unset: full logits only where they are compiled on CUDA (docs/performance.md); a set value always holds."""
    cases = {("cuda", True, None): 0, ("cuda", False, None): DEFAULT_CHUNK_TOKENS,
             ("cpu", True, None): DEFAULT_CHUNK_TOKENS, ("cuda", True, 256): 256, ("cpu", False, 0): 0}
    for (device, compiled, value), expected in cases.items():
        cfg = tiny_config(tmp_path, training__compile=compiled, training__loss_chunk_tokens=value)
        assert loss_chunk_tokens(cfg.training, device) == expected, (device, compiled, value)
