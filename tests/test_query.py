"""The query projections against formulas written out by hand from their weights."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from torchnlq.config.job_config import Query
from torchnlq.errors import ConfigError
from torchnlq.models.query import (
    QUERY_TYPES,
    LinearInX,
    LinearQuery,
    PaperQKVRows,
    QueryProjection,
    ResidualBranch,
    ResidualMLPQuery,
    build_query,
    ignored_knobs,
    register_query,
)

EPS = 1e-5
DIM, N_HEADS, HEAD_DIM = 32, 4, 8


# ---- independent references: plain tensor ops only (no nn.functional norms or activations) ----

def ref_rms_norm(x, gain, eps=EPS):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def ref_layer_norm(x, gain, eps=EPS):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)  # biased variance, as LayerNorm
    return (x - mean) / torch.sqrt(var + eps) * gain


REF_ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: torch.clamp(x, min=0),
    "relu2": lambda x: torch.clamp(x, min=0) ** 2,
    "silu": lambda x: x / (1 + torch.exp(-x)),
}


def ref_norm(kind, x, module):
    if kind == "none":
        return x
    gain = module.weight
    return ref_rms_norm(x, gain) if kind == "rms" else ref_layer_norm(x, gain)


def ref_residual_mlp(q: ResidualMLPQuery, cfg: Query, x):
    """(x + out_norm(act(in_norm(x) @ W1.T) @ W2.T)) * (1/2 or 1)."""
    h = ref_norm(cfg.input_norm, x, q.input_norm) @ q.w1.weight.T
    f = ref_norm(cfg.output_norm, REF_ACTIVATIONS[cfg.activation](h) @ q.w2.weight.T, q.output_norm)
    return (x + f) * (0.5 if cfg.half_scale else 1.0), f


def param_count(cfg: Query, dim=DIM, n_heads=N_HEADS, head_dim=HEAD_DIM) -> int:
    """Parameters of the query built on meta (what the model's counts add up)."""
    with torch.device("meta"):
        return sum(p.numel() for p in build_query(cfg, dim, n_heads, head_dim, EPS).parameters())


def make(cfg: Query, dim=DIM, n_heads=N_HEADS, head_dim=HEAD_DIM, seed=0) -> QueryProjection:
    torch.manual_seed(seed)
    q = build_query(cfg, dim, n_heads, head_dim, EPS).double()
    q.init_weights(0.3)  # large std so that the nonlinearities are exercised
    with torch.no_grad():  # gains away from 1, so that a missing gain would show
        for name, p in q.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) + 0.5)
    return q


@pytest.fixture
def x():
    torch.manual_seed(123)
    return torch.randn(2, 5, DIM, dtype=torch.float64) * 2 + 0.3


def test_registry_holds_the_four_types():
    assert {"linear", "identity", "residual", "residual_mlp"} <= set(QUERY_TYPES)


def test_linear(x):
    q = make(Query(type="linear"))
    torch.testing.assert_close(q(x), x @ q.w_q.weight.T)


def test_linear_allows_other_query_width(x):
    q = make(Query(type="linear"), n_heads=3, head_dim=6)
    assert q(x).shape == (2, 5, 18)
    assert param_count(Query(type="linear"), n_heads=3, head_dim=6) == DIM * 18


def test_identity(x):
    q = make(Query(type="identity"))
    assert list(q.parameters()) == []
    assert torch.equal(q(x), x / 2)  # half_scale (the default): the paper's Q = X/2
    assert torch.equal(make(Query(type="identity", half_scale=False))(x), x)


def test_residual(x):
    q = make(Query(type="residual"))
    torch.testing.assert_close(q(x), (x + x @ q.w_q.weight.T) / 2)
    torch.testing.assert_close(q.residual_branch(x), x @ q.w_q.weight.T)
    q = make(Query(type="residual", half_scale=False))
    torch.testing.assert_close(q(x), x + x @ q.w_q.weight.T)


def test_half_scale_is_read_by_every_type_that_contains_x():
    """One knob, one meaning: every registered type whose query contains X itself reads half_scale."""
    for name, cls in QUERY_TYPES.items():
        if cls.requires_full_width:
            assert "half_scale" in cls.knobs, name
    assert "half_scale" not in LinearQuery.knobs


def test_residual_mlp_paper_formula(x):
    """The paper: 0.5 * (x + LN(GELU(RMSNorm(x) W1) W2)), r = d/2, exact GELU."""
    q = make(Query(type="residual_mlp"))
    assert q.w1.weight.shape == (DIM // 2, DIM) and q.w2.weight.shape == (DIM, DIM // 2)
    g1, g2 = q.input_norm.weight, q.output_norm.weight
    h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g1 @ q.w1.weight.T
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2))) @ q.w2.weight.T
    f = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + EPS) * g2
    torch.testing.assert_close(q(x), 0.5 * (x + f))
    torch.testing.assert_close(q.residual_branch(x), f)


