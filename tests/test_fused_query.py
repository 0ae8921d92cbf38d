"""model.query.fuse_kv: X·[W_K | W_V | diag(g)·W1] in one matmul is the unfused model, same parameters."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from torchnlq.config.job_config import Model, Query
from torchnlq.config.manager import load_job_config
from torchnlq.errors import ConfigError
from torchnlq.models import GPT, ModelArgs, build_model_args
from torchnlq.models.gpt import KVCache
from torchnlq.train.diagnostics import query_diagnostics

pytestmark = pytest.mark.usefixtures("one_torch_thread")


FP32 = dict(rtol=1e-5, atol=1e-5)


def assert_fp32_close(actual: torch.Tensor, expected: torch.Tensor, name: str = "") -> None:
    """Within 1e-5 relative to the tensor's scale: the two paths round differently (one matmul
    instead of two, the gain in the weight instead of on X), so tiny entries get no tighter bound."""
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * max(scale, 1.0),
                               msg=lambda m: f"{name}: {m}")
CASES = list(itertools.product(("rms", "none"), (None, 2), ("rope", "learned")))


def pair(input_norm: str = "rms", n_kv_heads: int | None = None, positions: str = "rope", **query: object):
    """(unfused, fused) tiny GPTs holding the same parameters, gains away from 1 so a lost gain shows."""
    args = ModelArgs(n_layers=2, dim=32, n_heads=4, n_kv_heads=n_kv_heads, vocab_size=48, max_seq_len=32,
                     positions=positions, init_std=0.2,
                     query=Query(type="residual_mlp", input_norm=input_norm, **query))
    torch.manual_seed(0)
    unfused = GPT(args)
    with torch.no_grad():
        for p in unfused.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) + 0.5)
    fused = GPT(replace(args, query=replace(args.query, fuse_kv=True)))
    fused.load_state_dict(unfused.state_dict())
    for layer in fused.layers:
        layer.attn.fuse_min_tokens = 0  # fuse at any size (by default only from 2·kv_dim + r tokens)
    return unfused, fused


def tokens(seq: int = 13) -> torch.Tensor:
    return torch.randint(0, 48, (2, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("input_norm,n_kv,positions", CASES)
def test_outputs_and_gradients_match(input_norm, n_kv, positions):
    unfused, fused = pair(input_norm, n_kv, positions)
    t = tokens()
    out_u, out_f = unfused(t), fused(t)
    assert_fp32_close(out_f, out_u, "logits")
    # A loss that weights every logit differently, so every gradient entry is exercised.
    weights = torch.randn(out_u.shape, generator=torch.Generator().manual_seed(2))
    (out_u * weights).sum().backward()
    (out_f * weights).sum().backward()
    grads_u = {n: p.grad for n, p in unfused.named_parameters()}
    for name, p in fused.named_parameters():
        assert p.grad is not None, name
        assert_fp32_close(p.grad, grads_u[name], name)


def test_state_dict_keys_and_shapes_are_identical():
    unfused, fused = pair()
    su, sf = unfused.state_dict(), fused.state_dict()
    assert list(su) == list(sf)
    assert all(su[k].shape == sf[k].shape for k in su)
    assert [n for n, _ in unfused.named_parameters()] == [n for n, _ in fused.named_parameters()]
    # The fused module really takes the fused path (one matmul d -> 2·kv_dim + r).
    x = torch.zeros(1, 1, 32)
    assert fused.layers[0].attn._fusion_applies(x) and not unfused.layers[0].attn._fusion_applies(x)


def test_default_threshold_fuses_large_forwards_only():
    """By default the fused path needs at least 2·kv_dim + r tokens (here 2·32 + 16 = 80): a
    one-token decode step would copy the weights for nothing. Same function either way."""
    unfused, fused = pair()
    attn = fused.layers[0].attn
    attn.fuse_min_tokens = None
    assert not attn._fusion_applies(torch.zeros(2, 39, 32)) and attn._fusion_applies(torch.zeros(2, 40, 32))
    for layer in fused.layers:
        layer.attn.fuse_min_tokens = None
    t = tokens(32)
    with torch.no_grad():
        assert_fp32_close(fused(t[:, :30]), unfused(t[:, :30]), "below the threshold")
        assert_fp32_close(fused(t), unfused(t), "above the threshold")


@pytest.mark.parametrize("n_kv", [None, 2])
def test_kv_cache_path_with_fusion(n_kv):
    unfused, fused = pair(n_kv_heads=n_kv)
    t = tokens(20)
    with torch.no_grad():
        full = unfused(t)
        cache = KVCache.for_model(fused)
        parts = [fused(t[:, :7], cache), fused(t[:, 7:11], cache)]
        parts += [fused(t[:, i : i + 1], cache) for i in range(11, 20)]
    assert cache.pos == 20
    torch.testing.assert_close(torch.cat(parts, dim=1), full, **FP32)


def test_bf16_autocast_runs_and_stays_close():
    unfused, fused = pair()
    t = tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_u, out_f = unfused(t).float(), fused(t).float()
    assert torch.isfinite(out_f).all()
    torch.testing.assert_close(out_f, out_u, rtol=0.05, atol=0.1)


def test_bf16_parameters_match_the_fp32_model():
    """bf16 weights and activations (FSDP's param_dtype), no autocast: the fused model in bf16 is
    about as far from the fp32 model as the unfused one in bf16 (no extra rounding on the fused path)."""
    unfused, fused = pair()
    t = tokens()
    reference = unfused(t)
    err_u = (unfused.to(torch.bfloat16)(t).float() - reference).abs().max()
    err_f = (fused.to(torch.bfloat16)(t).float() - reference).abs().max()
    assert torch.isfinite(err_f) and err_f <= 2 * err_u + 1e-3 * reference.abs().max()


def test_diagnostics_hooks_see_the_same_query():
    """Diagnostics hook the query module: with fusion it is still called on X and returns Q."""
    unfused, fused = pair()
    t = tokens()
    du, df = query_diagnostics(unfused, t), query_diagnostics(fused, t)
    assert du.keys() == df.keys() and du
    for key in du:
        assert df[key] == pytest.approx(du[key], rel=1e-5, abs=1e-6), key


def test_swapped_linear_falls_back_to_the_unfused_path():
    """The attention does not look at its modules' types: code that swaps a linear (float8)
    switches fusion off from outside, and then the swapped module's own forward runs."""

    class CountingLinear(nn.Linear):
        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            CountingLinear.calls += 1
            return super().forward(x)

    unfused, fused = pair()
    for layer in fused.layers:
        old = layer.attn.kv
        layer.attn.kv = CountingLinear(old.in_features, old.out_features, bias=False)
        layer.attn.kv.weight = old.weight
    t = tokens()
    with torch.no_grad():
        fused(t)
    assert CountingLinear.calls == 0  # still fused: the fused matmul reads kv.weight directly
    for layer in fused.layers:
        layer.attn.disable_kv_fusion()
    torch.testing.assert_close(fused(t), unfused(t), **FP32)
    assert CountingLinear.calls == len(fused.layers)


def _fused_model(**model: object) -> GPT:
    args = ModelArgs(n_layers=2, vocab_size=48, max_seq_len=32, **model)
    torch.manual_seed(0)
    return GPT(args)


@pytest.mark.parametrize(
    "n_heads,n_kv_heads,ratio,swapped",
    [
        # d = 32, r = 16: K,V (32 -> 64) and W1 (32 -> 16) are float8-eligible.
        (4, None, 0.5, {"attn.kv", "attn.query.w1", "attn.query.w2"}),
        # r = 12: W1 stays nn.Linear, but K,V is swapped: still no fusion.
        (4, None, 0.375, {"attn.kv"}),
        # K,V 32 -> 8 and r = 12 are not multiples of 16: only the out-projection is swapped, fusion stays.
        (8, 1, 0.375, set()),
    ],
)
def test_float8_conversion_switches_fusion_off_where_it_swapped(n_heads, n_kv_heads, ratio, swapped):
    pytest.importorskip("torchao")
    from torchnlq.parallel.float8 import convert_to_float8, float8_linear_class

    gpt = _fused_model(dim=32, n_heads=n_heads, n_kv_heads=n_kv_heads,
                       query=Query(type="residual_mlp", bottleneck_ratio=ratio, fuse_kv=True))
    keys = list(gpt.state_dict())
    convert_to_float8(gpt, "tensorwise")
    float8 = {n.split(".", 2)[2] for n, m in gpt.named_modules() if isinstance(m, float8_linear_class())}
    assert float8 & {"attn.kv", "attn.query.w1", "attn.query.w2"} == swapped
    assert "attn.proj" in float8
    assert all(layer.attn.fuse_kv == (not swapped) for layer in gpt.layers)
    assert list(gpt.state_dict()) == keys


@pytest.mark.parametrize("qtype", ["linear", "identity", "residual"])
def test_fuse_kv_on_other_query_types_is_a_config_error(qtype):
    with pytest.raises(ConfigError, match="model.query.fuse_kv") as err:
        ModelArgs(dim=32, n_heads=4, query=Query(type=qtype, fuse_kv=True))
    assert qtype in str(err.value) and "residual_mlp" in str(err.value) and "\n" not in str(err.value)


def test_fuse_kv_with_layer_input_norm_is_a_config_error():
    with pytest.raises(ConfigError, match="model.query.fuse_kv") as err:
        build_model_args(Model(query=Query(type="residual_mlp", input_norm="layer", fuse_kv=True)), 320)
    assert "input_norm" in str(err.value) and "'layer'" in str(err.value)


def test_fuse_kv_from_the_command_line():
    """The option as users set it; layer/rms output norms are both fine (only the input norm matters)."""
    for output_norm in ("layer", "rms", "none"):
        cfg = load_job_config(["--model.query.type=residual_mlp", "--model.query.fuse_kv",
                               f"--model.query.output_norm={output_norm}"])
        args = build_model_args(cfg.model, 320)
        assert args.query.fuse_kv
        # Same parameter count as unfused: the fusion adds no parameter.
        assert args.num_params() == build_model_args(replace(cfg.model, query=replace(cfg.model.query, fuse_kv=False)), 320).num_params()
