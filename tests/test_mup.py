"""µP (models/mup.py): the standard model at the base width, the rules away from it, against formulas written here.

- At its base width a µP model is the standard one bit for bit (weights and logits), for every query type, both
  families, tied and untied heads.
- Wider: the hidden matrices are the standard draws times 1/sqrt(m), the embeddings and gains the standard ones;
  the forward is a hand-written GPT-2 forward with µP's multipliers and attention scale; the optimizer's groups
  carry AdamW's 1/m and Muon's 1/sqrt(m) (or 1) on the hidden matrices only, with lr x wd kept.
- The mistakes are one ConfigError line each.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torchnlq.config.job_config import Optimizer, OptimizerGroup
from torchnlq.models import QUERY_TYPES, ModelArgs, build_model, register_query
from torchnlq.models.config import Query
from torchnlq.models.errors import ConfigError
from torchnlq.models.moe.config import MoE
from torchnlq.models.mup import fan_in_multipliers
from torchnlq.models.query import QueryProjection
from torchnlq.train.optim import plan_groups

SIZES = dict(n_layers=2, n_heads=4, vocab_size=64, max_seq_len=16)
TOKENS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))


def multipliers(args: ModelArgs) -> dict[str, float]:
    """The hidden matrices' fan-in multipliers of the model ``args`` describes (built on meta)."""
    with torch.device("meta"):
        return fan_in_multipliers(build_model(args))


def model(dim: int, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelArgs(**SIZES, dim=dim, **kw)).eval()


CASES = [dict(query=Query(type=name)) for name in ("linear", "identity", "residual", "residual_mlp", "anchored")] + [
    dict(query=Query(type="residual_mlp"), tie_embeddings=False),
    dict(query=Query(type="linear"), norm="rms", mlp_activation="swiglu", positions="rope", qk_norm=True),
    dict(family="moe", query=Query(type="residual_mlp"), moe=MoE(n_experts=4, top_k=2, expert_hidden=32)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values())[:60])
def test_at_its_base_width_a_mup_model_is_the_standard_one_bit_for_bit(case: dict) -> None:
    sp, mup = model(64, **case), model(64, parametrization="mup", mup_base_width=64, **case)
    assert all(torch.equal(a, b) for a, b in zip(sp.state_dict().values(), mup.state_dict().values()))
    with torch.no_grad():
        assert torch.equal(sp(TOKENS), mup(TOKENS))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values())[:60])
def test_wider_the_hidden_matrices_are_the_standard_draws_over_sqrt_m(case: dict) -> None:
    """Width 128 from base 32 (m = 4): every matrix whose two sides grow is the standard draw / 2; the rest equal."""
    sp, mup = model(128, **case), model(128, parametrization="mup", mup_base_width=32, **case)
    hidden = fan_in_multipliers(mup)
    mup_params = dict(mup.named_parameters())
    for name, p in sp.named_parameters():
        grows = p.dim() >= 2 and "emb" not in name and "lm_head" not in name and "router" not in name
        assert (name in hidden) == grows, name
        if grows:
            assert hidden[name] == 4.0
        torch.testing.assert_close(mup_params[name], p / 2 if grows else p, rtol=0, atol=0)


def reference_logits(m: nn.Module, tokens: torch.Tensor, base: int, alpha_in: float, alpha_out: float) -> torch.Tensor:
    """A GPT-2 model with a linear query, written out: µP's multipliers and its attention scale sqrt(hd0) / hd."""
    args = m.args
    mult, hd = args.dim / base, args.head_dim
    t = tokens.shape[1]
    x = (m.tok_emb.weight[tokens] + m.pos_emb.weight[:t]) * alpha_in
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)
    for block in m.layers:
        h = F.layer_norm(x, (args.dim,), block.ln_1.weight, None, args.norm_eps)
        q = h @ block.attn.query.w_q.weight.T
        k, v = (h @ block.attn.kv.weight.T).split(args.dim, -1)
        heads = lambda z: z.view(z.shape[0], t, args.n_heads, hd).transpose(1, 2)  # noqa: E731
        scores = heads(q) @ heads(k).transpose(-1, -2) * (math.sqrt(hd / mult) / hd)
        y = (scores.masked_fill(causal, float("-inf")).softmax(-1) @ heads(v)).transpose(1, 2).reshape(x.shape)
        x = x + y @ block.attn.proj.weight.T
        h = F.layer_norm(x, (args.dim,), block.ln_2.weight, None, args.norm_eps)
        x = x + F.gelu(h @ block.mlp.fc.weight.T) @ block.mlp.proj.weight.T
    x = F.layer_norm(x, (args.dim,), m.ln_f.weight, None, args.norm_eps)
    return (x @ m.tok_emb.weight.T) * (alpha_out / mult)


