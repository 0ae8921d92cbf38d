"""Block options (model.norm, mlp_activation = swiglu, qk_norm, init = depth, Llama-3 RoPE scaling, flavors),
each against its formula written out here or against transformers' own implementation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from torchnlq.config.job_config import Query
from torchnlq.errors import ConfigError
from torchnlq.models import Decoder, ModelArgs
from torchnlq.models.config import Model
from torchnlq.models.family import build_model_args
from torchnlq.models.rope import inverse_frequencies, rope_scaling
from torchnlq.models.counts import num_params
from torchnlq.models import build_model

QUERY_TYPES = ("linear", "identity", "residual", "residual_mlp", "anchored")


def llama_args(**overrides: object) -> ModelArgs:
    base = dict(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, mlp_hidden=48, vocab_size=96, max_seq_len=32,
                positions="rope", norm="rms", mlp_activation="swiglu", qk_norm=True)
    return ModelArgs(**{**base, **overrides})


def seeded(args: ModelArgs, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    model = build_model(args)
    with torch.no_grad():  # gains away from 1, so that a missing gain would show
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model


def rms(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def test_rms_norm_blocks_compute_the_rms_formula():
    model = seeded(llama_args(qk_norm=False))
    x = torch.randn(2, 5, 32)
    for norm in (model.layers[0].ln_1, model.layers[1].ln_2, model.ln_f):
        torch.testing.assert_close(norm(x), rms(x, norm.weight, 1e-5))
    assert not any(name.endswith("ln_1.bias") for name, _ in model.named_parameters())


def test_swiglu_is_down_of_silu_gate_times_up():
    mlp = seeded(llama_args(bias=True)).layers[0].mlp
    x = torch.randn(3, 32)
    gate = x @ mlp.gate.weight.T + mlp.gate.bias
    up = x @ mlp.fc.weight.T + mlp.fc.bias
    expected = (gate * torch.sigmoid(gate) * up) @ mlp.proj.weight.T + mlp.proj.bias
    torch.testing.assert_close(mlp(x), expected)


@pytest.mark.parametrize("qtype", QUERY_TYPES)
def test_qk_norm_attention_against_a_written_out_attention(qtype: str):
    """q = RMSNorm_head(query(x)), k = RMSNorm_head(x·W_K), both rotated, softmax(q·kᵀ/sqrt(hd)) causal, GQA."""
    args = llama_args(query=Query(type=qtype))
    model = seeded(args)
    attn = model.layers[0].attn
    x = torch.randn(2, 6, 32)
    cos, sin = model.rope.span(0, 6)
    hd, h, kvh = args.head_dim, args.n_heads, args.n_kv_heads
    q = attn.query(x).view(2, 6, h, hd)
    k, v = (x @ attn.kv.weight.T).split(kvh * hd, dim=-1)
    k, v = k.view(2, 6, kvh, hd), v.view(2, 6, kvh, hd)
    q, k = rms(q, attn.q_norm.weight, 1e-5), rms(k, attn.k_norm.weight, 1e-5)

    def rotate(t: torch.Tensor) -> torch.Tensor:  # rotate-half: channel i pairs with i + hd/2
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return t * c + torch.cat((-t2, t1), -1) * s

    q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(h // kvh, dim=2), v.repeat_interleave(h // kvh, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(2, 6, h * hd)
    torch.testing.assert_close(attn(x, (cos, sin)), y @ attn.proj.weight.T, rtol=1e-5, atol=1e-6)


def test_qk_norm_makes_the_half_scale_cancel():
    """RMSNorm(q/2) = RMSNorm(q) but for eps: with QK-norm the paper's 1/2 leaves the logits (as documented)."""
    tokens = torch.randint(0, 96, (2, 12))
    logits = []
    for half in (True, False):
        args = llama_args(query=Query(type="residual_mlp", half_scale=half), norm_eps=1e-12)
        logits.append(seeded(args)(tokens))
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
    # Without QK-norm the 1/2 matters: the control.
    without = [seeded(llama_args(qk_norm=False, query=Query(type="residual_mlp", half_scale=h)))(tokens)
               for h in (True, False)]
    assert not torch.allclose(without[0], without[1], atol=1e-3)