KNOBS = list(
    itertools.product(
        ("gelu", "gelu_tanh", "relu", "relu2", "silu"), ("rms", "layer", "none"), ("layer", "rms", "none"), (True, False)
    )
)


@pytest.mark.parametrize("activation,input_norm,output_norm,half_scale", KNOBS)
def test_residual_mlp_knobs(x, activation, input_norm, output_norm, half_scale):
    cfg = Query(
        type="residual_mlp", activation=activation, input_norm=input_norm, output_norm=output_norm,
        bottleneck_ratio=0.25, half_scale=half_scale,
    )
    q = make(cfg)
    assert q.w1.weight.shape == (8, DIM)
    expected, f = ref_residual_mlp(q, cfg, x)
    torch.testing.assert_close(q(x), expected)
    torch.testing.assert_close(q.residual_branch(x), f)
    # Analytic count == real count: 2·d·r + one gain of d per norm.
    gains = DIM * ((input_norm != "none") + (output_norm != "none"))
    assert sum(p.numel() for p in q.parameters()) == 2 * DIM * 8 + gains


@pytest.mark.parametrize("ratio,rank", [(0.5, 16), (1.0, 32), (0.1, 3), (1 / 32, 1), (2.0, 64)])
def test_bottleneck_width_is_rounded_ratio(ratio, rank):
    q = build_query(Query(type="residual_mlp", bottleneck_ratio=ratio), DIM, N_HEADS, HEAD_DIM, EPS)
    assert q.rank == rank and q.w1.out_features == rank


def test_bottleneck_below_one_unit_is_a_config_error():
    with pytest.raises(ConfigError, match="model.query.bottleneck_ratio"):
        build_query(Query(type="residual_mlp", bottleneck_ratio=0.01), DIM, N_HEADS, HEAD_DIM, EPS)


@pytest.mark.parametrize("key,value", [("activation", "tanh"), ("input_norm", "batch"), ("output_norm", "rmsnorm")])
def test_unknown_knob_is_a_config_error(key, value):
    with pytest.raises(ConfigError, match=f"model.query.{key}"):
        build_query(replace(Query(type="residual_mlp"), **{key: value}), DIM, N_HEADS, HEAD_DIM, EPS)


@pytest.mark.parametrize("qtype", ["identity", "residual", "residual_mlp"])
def test_full_width_types_reject_mismatched_shapes(qtype):
    with pytest.raises(ConfigError, match="model.query.type") as err:
        build_query(Query(type=qtype), DIM, 3, 8, EPS)  # 3*8 = 24 != 32
    assert qtype in str(err.value) and "24" in str(err.value)


def test_unknown_type_suggests_the_closest():
    with pytest.raises(ConfigError) as err:
        build_query(Query(type="residual_mpl"), DIM, N_HEADS, HEAD_DIM, EPS)
    msg = str(err.value)
    assert msg.startswith("model.query.type: unknown 'residual_mpl'; did you mean 'residual_mlp'?")
    assert f"choices: {', '.join(sorted(QUERY_TYPES))})" in msg


def test_unknown_type_without_close_match():
    with pytest.raises(ConfigError, match=r"model.query.type: unknown 'xyz' \(choices: "):
        build_query(Query(type="xyz"), DIM, N_HEADS, HEAD_DIM, EPS)


@pytest.mark.parametrize("qtype,count", [("linear", DIM * DIM), ("identity", 0), ("residual", DIM * DIM),
                                         ("residual_mlp", DIM * DIM + 2 * DIM)])
def test_counts_against_the_formulas(qtype, count):
    assert param_count(Query(type=qtype)) == count


def test_default_init_weights():
    torch.manual_seed(0)
    q = build_query(Query(type="residual_mlp"), 256, 4, 64, EPS)
    q.init_weights(0.02)
    for w in (q.w1.weight, q.w2.weight):
        assert w.mean().abs() < 1e-3
        assert abs(w.std().item() - 0.02) < 0.001
    assert torch.equal(q.input_norm.weight, torch.ones(256))
    assert torch.equal(q.output_norm.weight, torch.ones(256))


def test_non_residual_types_have_no_branch():
    assert not isinstance(make(Query(type="linear")), ResidualBranch)
    assert not isinstance(make(Query(type="identity")), ResidualBranch)


