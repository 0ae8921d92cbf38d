"""Decoder, ModelArgs and the flavor registry against references written out in this file."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from torchnlq.config.job_config import JobConfig, Model, Query
from torchnlq.errors import ConfigError
from torchnlq.data.tokenizer import BASE_VOCAB_SIZE, padded_vocab_size
from torchnlq.models import FLAVORS, Decoder, ModelArgs, build_model, build_model_args
from torchnlq.models.rope import RotaryEmbedding, apply_rotary
from torchnlq.models.counts import num_params, flops_per_token

QUERY_TYPE_NAMES = ("linear", "identity", "residual", "residual_mlp")
EPS = 1e-5


def tiny(**kw) -> ModelArgs:
    base = dict(n_layers=2, dim=32, n_heads=4, vocab_size=48, max_seq_len=24)
    base.update(kw)
    return ModelArgs(**base)


def paper_model(flavor: str, qtype: str) -> ModelArgs:
    return build_model_args(Model(flavor=flavor, query=Query(type=qtype)), 50304)


# ---------------------------------------------------------------- independent reference forward

def ln(x, g):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt((x - mu).pow(2).mean(-1, keepdim=True) + EPS) * g


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def ref_query(qtype, sd, p, h):
    """The query as the paper's code computes it: never halved (the 1/2 is in the attention scale)."""
    if qtype == "linear":
        return h @ sd[p + "w_q.weight"].T
    if qtype == "identity":
        return h
    if qtype == "residual":
        return h + h @ sd[p + "w_q.weight"].T
    # the paper's f: LN(GELU(RMSNorm(h) W1) W2), query h + f
    r = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * sd[p + "input_norm.weight"]
    f = ln(gelu(r @ sd[p + "w1.weight"].T) @ sd[p + "w2.weight"].T, sd[p + "output_norm.weight"])
    return h + f


def ref_attention_scale(query: Query, hd: int) -> float:
    """The paper's code: 1/(2 sqrt(hd)) for every query that contains X (half_scale), else 1/sqrt(hd)."""
    return 1 / (2 * math.sqrt(hd)) if query.type != "linear" and query.half_scale else 1 / math.sqrt(hd)


def ref_rotate(x, theta):
    """Pair channel i with i + hd/2 and rotate by angle m * theta^(-2i/hd) at position m. x: [B, H, T, hd]."""
    hd, t = x.shape[-1], x.shape[-2]
    half = hd // 2
    ang = torch.arange(t, dtype=torch.float64)[:, None] * theta ** (-2 * torch.arange(half, dtype=torch.float64) / hd)
    c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1)