def test_depth_init_scales_the_residual_projections_by_block():
    args = llama_args(n_layers=4, dim=256, n_heads=4, n_kv_heads=4, mlp_hidden=256, init="depth", qk_norm=False)
    torch.manual_seed(0)
    model = build_model(args)
    for index, layer in enumerate(model.layers):
        want = 0.02 / math.sqrt(2 * (index + 1))
        for weight in (layer.attn.proj.weight, layer.mlp.proj.weight):
            assert weight.std().item() == pytest.approx(want, rel=0.03)
        for weight in (layer.attn.kv.weight, layer.mlp.gate.weight, layer.mlp.fc.weight):
            assert weight.std().item() == pytest.approx(0.02, rel=0.03)
    torch.manual_seed(0)
    flat = build_model(llama_args(n_layers=4, dim=256, n_heads=4, n_kv_heads=4, mlp_hidden=256, qk_norm=False))
    assert flat.layers[0].attn.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.03)


def test_init_is_unchanged_for_the_gpt2_block():
    """The default scheme draws what it always drew: nanoGPT's stds, every block at 1/sqrt(2 n_layers)."""
    args = ModelArgs(n_layers=3, dim=256, n_heads=4, mlp_hidden=256)
    torch.manual_seed(0)
    model = build_model(args)
    for layer in model.layers:
        assert layer.mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(6), rel=0.03)
        assert layer.mlp.gate is None and layer.attn.q_norm is None


@pytest.mark.parametrize("options", [dict(zip(("norm", "mlp_activation", "qk_norm", "bias"), values)) for values in
                                     itertools.product(("layer", "rms"), ("gelu", "swiglu"), (False, True),
                                                       (False, True))])
@pytest.mark.parametrize("qtype", QUERY_TYPES)
def test_every_block_option_with_every_query_type_counts_and_runs(qtype: str, options: dict):
    """The shape formula (ModelArgs.num_params) equals the built model's tensors; meta + init equals eager."""
    args = llama_args(query=Query(type=qtype), tie_embeddings=False, **options)
    torch.manual_seed(3)
    model = build_model(args)
    assert sum(p.numel() for p in model.parameters()) == num_params(args)
    with torch.device("meta"):
        meta = build_model(args)
    meta.to_empty(device="cpu")
    torch.manual_seed(3)
    meta.init_weights()
    tokens = torch.randint(0, 96, (2, 10))
    torch.testing.assert_close(meta(tokens), model(tokens), rtol=0, atol=0)


def test_the_kv_cache_decodes_what_the_full_forward_computes():
    model = seeded(llama_args(rope_scaling_factor=8.0, rope_original_max_seq_len=8))
    tokens = torch.randint(0, 96, (1, 12))
    from torchnlq.models.layers import KVCache

    cache = KVCache.for_model(model)
    steps = [model(tokens[:, :5], cache=cache)] + [model(tokens[:, i:i + 1], cache=cache) for i in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), model(tokens), rtol=1e-5, atol=1e-5)


def test_llama3_frequency_scaling_written_out():
    """Meta's rule: wavelengths beyond original/low divided by the factor, below original/high kept, between
    interpolated by smooth = (original/wavelength - low)/(high - low)."""
    args = llama_args(head_dim=None, dim=64, n_heads=2, rope_theta=500000.0, rope_scaling_factor=32.0,
                      rope_original_max_seq_len=8192, max_seq_len=64)
    scaled = inverse_frequencies(args.head_dim, args.rope_theta, rope_scaling(args))
    for base in (1.0 / 500000.0 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32)).tolist():
        wavelength = 2 * math.pi / base
        if wavelength < 8192 / 4:
            want = base
        elif wavelength > 8192 / 1:
            want = base / 32
        else:
            smooth = (8192 / wavelength - 1) / (4 - 1)
            want = (1 - smooth) * base / 32 + smooth * base
        assert any(math.isclose(want, got, rel_tol=1e-12) for got in scaled.tolist()), want
    assert rope_scaling(llama_args()) is None


