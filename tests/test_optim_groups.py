"""Parameter groups by pattern and kind, Muon, and the warmup-stable-decay schedule (issue 22), each
against a reference written out here: the paper's two groups, an explicit list of names, a Muon step
computed by hand (momentum, Newton-Schulz in bf16, decoupled decay, Moonshot's LR scale), the formula."""

from __future__ import annotations

import math

import pytest
import torch

from torchnlq.config.job_config import LRSchedule, Optimizer, OptimizerGroup, Query
from torchnlq.errors import ConfigError
from torchnlq.models import Decoder, ModelArgs
from torchnlq.train.lr_schedule import lr_at
from torchnlq.train.optim import OptimizerSet, build_optimizer, plan_groups, set_lr
from torchnlq.models import build_model


def tiny(qtype: str = "residual_mlp", **kw: object) -> Decoder:
    torch.manual_seed(0)
    return build_model(ModelArgs(n_layers=2, dim=32, n_heads=4, vocab_size=64, max_seq_len=16, query=Query(type=qtype), **kw))


def names_of(model: Decoder, params: list[torch.Tensor]) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for p in params]


def test_without_groups_the_optimizer_is_the_papers():
    """Two groups, in named_parameters order: >= 2-D tensors decayed, the rest not; no extra keys."""
    model = tiny(tie_embeddings=False)
    optimizer = build_optimizer(Optimizer(weight_decay=0.1), model, "cpu")
    assert isinstance(optimizer, torch.optim.AdamW)
    decay, no_decay = optimizer.param_groups
    assert names_of(model, decay["params"]) == [n for n, p in model.named_parameters() if p.dim() >= 2]
    assert names_of(model, no_decay["params"]) == [n for n, p in model.named_parameters() if p.dim() < 2]
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert "lr_multiplier" not in decay and "lr_multiplier" not in no_decay


def test_groups_by_kind_and_pattern_claim_exactly_these_names():
    model = tiny(tie_embeddings=False)
    cfg = Optimizer(weight_decay=0.1, groups=[
        OptimizerGroup(name="query_mlp", kind="query_mlp", lr_multiplier=2.0, weight_decay=0.0),
        OptimizerGroup(name="embeddings", params=["tok_emb.*", "pos_emb.*"]),
        OptimizerGroup(name="first_kv", params=["layers.0.attn.kv.*"], kind="hidden", lr_multiplier=0.5),
    ])
    plans = {plan.name: plan.names for plan in plan_groups(cfg, model)}
    assert plans["query_mlp"] == ["layers.0.attn.query.w1.weight", "layers.0.attn.query.w2.weight",
                                  "layers.1.attn.query.w1.weight", "layers.1.attn.query.w2.weight"]
    assert plans["embeddings"] == ["tok_emb.weight", "pos_emb.weight"]
    assert plans["first_kv"] == ["layers.0.attn.kv.weight"]
    assert "layers.0.attn.query.w1.weight" not in plans["decay"] and "lm_head.weight" in plans["decay"]
    assert all(n.endswith(("weight", "bias")) for n in plans["no_decay"])
    optimizer = build_optimizer(cfg, model, "cpu")
    set_lr(optimizer, 1e-3)
    lrs = {plan.name: group["lr"] for plan, group in zip(plan_groups(cfg, model), optimizer.param_groups)}
    assert lrs == {"decay": 1e-3, "no_decay": 1e-3, "query_mlp": 2e-3, "embeddings": 1e-3, "first_kv": 5e-4}


@pytest.mark.parametrize("groups, message", [
    ([OptimizerGroup(name="x", params=["layers.*.attn.wq.weight"])], "'x' matches no parameter"),
    ([OptimizerGroup(name="a", kind="hidden"), OptimizerGroup(name="b", kind="query_mlp")],
     "claimed by optimizer.groups 'a' and 'b'"),
    ([OptimizerGroup(name="m", kind="gain_bias", optimizer="muon")], "not a 2-D matrix"),
    ([OptimizerGroup(name="empty")], "selects nothing"),
    ([OptimizerGroup(name="a", kind="head"), OptimizerGroup(name="a", kind="embedding")], "name 'a' is used twice"),
    ([OptimizerGroup(name="decay", kind="head")], "name 'decay' is used twice"),
])
def test_group_mistakes_are_one_line(groups: list[OptimizerGroup], message: str):
    with pytest.raises(ConfigError, match=message) as info:
        build_optimizer(Optimizer(groups=groups), tiny(), "cpu")
    assert "\n" not in str(info.value)