def test_the_forward_is_the_formula_with_the_multipliers_and_the_attention_scale() -> None:
    m = model(128, query=Query(type="linear"), parametrization="mup", mup_base_width=32, mup_input_multiplier=3.0,
              mup_output_multiplier=5.0)
    with torch.no_grad():
        torch.testing.assert_close(m(TOKENS), reference_logits(m, TOKENS, 32, 3.0, 5.0), rtol=1e-5, atol=1e-5)


def groups(dim: int, base: int, **optimizer) -> dict[str, tuple[float, float, set[str]]]:
    with torch.device("meta"):
        m = build_model(ModelArgs(**SIZES, dim=dim, query=Query(type="residual_mlp"), parametrization="mup",
                                  mup_base_width=base))
    return {p.name: (p.lr_multiplier, p.weight_decay, set(p.names)) for p in plan_groups(Optimizer(**optimizer), m)}


def test_adamw_and_muon_scale_the_hidden_matrices_lr_by_their_rule_and_keep_lr_times_wd() -> None:
    m = 4.0
    hidden = set(multipliers(ModelArgs(**SIZES, dim=128, query=Query(type="residual_mlp"), parametrization="mup",
                                       mup_base_width=32)))
    adamw = groups(128, 32, weight_decay=0.1)
    assert adamw["decay_hidden"][:2] == (1 / m, 0.1 * m) and adamw["decay_hidden"][2] == hidden
    assert adamw["decay"][:2] == (1.0, 0.1) and adamw["decay"][2] == {"tok_emb.weight", "pos_emb.weight"}
    assert adamw["no_decay"][:2] == (1.0, 0.0)
    muon = groups(128, 32, name="muon", weight_decay=0.1)
    assert muon["muon_hidden"][:2] == (1 / math.sqrt(m), 0.1 * math.sqrt(m)) and muon["muon_hidden"][2] == hidden
    assert "muon" not in muon or not muon["muon"][2]
    original = groups(128, 32, name="muon", muon_adjust_lr="original")
    assert original["muon"][0] == 1.0 and original["muon"][2] == hidden  # the original scale needs no width rule
    assert set(groups(32, 32)) == {"decay", "no_decay"}  # at the base width: the paper's two groups
    entry = groups(128, 32, groups=[OptimizerGroup(name="branch", kind="query_mlp", lr_multiplier=2.0)])
    assert entry["branch_hidden"][0] == 2.0 / m  # a group's own multiplier times µP's