@pytest.mark.integration
def test_llama3_frequency_scaling_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    args = llama_args(dim=128, n_heads=2, n_kv_heads=1, rope_theta=500000.0, rope_scaling_factor=32.0,
                      rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_seq_len=8192)
    config = transformers.LlamaConfig(hidden_size=128, num_attention_heads=2, head_dim=64, rope_theta=500000.0,
                                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 8192})
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = inverse_frequencies(args.head_dim, args.rope_theta, rope_scaling(args))
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("flavor, hidden", [("llama_debug", 768), ("llama_gpt_small", 2080), ("llama3_1b", 8192)])
def test_swiglu_hidden_follows_llamas_rule(flavor: str, hidden: int):
    """hidden = multiple_of * ceil(int(2/3 * ratio * dim) / multiple_of) (Meta's FeedForward)."""
    args = build_model_args(Model(flavor=flavor), 2048)  # the flavor carries SwiGLU and its multiple
    ratio = {"llama_debug": 4.0, "llama_gpt_small": 4.0625, "llama3_1b": 6.0}[flavor]
    multiple = 32 if flavor == "llama_gpt_small" else 256
    assert args.mlp_hidden == multiple * math.ceil(int(2 * ratio * args.dim / 3) / multiple) == hidden


def test_a_flavors_kv_heads_do_not_follow_an_overridden_head_count():
    assert build_model_args(Model(flavor="llama3_1b"), 256).n_kv_heads == 8
    assert build_model_args(Model(flavor="llama3_1b", n_heads=16), 256).n_kv_heads == 16


@pytest.mark.integration
def test_the_llama3_1b_flavor_has_llama_3_2_1bs_parameters():
    """Against transformers' LlamaForCausalLM at Llama 3.2 1B's published config, built on the meta device."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, max_position_embeddings=131072)
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(config)
    theirs = sum(p.numel() for p in hf.parameters())
    assert num_params(build_model_args(Model(flavor="llama3_1b"), 128256)) == theirs  # the flavor alone


def test_llama3_1b_from_its_flavor_alone_is_a_llama_block():
    """RMSNorm, SwiGLU, RoPE with Llama 3's scaling, without a config saying so; a [model] key still overrides."""
    args = build_model_args(Model(flavor="llama3_1b"), 128256)
    with torch.device("meta"):
        model = build_model(args)
    block = model.layers[0]
    assert isinstance(block.ln_1, torch.nn.RMSNorm) and isinstance(model.ln_f, torch.nn.RMSNorm)
    assert block.mlp.gate is not None and model.pos_emb is None and model.rope is not None
    assert (args.rope_theta, args.rope_scaling_factor, args.rope_original_max_seq_len) == (500000.0, 32.0, 8192)
    assert build_model_args(Model(flavor="llama3_1b", norm="layer"), 128256).norm == "layer"
    assert build_model_args(Model(flavor="gpt_small"), 50304).norm == "layer"  # GPT-2's block by default


def test_options_that_cannot_work_together_are_one_line():
    with pytest.raises(ConfigError, match="model.init='paper'"):
        llama_args(init="paper")
    with pytest.raises(ConfigError, match="model.rope_scaling_factor=8.0 scales RoPE frequencies"):
        llama_args(positions="learned", rope_scaling_factor=8.0)
    with pytest.raises(ConfigError, match="model.norm"):
        llama_args(norm="batch")
    assert ModelArgs.from_dict(llama_args().to_dict()) == llama_args()
    assert set(ModelArgs().to_dict()) == set(ModelArgs.from_dict(ModelArgs().to_dict()).to_dict())
    assert "norm" not in ModelArgs().to_dict()  # a GPT-2 block's record (and resume fingerprint) is unchanged