def ref_logits(model: Decoder, tokens):
    a, sd = model.args, model.state_dict()
    B, T = tokens.shape
    H, Hkv, hd = a.n_heads, a.n_kv_heads, a.head_dim
    x = sd["tok_emb.weight"][tokens]
    if a.positions == "learned":
        x = x + sd["pos_emb.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(a.n_layers):
        p = f"layers.{i}."
        h = ln(x, sd[p + "ln_1.weight"])
        q = ref_query(a.query.type, sd, p + "attn.query.", h).reshape(B, T, H, hd).transpose(1, 2)
        kv = h @ sd[p + "attn.kv.weight"].T
        k = kv[..., : Hkv * hd].reshape(B, T, Hkv, hd).transpose(1, 2)
        v = kv[..., Hkv * hd :].reshape(B, T, Hkv, hd).transpose(1, 2)
        if a.positions == "rope":
            q, k = ref_rotate(q, a.rope_theta), ref_rotate(k, a.rope_theta)
        group = H // Hkv  # query head j reads kv head j // group
        k, v = k[:, [j // group for j in range(H)]], v[:, [j // group for j in range(H)]]
        scores = (q @ k.transpose(-1, -2)) * ref_attention_scale(a.query, hd)
        att = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
        x = x + att.transpose(1, 2).reshape(B, T, H * hd) @ sd[p + "attn.proj.weight"].T
        h = ln(x, sd[p + "ln_2.weight"])
        x = x + gelu(h @ sd[p + "mlp.fc.weight"].T) @ sd[p + "mlp.proj.weight"].T
    x = ln(x, sd["ln_f.weight"])
    return x @ (sd["tok_emb.weight"] if a.tie_embeddings else sd["lm_head.weight"]).T


def randomize_gains(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) + 0.5)


REF_CASES = [
    (*case, True) for case in itertools.product(QUERY_TYPE_NAMES, ("learned", "rope"), (None, 2, 1), (True, False))
]
# half_scale = false: the identity-term types at the plain 1/sqrt(head_dim).
REF_CASES += [(qtype, "learned", None, True, False) for qtype in ("identity", "residual", "residual_mlp")]


@pytest.mark.parametrize("qtype,positions,n_kv,tie,half", REF_CASES)
def test_forward_matches_reference(qtype, positions, n_kv, tie, half):
    torch.manual_seed(0)
    query = Query(type=qtype, half_scale=half)
    model = build_model(tiny(query=query, positions=positions, n_kv_heads=n_kv, tie_embeddings=tie, init_std=0.2))
    model = model.double()
    if model.rope is not None:
        model.rope.init_weights()  # float64 tables, to compare at float64 precision
    randomize_gains(model)
    tokens = torch.randint(0, 48, (2, 11))
    logits = model(tokens)
    assert logits.shape == (2, 11, 48)
    torch.testing.assert_close(logits, ref_logits(model, tokens), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- parameter and FLOP counts

@pytest.mark.parametrize(
    "flavor,qtype,expected",
    [
        ("gpt_small", "linear", 84_953_856),
        ("gpt_small", "residual_mlp", 84_972_288),
        ("gpt_small", "identity", 77_875_968),
        ("gpt_small_mlp4_75", "linear", 95_570_688),
        # By hand, linear query, no biases: a block is 12·d² + 2·d (W_Q d², K/V 2·d², out d², MLP 2·d·4d,
        # two norm gains), plus the final norm's d. GPT-3 paper (Table 2.1) shapes "Medium" (350M) and
        # "Large" (760M): with the (50304 + 1024)·d embeddings these come to 354.6M and 758.4M.
        ("gpt_medium", "linear", 24 * (12 * 1024**2 + 2 * 1024) + 1024),  # 302_040_064
        ("gpt_large", "linear", 24 * (12 * 1536**2 + 2 * 1536) + 1536),  # 679_552_512
    ],
)
def test_paper_non_embedding_counts(flavor, qtype, expected):
    args = paper_model(flavor, qtype)
    with torch.device("meta"):
        model = build_model(args)
    assert model.num_params(non_embedding=True) == expected
    assert num_params(args, non_embedding=True) == expected
    d = model.tok_emb.weight.shape[1]
    assert num_params(args) == sum(p.numel() for p in model.parameters()) == expected + (50304 + 1024) * d


@pytest.mark.parametrize("flavor,qtype", list(itertools.product(FLAVORS, QUERY_TYPE_NAMES)))
def test_num_params_matches_model_for_flavors(flavor, qtype):
    args = paper_model(flavor, qtype)
    with torch.device("meta"):
        model = build_model(args)
    assert num_params(args) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "qtype,tie,positions,n_kv,mlp_hidden",
    list(itertools.product(QUERY_TYPE_NAMES, (True, False), ("learned", "rope"), (None, 1, 2), (None, 80))),
)
def test_num_params_matches_model_small(qtype, tie, positions, n_kv, mlp_hidden):
    args = tiny(query=Query(type=qtype), tie_embeddings=tie, positions=positions, n_kv_heads=n_kv, mlp_hidden=mlp_hidden)
    with torch.device("meta"):
        model = build_model(args)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once
    assert num_params(args) == total
    embeddings = model.tok_emb.weight.numel() + (model.pos_emb.weight.numel() if model.pos_emb is not None else 0)
    assert num_params(args, non_embedding=True) == total - embeddings
    assert ("lm_head.weight" in dict(model.named_parameters())) == (not tie)


def test_flops_per_token_gpt_small():
    d, L, V, H, hd, T = 768, 12, 50304, 12, 64, 1024
    block = 2 * d + d * d + d * 2 * d + d * d + 2 * d * 4 * d  # ln_1, W_Q, K/V, out, ln_2, MLP
    n = L * block + d + V * d  # + final norm + LM head matmul (tied)
    expected = 6 * n + 12 * L * H * hd * T
    assert flops_per_token(paper_model("gpt_small", "linear"), T) == expected == 854_770_176
    # residual_mlp: W1 + W2 = d² like W_Q, plus two gains per block.
    assert flops_per_token(paper_model("gpt_small", "residual_mlp"), T) == expected + 6 * L * 2 * d
    # An untied head is already a non-embedding parameter: counted once, same FLOPs.
    untied = build_model_args(Model(flavor="gpt_small", tie_embeddings=False), 50304)
    assert flops_per_token(untied, T) == expected


# ---------------------------------------------------------------- attention behaviour

@pytest.mark.parametrize("qtype,positions", list(itertools.product(QUERY_TYPE_NAMES, ("learned", "rope"))))
def test_causal(qtype, positions):
    torch.manual_seed(0)
    model = build_model(tiny(query=Query(type=qtype), positions=positions, n_kv_heads=2))
    tokens = torch.randint(0, 48, (2, 16))
    t = 9
    changed = tokens.clone()
    changed[:, t] = (changed[:, t] + 1) % 48
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
    assert (after[:, t:] - before[:, t:]).abs().amax(-1).min() > 1e-6  # every later position sees it


def test_gqa_equals_multi_head_with_repeated_kv_heads():
    torch.manual_seed(0)
    gqa = build_model(tiny(n_heads=4, n_kv_heads=2, init_std=0.2, query=Query(type="residual_mlp")))
    mha = build_model(tiny(n_heads=4, n_kv_heads=4, query=Query(type="residual_mlp")))
    hd, dim = 8, 32
    sd = gqa.state_dict()
    for i in range(2):
        w = sd[f"layers.{i}.attn.kv.weight"]  # [2 * 2 * hd, dim]: K heads, then V heads
        k, v = w.view(2, 2, hd, dim).unbind(0)
        sd[f"layers.{i}.attn.kv.weight"] = torch.cat(
            (k.repeat_interleave(2, dim=0).reshape(-1, dim), v.repeat_interleave(2, dim=0).reshape(-1, dim))
        )
    mha.load_state_dict(sd)
    tokens = torch.randint(0, 48, (2, 12))
    torch.testing.assert_close(gqa(tokens), mha(tokens))


def test_unset_kv_heads_is_multi_head():
    torch.manual_seed(3)
    a = build_model(tiny(n_kv_heads=None))
    torch.manual_seed(3)
    b = build_model(tiny(n_kv_heads=4))
    tokens = torch.randint(0, 48, (1, 10))
    assert a.args.n_kv_heads == 4
    assert torch.equal(a(tokens), b(tokens))


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_gqa_and_mqa_shapes(n_kv):
    model = build_model(tiny(n_heads=4, n_kv_heads=n_kv))
    assert model.layers[0].attn.kv.weight.shape == (2 * n_kv * 8, 32)
    assert model(torch.randint(0, 48, (3, 7))).shape == (3, 7, 48)


def test_rope_depends_only_on_relative_position():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 64, 10000.0)
    rope.init_weights()
    cos, sin = rope.span(0, 64)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        return (apply_rotary(q, cos[m : m + 1], sin[m : m + 1]) * apply_rotary(k, cos[n : n + 1], sin[n : n + 1])).sum()

    for m, n, s in [(3, 1, 5), (10, 10, 20), (0, 7, 40), (30, 2, 31)]:
        torch.testing.assert_close(score(m, n), score(m + s, n + s), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(score(5, 1), score(5, 2))
    torch.testing.assert_close(apply_rotary(q, cos[:1], sin[:1]), q)  # position 0 is no rotation
    assert "cos" not in rope.state_dict()  # tables are recomputed, never checkpointed


# ---------------------------------------------------------------- init

def test_init_statistics():
    torch.manual_seed(0)
    L = 4
    model = build_model(ModelArgs(n_layers=L, dim=256, n_heads=4, vocab_size=512, max_seq_len=256,
                          query=Query(type="residual_mlp")))
    residual_std = 0.02 / math.sqrt(2 * L)
    for name, p in model.named_parameters():
        if p.ndim == 1:
            assert torch.equal(p, torch.ones_like(p)), name
            continue
        expected = residual_std if name.endswith(("attn.proj.weight", "mlp.proj.weight")) else 0.02
        assert abs(p.std().item() / expected - 1) < 0.05, (name, p.std().item(), expected)
        assert abs(p.mean().item()) < expected * 0.05, name


@pytest.mark.parametrize("positions,tie", [("learned", True), ("rope", False)])
def test_meta_init_equals_eager_init(positions, tie):
    args = tiny(positions=positions, tie_embeddings=tie, query=Query(type="residual_mlp"), n_kv_heads=2)
    torch.manual_seed(7)
    eager = build_model(args)
    with torch.device("meta"):
        lazy = build_model(args)
    assert all(p.is_meta for p in lazy.parameters())
    lazy.to_empty(device="cpu")
    torch.manual_seed(7)
    lazy.init_weights()
    eager_state, lazy_state = eager.state_dict(), lazy.state_dict()
    assert eager_state.keys() == lazy_state.keys()
    for key in eager_state:
        assert torch.equal(eager_state[key], lazy_state[key]), key
    for (name, a), (_, b) in zip(eager.named_buffers(), lazy.named_buffers()):
        assert torch.equal(a, b), name  # the non-persistent RoPE tables too
    tokens = torch.randint(0, 48, (2, 9))
    assert torch.equal(eager(tokens), lazy(tokens))


def test_init_weights_is_reproducible_and_resets():
    torch.manual_seed(1)
    model = build_model(tiny())
    first = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    torch.manual_seed(1)
    model.init_weights()
    for k, v in model.state_dict().items():
        assert torch.equal(v, first[k]), k


# ---------------------------------------------------------------- misc behaviour

def test_too_long_sequence_raises():
    model = build_model(tiny(max_seq_len=8))
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_bf16_autocast_with_rope_and_gqa():
    model = build_model(tiny(positions="rope", n_kv_heads=1, query=Query(type="residual_mlp")))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.randint(0, 48, (2, 10))).shape == (2, 10, 48)


@pytest.mark.parametrize("qtype", QUERY_TYPE_NAMES)
def test_overfits_one_batch(qtype):
    torch.manual_seed(0)
    model = build_model(tiny(query=Query(type=qtype)))
    tokens = torch.randint(0, 48, (4, 17))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 3.5  # ~ln(48) at init
    assert losses[-1] < 0.3 * losses[0], losses


# ---------------------------------------------------------------- registry and config errors

def test_overrides():
    cfg = Model(flavor="gpt_small", n_layers=3, dim=256, n_heads=8, n_kv_heads=2, max_seq_len=512, vocab_size=1000,
                tie_embeddings=False, positions="rope", rope_theta=500.0, norm_eps=1e-6, init_std=0.01,
                query=Query(type="residual_mlp", activation="relu2"))
    args = build_model_args(cfg, 50304)
    assert (args.n_layers, args.dim, args.n_heads, args.n_kv_heads, args.head_dim) == (3, 256, 8, 2, 32)
    assert (args.mlp_hidden, args.max_seq_len, args.vocab_size) == (1024, 512, 1000)  # mlp follows the new dim
    assert (args.tie_embeddings, args.positions, args.rope_theta, args.norm_eps, args.init_std) == (
        False, "rope", 500.0, 1e-6, 0.01)
    cfg.query.activation = "silu"  # editing the config afterwards does not change the args
    assert args.query.activation == "relu2"
    assert build_model_args(Model(mlp_ratio=3.0), 320).mlp_hidden == 3 * 128
    assert build_model_args(Model(mlp_ratio=3.0, mlp_hidden=100), 320).mlp_hidden == 100


@pytest.mark.parametrize("tokenizer", sorted(BASE_VOCAB_SIZE))
@pytest.mark.parametrize("multiple", [1, 64, 100])
def test_padded_vocab_size_is_the_smallest_multiple_that_holds_every_token(tokenizer, multiple):
    padded = padded_vocab_size(tokenizer, multiple)
    base = BASE_VOCAB_SIZE[tokenizer]
    assert padded % multiple == 0 and base <= padded < base + multiple


@pytest.mark.parametrize(
    "cfg,message",
    [
        (Model(flavor="gpt_small", n_heads=5), "model.n_heads=5 does not divide model.dim=768"),
        (Model(n_heads=4, n_kv_heads=3), "model.n_kv_heads=3 must be in 1..4 and divide model.n_heads=4"),
        (Model(n_heads=4, n_kv_heads=8), "model.n_kv_heads=8"),
        (Model(flavor="gpt_smal"), "model.flavor: unknown 'gpt_smal'; did you mean 'gpt_small'?"),
        (Model(query=Query(type="residual-mlp")), "model.query.type: unknown 'residual-mlp'; did you mean 'residual_mlp'?"),
        (Model(dim=36, n_heads=4, positions="rope"), "model.positions='rope' needs an even head_dim"),
        (Model(query=Query(type="residual_mlp", bottleneck_ratio=0.001)), "model.query.bottleneck_ratio"),
        (Model(init="papr"), "model.init: unknown 'papr'; did you mean 'paper'?"),
    ],
)
def test_config_errors(cfg, message):
    with pytest.raises(ConfigError) as err:
        build_model_args(cfg, 320)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["--model.query.type=residual_mlp"],
    ["--model.query.type=residual_mlp", "--model.query.layers=1", "--model.tie_embeddings=false",
     "--model.bias=true", "--model.qk_norm=true", "--model.positions=rope", "--model.n_kv_heads=2"],
    ["--model.query.type=identity", "--model.mlp_activation=swiglu", "--model.norm=rms"],
])
def test_summary_splits_the_parameters_by_component_and_against_a_linear_query(overrides):
    """model_summary's params_* lines against a real model's parameters, grouped by name here."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.summary import summarize
    from torchnlq.train.preflight import check_job_config

    def built_counts(extra: list[str]) -> dict[str, int]:
        model = build_model(check_job_config(load_job_config(["--data.tokenizer=byte", *extra])))
        counts = dict.fromkeys(["embeddings", "attention_query", "attention_kv_out", "mlp", "norms", "head"], 0)
        for name, p in model.named_parameters():  # a tied head is the embedding: named once
            part = name.split(".")
            local = ".".join(part[2:]) if part[0] == "layers" else name
            if part[0] in ("tok_emb", "pos_emb"):
                key = "embeddings"
            elif part[0] == "lm_head":
                key = "head"
            elif local.startswith(("ln_", "attn.q_norm", "attn.k_norm")):
                key = "norms"
            elif local.startswith(("attn.query", "attn.q_bias")):
                key = "attention_query"
            elif local.startswith("attn."):
                key = "attention_kv_out"
            else:
                assert local.startswith("mlp."), name
                key = "mlp"
            counts[key] += p.numel()
        return counts

    lines = dict(line.split(": ", 1) for line in summarize(load_job_config(["--data.tokenizer=byte", *overrides])))
    shown = {key: int(lines[f"params_{key}"].split()[0].replace(",", "")) for key in built_counts([])}
    expected = built_counts(overrides)
    assert shown == expected
    linear = sum(built_counts([*overrides, "--model.query.type=linear"]).values())
    difference = lines["params_vs_linear_query"].split()[0]
    assert int(difference.replace(",", "")) == sum(expected.values()) - linear and difference[0] in "+-"
    assert f"has {linear:,})" in lines["params_vs_linear_query"]


@pytest.mark.parametrize("qtype", ["identity", "residual", "residual_mlp"])
def test_identity_like_query_on_mismatched_shape(qtype):
    with pytest.raises(ConfigError, match=f"model.query.type='{qtype}' needs n_heads\\*head_dim == dim"):
        ModelArgs(dim=64, n_heads=3, head_dim=16, query=Query(type=qtype))
    ModelArgs(dim=64, n_heads=3, head_dim=16, query=Query(type="linear"))  # linear does not care


def test_summary():
    from torchnlq.train.summary import main, summarize

    cfg = JobConfig()
    cfg.model.flavor, cfg.model.query.type, cfg.training.seq_len = "gpt_small", "residual_mlp", 1024
    lines = dict(line.split(": ", 1) for line in summarize(cfg))
    assert lines["layers.*.attn.query.w1.weight"] == "(384, 768)"
    assert lines["non_embedding_params"] == "84,972,288"
    assert lines["total_params"] == f"{84_972_288 + (50304 + 1024) * 768:,}"
    assert lines["flops_per_token"] == f"{flops_per_token(paper_model('gpt_small', 'residual_mlp'), 1024):,}"
    assert main(["--model.flavor=gpt_smal"]) == 2