def newton_schulz(g: torch.Tensor) -> torch.Tensor:
    """torch's own orthogonalisation (its bf16 quintic iteration), called directly on the same tensor."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    return _zeropower_via_newtonschulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7)


def test_newton_schulz_flattens_the_spectrum():
    """What Muon's update is for: singular values spread over 1e-1..1e1 come out near 1 (Keller Jordan's
    quintic leaves them within about 0.5..1.5), with the singular vectors kept."""
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(48, 48))
    v, _ = torch.linalg.qr(torch.randn(24, 24))
    spectrum = torch.logspace(-1, 1, 24)
    g = u[:, :24] @ torch.diag(spectrum) @ v.T
    out = newton_schulz(g).float()
    singular = torch.linalg.svdvals(out)
    assert singular.min() > 0.5 and singular.max() < 1.5
    # The same directions: out ≈ U S' Vᵀ, so Uᵀ out V is diagonal up to bf16 noise.
    core = u[:, :24].T @ out @ v
    assert (core - torch.diag(torch.diagonal(core))).abs().max() < 0.05


def test_a_muon_step_is_the_written_out_update():
    """optimizer.name = muon: blocks' 2-D matrices get Muon (momentum 0.95, Nesterov, NS, lr·0.2·sqrt(max(A, B)),
    decoupled decay); embeddings and gains stay with AdamW."""
    model = tiny("residual_mlp")
    cfg = Optimizer(name="muon", lr=0.01, weight_decay=0.1)
    optimizer = build_optimizer(cfg, model, "cpu")
    assert isinstance(optimizer, OptimizerSet)
    adam, muon = optimizer.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adam, torch.optim.AdamW)
    muon_names = names_of(model, [p for g in muon.param_groups for p in g["params"]])
    assert muon_names == [n for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("layers.")]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.step()
    for name in muon_names:
        g, w = grads[name], before[name]
        # Momentum as torch writes it (lerp: the same float rounding, which bf16 iterations would amplify):
        buf = torch.zeros_like(g).lerp(g, 1 - 0.95)  # the buffer starts at zero
        update = newton_schulz(g.lerp(buf, 0.95))  # Nesterov: the gradient moved towards the buffer
        want = w * (1 - 0.01 * 0.1) - 0.01 * 0.2 * math.sqrt(max(w.shape)) * update.float()
        torch.testing.assert_close(dict(model.named_parameters())[name].detach(), want, rtol=1e-6, atol=1e-7)


def test_muon_and_adamw_state_round_trips_through_dcp_state_dict():
    """The two optimizers save and load as one DCP optimizer entry (disjoint parameters)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = tiny("residual_mlp")
    optimizer = build_optimizer(Optimizer(name="muon"), model, "cpu")
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    _, saved = get_state_dict(model, optimizer)
    fresh_model = tiny("residual_mlp")
    fresh = build_optimizer(Optimizer(name="muon"), fresh_model, "cpu")
    set_state_dict(fresh_model, fresh, model_state_dict=model.state_dict(), optim_state_dict=saved)
    for a, b in zip(optimizer.optimizers, fresh.optimizers):
        for pa, pb in zip([p for g in a.param_groups for p in g["params"]], [p for g in b.param_groups for p in g["params"]]):
            for key, value in a.state[pa].items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(b.state[pb][key])), key


def wsd(it: int, peak: float, floor: float, warmup: int, end: int, tail: int, shape: str) -> float:
    """Warmup-stable-decay written out: nanoGPT's warmup, the peak, then the tail's shape over its last ``tail`` steps."""
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    if it >= end:
        return floor
    start = end - tail
    if it < start:
        return peak
    x = (it - start) / tail
    return {"linear": peak - (peak - floor) * x,
            "cosine": floor + (peak - floor) * (1 + math.cos(math.pi * x)) / 2,
            "1-sqrt": floor + (peak - floor) * (1 - math.sqrt(x))}[shape]


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
@pytest.mark.parametrize("length, fraction", [(None, 0.2), (30, 0.2), (None, 1.0)])
def test_wsd_against_the_formula(shape: str, length: int | None, fraction: float):
    cfg = LRSchedule(name="wsd", warmup_steps=10, min_lr=1e-5, decay_shape=shape, decay_length=length,
                     decay_fraction=fraction)
    tail = length if length is not None else round(fraction * 200)
    for it in range(0, 210):
        assert lr_at(it, 1e-3, cfg, 200) == pytest.approx(wsd(it, 1e-3, 1e-5, 10, 200, tail, shape), rel=1e-12), it