def test_new_type_is_one_class_and_a_decorator(x):
    """The docs' anchored query: (X·W_Q + f(X))/2 needs only __init__ and forward."""
    try:

        @register_query("anchored_test")
        class AnchoredQuery(QueryProjection):
            requires_full_width = True

            def __init__(self, cfg, shape):
                super().__init__(cfg, shape)
                self.w_q = torch.nn.Linear(shape.dim, shape.dim, bias=False)
                self.f = torch.nn.Linear(shape.dim, shape.dim, bias=False)

            def forward(self, x):
                return (self.w_q(x) + torch.tanh(self.f(x))) / 2

        q = make(Query(type="anchored_test"))
        torch.testing.assert_close(q(x), (x @ q.w_q.weight.T + torch.tanh(x @ q.f.weight.T)) / 2)
        assert param_count(Query(type="anchored_test")) == 2 * DIM * DIM
        with pytest.raises(ValueError, match="already registered"):
            register_query("anchored_test")(AnchoredQuery)
    finally:
        QUERY_TYPES.pop("anchored_test", None)


# ---- the contract: what the rest of torchnlq asks of a query type ----

@pytest.mark.parametrize("half", [True, False])
def test_linear_weight_of_the_linear_types(x, half):
    """W with Q(X) = X·Wᵀ, written out from the weights: W_Q, c·I, c·(I + W_Q) with c = 1/2 under
    half_scale, else 1; None for the nonlinear type."""
    eye = torch.eye(DIM, dtype=torch.float32)
    c = 0.5 if half else 1.0
    linear, identity, residual = (make(Query(type=t, half_scale=half)) for t in ("linear", "identity", "residual"))
    expected = {
        "linear": linear.w_q.weight.float(),
        "identity": c * eye,
        "residual": c * (eye + residual.w_q.weight.float()),
    }
    for q in (linear, identity, residual):
        assert isinstance(q, LinearInX)
        w = q.linear_weight()
        assert w.dtype == torch.float32 and not w.requires_grad
        torch.testing.assert_close(w, expected[q.type_name], rtol=0, atol=0)
        torch.testing.assert_close(x.float() @ w.T, q(x).float())
    assert not isinstance(make(Query(type="residual_mlp")), LinearInX)
    assert not isinstance(make(Query(type="anchored")), LinearInX)


def test_residual_branch_and_norm_gains_flags():
    flags = {name: issubclass(cls, ResidualBranch) for name, cls in QUERY_TYPES.items()}
    assert {k: flags[k] for k in ("linear", "identity", "residual", "residual_mlp")} == {
        "linear": False, "identity": False, "residual": True, "residual_mlp": True}
    q = make(Query(type="residual_mlp"))
    assert q.norm_gains() == {"gain_in": q.input_norm, "gain_out": q.output_norm}
    assert make(Query(type="residual_mlp", input_norm="none")).norm_gains().keys() == {"gain_out"}
    assert make(Query(type="residual")).norm_gains() == {}


def test_knobs_must_be_query_fields():
    class Broken(QueryProjection):
        knobs = ("activation", "anchor")

    with pytest.raises(TypeError, match=r"\['anchor'\], which are not \[model.query\] fields"):
        register_query("broken_test")(Broken)
    assert "broken_test" not in QUERY_TYPES


@pytest.mark.parametrize(
    "cfg,ignored",
    [
        (Query(type="linear"), []),
        (Query(type="linear", activation="relu2"), ["activation"]),
        (Query(type="identity", half_scale=False, bottleneck_ratio=0.25), ["bottleneck_ratio"]),
        (Query(type="linear", half_scale=False), ["half_scale"]),
        (Query(type="residual", half_scale=False), []),
        (Query(type="residual", input_norm="layer", output_norm="rms"), ["input_norm", "output_norm"]),
        (Query(type="residual_mlp", activation="relu2", input_norm="none", bottleneck_ratio=1.0, half_scale=False), []),
    ],
)
def test_ignored_knobs(cfg, ignored):
    assert ignored_knobs(cfg) == ignored


def test_extra_repr_shows_the_knobs_read():
    cfg = Query(type="residual_mlp", activation="relu2", bottleneck_ratio=0.25, half_scale=False)
    assert make(cfg).extra_repr() == (
        "type='residual_mlp', dim=32, q_dim=32, activation='relu2', input_norm='rms', output_norm='layer', "
        "bottleneck_ratio=0.25, half_scale=False, rank=8"
    )
    assert make(Query(type="linear", activation="relu2")).extra_repr() == "type='linear', dim=32, q_dim=32"


def test_paper_init_contract():
    """Where the paper's code draws each query's W_Q: in its fused c_attn (PaperQKVRows); f's matrices after c_proj."""
    linear, identity, residual, mlp = (make(Query(type=t)) for t in ("linear", "identity", "residual", "residual_mlp"))
    assert linear.fused_qkv_weight() is linear.w_q.weight and residual.fused_qkv_weight() is residual.w_q.weight
    assert not isinstance(identity, PaperQKVRows) and not isinstance(mlp, PaperQKVRows)
