"""The query-type examples of docs/extending.md, run exactly as written there.

The ```python blocks that define ``AnchoredMLPQuery`` and ``FusedAnchoredMLPQuery``
are taken from the markdown file and executed, so a change to the docs that breaks
them fails here. Checked against Q(X) = (X·W_Qᵀ + f(X)) / 2 written out by hand
from the module's weights, with f(X) = LN(GELU(RMSNorm(X)·W1ᵀ)·W2ᵀ) (the defaults).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from helpers import REPO_ROOT
from torchnlq.config.job_config import Model, Query
from torchnlq.errors import ConfigError
from torchnlq.models import GPT, ModelArgs, build_model_args
from torchnlq.models.query import QUERY_TYPES, ResidualMLPQuery, register_query

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOC = REPO_ROOT / "docs" / "extending.md"
EPS = 1e-5
DIM, HEADS, VOCAB, BATCH = 32, 4, 48, 2
# The default fused-path threshold (Attention.fuse_min_tokens = None) is the fused weight's
# row count, 2·kv_dim + r = 2·32 + 16 = 80 tokens: BATCH x 40 reaches it.
FUSED_SEQ = 40


def doc_block(class_name: str) -> str:
    """The one ```python block of docs/extending.md that defines ``class_name``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    found = [b for b in blocks if re.search(rf"^class {class_name}\(", b, flags=re.MULTILINE)]
    assert len(found) == 1, f"docs/extending.md should define {class_name} in one python block"
    return found[0]


@pytest.fixture
def docs() -> Iterator[SimpleNamespace]:
    """Both docs classes, registered as the docs register them; QUERY_TYPES restored afterwards."""
    before = dict(QUERY_TYPES)
    namespace = {"torch": torch, "nn": nn, "register_query": register_query, "ResidualMLPQuery": ResidualMLPQuery}
    try:
        exec(doc_block("AnchoredMLPQuery"), namespace)
        exec(doc_block("FusedAnchoredMLPQuery"), namespace)
        yield SimpleNamespace(**namespace)
    finally:
        QUERY_TYPES.clear()
        QUERY_TYPES.update(before)


# ---- independent reference: plain tensor ops, from the module's weights ----

def ref_anchored(query: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(X·W_Qᵀ + LN(GELU(RMSNorm(X)·W1ᵀ)·W2ᵀ)) / 2, exact-erf GELU, norms with gains and no bias."""
    g_in, g_out = query.input_norm.weight, query.output_norm.weight
    h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g_in @ query.w1.weight.T
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2))) @ query.w2.weight.T
    f = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + EPS) * g_out
    return (x @ query.w_q.weight.T + f) / 2


def model_args(query_type: str, fuse_kv: bool = False) -> ModelArgs:
    return ModelArgs(n_layers=2, dim=DIM, n_heads=HEADS, vocab_size=VOCAB, max_seq_len=64, init_std=0.2,
                     query=Query(type=query_type, fuse_kv=fuse_kv))


def build(args: ModelArgs) -> GPT:
    """A tiny GPT with norm gains away from 1, so that a lost gain would show."""
    torch.manual_seed(0)
    model = GPT(args)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) + 0.5)
    return model


def tokens(seq: int = FUSED_SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, seq), generator=torch.Generator().manual_seed(1))


def run_capturing_query(model: GPT, toks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, X, Q(X)) with X and Q(X) seen by layer 0's query inside the real forward."""
    seen = {}

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        seen["x"], seen["q"] = args[0], output

    handle = model.layers[0].attn.query.register_forward_hook(hook)
    try:
        out = model(toks)
    finally:
        handle.remove()
    return out, seen["x"], seen["q"]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """fp32, relative to the tensor's scale: the fused path rounds differently (one matmul, gain in the weight)."""
    scale = max(expected.abs().max().item(), 1.0)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{name}: {m}")


def test_anchored_example_matches_its_formula(docs):
    args = model_args("anchored_mlp")
    model = build(args)
    query = model.layers[0].attn.query
    assert isinstance(query, docs.AnchoredMLPQuery)
    # Its analytic count (the docs' count_params override) is what the model allocates.
    assert args.num_params() == model.num_params()
    assert "layers.0.attn.query.w_q.weight" in model.state_dict()
    # Enough tokens for the fused path, had fusion been on: the unfused forward is used regardless.
    assert not model.layers[0].attn._fusion_applies(torch.zeros(BATCH, FUSED_SEQ, DIM))
    with torch.no_grad():
        _, x, q = run_capturing_query(model, tokens())
        assert_close(q, ref_anchored(query, x), "Q(X)")


def test_anchored_example_with_fuse_kv_is_a_config_error(docs):
    """It overrides forward without a ``fused`` argument: refused when the config is checked."""
    assert not docs.AnchoredMLPQuery.supports_fuse_kv
    checks = (
        lambda: model_args("anchored_mlp", fuse_kv=True),
        lambda: build_model_args(Model(dim=DIM, n_heads=HEADS, query=Query(type="anchored_mlp", fuse_kv=True)), VOCAB),
    )
    for check in checks:
        with pytest.raises(ConfigError, match="model.query.fuse_kv") as err:
            check()
        message = str(err.value)
        assert "'anchored_mlp'" in message and "set model.query.fuse_kv = false" in message and "\n" not in message


def test_fusable_anchored_example_equals_unfused(docs):
    """The docs' opt-in: supports_fuse_kv and forward(x, fused). Same outputs and gradients as unfused."""
    unfused = build(model_args("anchored_mlp_fused"))
    fused = GPT(replace(unfused.args, query=replace(unfused.args.query, fuse_kv=True)))
    fused.load_state_dict(unfused.state_dict())
    toks = tokens()
    assert fused.layers[0].attn._fusion_applies(torch.zeros(BATCH, FUSED_SEQ, DIM))  # default threshold
    out_u, x_u, q_u = run_capturing_query(unfused, toks)
    out_f, x_f, q_f = run_capturing_query(fused, toks)
    with torch.no_grad():
        assert_close(q_u, ref_anchored(unfused.layers[0].attn.query, x_u), "unfused Q(X)")
        assert_close(q_f, ref_anchored(fused.layers[0].attn.query, x_f), "fused Q(X)")
    assert_close(out_f, out_u, "logits")
    weights = torch.randn(out_u.shape, generator=torch.Generator().manual_seed(2))
    (out_u * weights).sum().backward()
    (out_f * weights).sum().backward()
    grads_u = dict(unfused.named_parameters())
    for name, p in fused.named_parameters():
        assert p.grad is not None, name
        assert_close(p.grad, grads_u[name].grad, name)