class RawQuery(QueryProjection):
    """A query whose matrix is a bare parameter: it declares no role."""

    def __init__(self, cfg, shape) -> None:
        super().__init__(cfg, shape)
        self.w = nn.Parameter(torch.empty(shape.q_dim, shape.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w.T


def test_the_mistakes_are_one_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="needs model.mup_base_width"):
        ModelArgs(**SIZES, dim=64, parametrization="mup")
    with pytest.raises(ConfigError, match="mup_base_width=128 is above model.dim=64"):
        ModelArgs(**SIZES, dim=64, parametrization="mup", mup_base_width=128)
    with pytest.raises(ConfigError, match="mlp_hidden=101 at model.dim=64 would be 50.5 at the base width"):
        multipliers(ModelArgs(**SIZES, dim=64, mlp_hidden=101, parametrization="mup", mup_base_width=32))
    register_query("raw")(RawQuery)
    try:
        with pytest.raises(ConfigError, match="query type 'raw' declares no role for its w "):
            multipliers(ModelArgs(**SIZES, dim=64, query=Query(type="raw"), parametrization="mup",
                                  mup_base_width=32))
    finally:
        QUERY_TYPES.pop("raw", None)
    from torchnlq.train import optim

    monkeypatch.setitem(optim.GROUP_OPTIMIZERS, "adamw", optim.GroupOptimizer(
        "NoRule", build=optim.GROUP_OPTIMIZERS["adamw"].build, state_bytes=optim.GROUP_OPTIMIZERS["adamw"].state_bytes))
    with pytest.raises(ConfigError, match="NoRule has no width rule for the hidden matrices"):
        groups(128, 32)


def test_the_standard_architectures_take_a_mup_model_only_at_its_base_width() -> None:
    """At its base width a µP model is the standard one; away from it, GPT-2's and Llama's configs have no
    multipliers: one line, pointing at --format hf."""
    from torchnlq.models.dense.hf import GPT2, LLAMA

    base = ModelArgs(**SIZES, dim=64, query=Query(type="linear"), parametrization="mup", mup_base_width=64)
    wide = ModelArgs(**SIZES, dim=128, query=Query(type="linear"), parametrization="mup", mup_base_width=64)
    assert GPT2.incompatibility(base) is None
    for architecture in (GPT2, LLAMA):
        assert "not its base width 64" in architecture.incompatibility(wide)
        assert "--format hf" in architecture.incompatibility(wide)


def test_counts_flops_and_the_memory_estimate_do_not_change_under_mup() -> None:
    from torchnlq.config.manager import load_job_config
    from torchnlq.models.counts import flops_per_token, num_params
    from torchnlq.train.memory_estimate import estimate_memory
    from torchnlq.train.preflight import check_job_config

    tiny = ["--model.dim=64", "--model.n_layers=2", "--training.seq_len=32", "--training.micro_batch_size=2",
            "--data.synthetic=true", "--data.tokenizer=byte"]
    sp = load_job_config(tiny)
    mup = load_job_config([*tiny, "--model.parametrization=mup", "--model.mup_base_width=32"])
    a, b = check_job_config(sp), check_job_config(mup)
    assert num_params(a) == num_params(b) and flops_per_token(a, 32) == flops_per_token(b, 32)
    assert estimate_memory(sp, a, 1, "cpu") == estimate_memory(mup, b, 1, "cpu")


@pytest.mark.integration  # trainer runs: resume, 2 processes, compile
def test_a_mup_run_resumes_bit_for_bit_and_two_processes_and_compile_give_one_process_losses(tmp_path) -> None:
    from helpers.train import run_train, scalars, tiny_args

    mup = ["--model.parametrization=mup", "--model.mup_base_width=16", "--lr_schedule.decay_steps=12"]
    straight = run_train(tmp_path, *tiny_args(tmp_path, "straight"), *mup)
    assert straight.returncode == 0, straight.stderr[-3000:]
    # m = 32 / 16: the matrices at half the LR, twice the decay (the debug config's 0.03125): lr x wd kept
    assert "decay_hidden: adamw, lr x0.5, wd 0.0625" in straight.stdout + straight.stderr
    for steps in (8, 12):
        part = run_train(tmp_path, *tiny_args(tmp_path, "resumed", steps=steps), *mup)
        assert part.returncode == 0, part.stderr[-3000:]
    two = run_train(tmp_path, *tiny_args(tmp_path, "two"), *mup, "--training.grad_accum_steps=1", ngpu=2,
                    timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    compiled = run_train(tmp_path, *tiny_args(tmp_path, "compiled"), *mup, "--training.compile=true", timeout=600)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    names = ("straight", "resumed", "two", "compiled")
    losses = {name: scalars(tmp_path / "outputs" / name / "tb")["loss/train"] for name in names}
    assert losses["resumed"] == losses["straight"] and sorted(losses["straight"]) == list(range(1, 13))
    for step, loss in losses["straight"].items():  # 2 processes and compile: one eager process's losses
        assert abs(losses["two"][step] - loss) <= 1e-5 * loss, (step, losses["two"][step], loss)
        assert abs(losses["compiled"][step] - loss) <= 1e-5 * loss, (step, losses["compiled"][step], loss)
