"""Query diagnostics against values computed by hand, and through wrapped (compiled, checkpointed) blocks."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torchnlq.config.job_config import Query
from torchnlq.models import Decoder, ModelArgs
from torchnlq.train.diagnostics import query_diagnostics
from torchnlq.models import build_model

DIM, LAYERS = 16, 2


def make_model(query_type: str, **query: object) -> Decoder:
    torch.manual_seed(0)
    return build_model(ModelArgs(n_layers=LAYERS, dim=DIM, n_heads=2, vocab_size=64, max_seq_len=16,
                         query=Query(type=query_type, **query)))


def tokens() -> torch.Tensor:
    return torch.randint(0, 64, (3, 8), generator=torch.Generator().manual_seed(1))


def layer0_input(model: Decoder, toks: torch.Tensor) -> torch.Tensor:
    """ln_1 of the embeddings, written out: the first query's X."""
    e = model.tok_emb.weight[toks] + model.pos_emb.weight[: toks.shape[1]]
    mu = e.mean(-1, keepdim=True)
    var = e.var(-1, unbiased=False, keepdim=True)
    return (e - mu) / torch.sqrt(var + 1e-5) * model.layers[0].ln_1.weight


@pytest.mark.parametrize("query_type", ["linear", "identity"])
def test_no_residual_branch_gives_no_keys(query_type: str) -> None:
    assert query_diagnostics(make_model(query_type), tokens()) == {}


def test_zero_output_weights_give_ratio_zero_and_cosine_one() -> None:
    model = make_model("residual_mlp", half_scale=True)
    for layer in model.layers:
        nn.init.zeros_(layer.attn.query.w2.weight)  # f(X) = LN(0) = 0, so Q = X/2
    figures = query_diagnostics(model, tokens())
    for i in range(LAYERS):
        assert figures[f"query/layer{i}/f_ratio"] == 0.0
        assert figures[f"query/layer{i}/cos_q_x"] == pytest.approx(1.0, abs=1e-6)
        assert figures[f"query/layer{i}/gain_in"] == 1.0 and figures[f"query/layer{i}/gain_out"] == 1.0
    assert figures["query/mean/f_ratio"] == 0.0
    assert figures["query/mean/cos_q_x"] == pytest.approx(1.0, abs=1e-6)


def test_linear_residual_with_scaled_identity() -> None:
    # W_Q = c·I: f(X) = cX, so |f|/|X| = |c| and Q = (1 + c)X points along X (c > -1) or against it.
    model = make_model("residual")
    with torch.no_grad():
        model.layers[0].attn.query.w_q.weight.copy_(0.5 * torch.eye(DIM))
        model.layers[1].attn.query.w_q.weight.copy_(-3.0 * torch.eye(DIM))
    figures = query_diagnostics(model, tokens())
    assert figures["query/layer0/f_ratio"] == pytest.approx(0.5, rel=1e-5)
    assert figures["query/layer0/cos_q_x"] == pytest.approx(1.0, abs=1e-5)
    assert figures["query/layer1/f_ratio"] == pytest.approx(3.0, rel=1e-5)
    assert figures["query/layer1/cos_q_x"] == pytest.approx(-1.0, abs=1e-5)
    assert figures["query/mean/f_ratio"] == pytest.approx(1.75, rel=1e-5)
    assert figures["query/mean/cos_q_x"] == pytest.approx(0.0, abs=1e-5)
    assert not any("gain" in k for k in figures)  # no norms in the linear residual


def test_residual_mlp_layer0_matches_hand_computation() -> None:
    model = make_model("residual_mlp")
    q = model.layers[0].attn.query
    with torch.no_grad():
        q.input_norm.weight.copy_(torch.linspace(0.5, 2.0, DIM))
        q.output_norm.weight.copy_(torch.linspace(-1.0, 3.0, DIM))
    toks = tokens()
    with torch.no_grad():
        x = layer0_input(model, toks)
        rms = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * q.input_norm.weight
        h = F.linear(rms, q.w1.weight)
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # exact GELU
        h = F.linear(h, q.w2.weight)
        f = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
        f = f * q.output_norm.weight
        qx = (x + f) / 2
        ratio = (f.norm(dim=-1) / x.norm(dim=-1)).mean().item()
        cos = ((qx * x).sum(-1) / (qx.norm(dim=-1) * x.norm(dim=-1))).mean().item()
    figures = query_diagnostics(model, toks)
    assert figures["query/layer0/f_ratio"] == pytest.approx(ratio, rel=1e-4)
    assert figures["query/layer0/cos_q_x"] == pytest.approx(cos, rel=1e-4)
    assert figures["query/layer0/gain_in"] == pytest.approx(1.25, rel=1e-6)
    assert figures["query/layer0/gain_out"] == pytest.approx(1.0, rel=1e-6)
    assert figures["query/mean/gain_in"] == pytest.approx((1.25 + 1.0) / 2, rel=1e-6)
    assert set(figures) == {f"query/{w}/{s}" for w in ("layer0", "layer1", "mean")
                            for s in ("f_ratio", "cos_q_x", "gain_in", "gain_out")}


def test_no_gain_keys_without_norms() -> None:
    figures = query_diagnostics(make_model("residual_mlp", input_norm="none", output_norm="none"), tokens())
    assert "query/layer0/f_ratio" in figures and not any("gain" in k for k in figures)


def test_mode_restored_no_hooks_left_no_grads() -> None:
    model = make_model("residual_mlp")
    model.train()
    model.layers[1].eval()  # a mixed state must come back exactly
    query_diagnostics(model, tokens())
    assert model.training and model.layers[0].training and not model.layers[1].training
    assert all(not m._forward_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.integration  # torch.compile: seconds
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own
def test_wrapped_blocks_give_the_same_figures() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = make_model("residual_mlp")
    expected = query_diagnostics(model, tokens())
    wrapped = copy.deepcopy(model)
    wrapped.layers[0] = checkpoint_wrapper(wrapped.layers[0])  # inserts _checkpoint_wrapped_module
    wrapped.layers[1] = torch.compile(wrapped.layers[1])  # an OptimizedModule: _orig_mod
    names = [n for n, m in wrapped.named_modules() if type(m).__name__ == "ResidualMLPQuery"]
    assert names == ["layers.0._checkpoint_wrapped_module.attn.query", "layers.1._orig_mod.attn.query"]
    assert query_diagnostics(wrapped, tokens()) == pytest.approx(expected, rel=1e-6)

    in_place = copy.deepcopy(model)
    for block in in_place.layers:
        block.compile(fullgraph=True)  # what the trainer's apply_compile does
    assert query_diagnostics(in_place, tokens()) == pytest.approx(expected, rel=1e-6)
