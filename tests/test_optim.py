"""LR schedule against the paper's formula; AdamW parameter groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from torchnlq.config.job_config import LRSchedule, Optimizer
from torchnlq.train.lr_schedule import lr_at
from torchnlq.train.optim import build_optimizer


def paper_lr(it: int, lr: float, min_lr: float, warmup: int, decay_iters: int) -> float:
    """The paper's (nanoGPT's) get_lr, written out independently."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


@pytest.mark.parametrize("warmup, total, decay", [(2000, 60000, None), (10, 100, None), (5, 100, 50), (0, 20, None)])
def test_schedule_matches_paper_formula(warmup: int, total: int, decay: int | None) -> None:
    cfg = LRSchedule(warmup_steps=warmup, min_lr=3e-5, decay_steps=decay)
    decay_iters = decay if decay is not None else total
    for it in sorted({0, 1, warmup - 1, warmup, warmup + 1, total // 2, decay_iters - 1, decay_iters, total - 1, total + 5}):
        if it < 0:
            continue
        assert lr_at(it, 3e-3, cfg, total) == pytest.approx(paper_lr(it, 3e-3, 3e-5, warmup, decay_iters), rel=1e-12)


def test_schedule_shape() -> None:
    cfg = LRSchedule(warmup_steps=2000, min_lr=3e-5)
    lrs = [lr_at(i, 3e-3, cfg, 60000) for i in range(60000)]
    assert lrs[0] == pytest.approx(3e-3 / 2001)
    assert max(lrs) == pytest.approx(3e-3, rel=1e-6)
    assert all(a <= b for a, b in zip(lrs[:2000], lrs[1:2000]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[2000:], lrs[2001:]))  # cosine falls
    assert lrs[-1] == pytest.approx(3e-5, rel=1e-3)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.lin = nn.Linear(4, 10, bias=True)
        self.norm = nn.LayerNorm(4, bias=False)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied, as in GPT-2


def test_weight_decay_only_on_matrices_and_tied_weights_once() -> None:
    model = Tiny()
    decay, no_decay = build_optimizer(Optimizer(weight_decay=0.1), model, "cpu").param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(model.emb.weight), id(model.lin.weight)}
    assert {id(p) for p in no_decay["params"]} == {id(model.lin.bias), id(model.norm.weight)}


def test_weight_decay_acts_on_matrices_only() -> None:
    torch.manual_seed(0)
    model = Tiny()
    opt = build_optimizer(Optimizer(lr=0.1, weight_decay=0.5), model, "cpu")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # zero gradient: only decay can move a weight
    opt.step()
    assert torch.allclose(model.lin.weight, before["lin.weight"] * (1 - 0.1 * 0.5))
    assert torch.equal(model.norm.weight, before["norm.weight"])
    assert torch.equal(model.lin.bias, before["lin.bias"])
    assert opt.defaults["betas"] == (0.9, 0.95)


def test_adamw8bit_has_adamws_groups_and_settings() -> None:
    from torchnlq.errors import ConfigError
    from torchnlq.train.optim import set_lr

    model = Tiny()
    cfg = Optimizer(name="adamw8bit", lr=3e-3, weight_decay=0.03125, beta2=0.99, eps=1e-7)
    opt, ref = build_optimizer(cfg, model, "cpu"), build_optimizer(Optimizer(weight_decay=0.03125), model, "cpu")
    from torchao.optim import AdamW8bit  # after build_optimizer, which imports torchao quietly

    assert isinstance(opt, AdamW8bit)
    assert [[id(p) for p in g["params"]] for g in opt.param_groups] == [[id(p) for p in g["params"]] for g in ref.param_groups]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.03125, 0.0]
    assert opt.defaults["betas"] == (0.9, 0.99) and opt.defaults["eps"] == 1e-7
    # torchao keeps the LR as a tensor (its compiled step would otherwise recompile per value): set in place.
    lr = opt.param_groups[0]["lr"]
    set_lr(opt, 1.5e-3)
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(1.5e-3)
    with pytest.raises(ConfigError, match="optimizer.fused"):
        build_optimizer(Optimizer(name="adamw8bit", fused=True), model, "cpu")


@pytest.mark.parametrize("option", ["--optimizer.name=adamw8bit", "--float8.enabled=true"])
def test_torchao_is_an_extra_and_a_run_without_it_says_how_to_install_it(
        option: str, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A None in sys.modules is how Python spells "not installed" to both find_spec and import."""
    import sys

    from torchnlq.cli import run_cli
    from torchnlq.train.__main__ import main

    monkeypatch.setitem(sys.modules, "torchao", None)
    code = run_cli(main, [f"--job.dump_folder={tmp_path / 'out'}", "--data.synthetic=true", "--data.tokenizer=byte",
                          "--training.device=cpu", option])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "needs the torchao package: pip install 'torchnlq[torchao]'" in err[0] and err[0].startswith("error:")
    assert not (tmp_path / "out").exists()
