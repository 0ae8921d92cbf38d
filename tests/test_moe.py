"""The moe family against references written out here: the routed forward as a per-token loop over the chosen
experts, the router's losses as their formulas, the balancing bias, the counts, the layers that route, every
query type, and the routing collapse the load-balancing loss prevents."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from torchnlq.config.job_config import Query
from torchnlq.errors import ConfigError
from torchnlq.models import ModelArgs, build_model, build_model_args, num_params
from torchnlq.models.config import Model
from torchnlq.models.moe.config import MoE
from torchnlq.models.counts import flops_per_token
from torchnlq.models.moe.runtime import clear_step_statistics, finish_step, step_statistics
from torchnlq.models.moe.block import MoEFeedForward, is_moe_layer
from torchnlq.models.moe.experts import GroupedExperts
from torchnlq.models.query import QUERY_TYPES

D, E, H, K = 16, 4, 12, 2


def moe_args(**moe: object) -> ModelArgs:
    return ModelArgs(n_layers=2, dim=D, n_heads=2, vocab_size=40, max_seq_len=32, family="moe", norm="rms",
                     mlp_activation="swiglu", positions="rope", mlp_hidden=20,
                     moe=MoE(**{"n_experts": E, "top_k": K, "expert_hidden": H, **moe}))


def layer(seed: int = 0, **moe: object) -> MoEFeedForward:
    torch.manual_seed(seed)
    ffn = MoEFeedForward(moe_args(**moe)).double()
    ffn.init_weights(0.3, 0.3)
    return ffn.train()


def reference(ffn: MoEFeedForward, x: torch.Tensor, normalized: bool = False, bias: torch.Tensor | None = None):
    """The layer's output as a loop over tokens and over each token's chosen experts, written out from the weights."""
    router, experts = ffn.router, ffn.experts
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = torch.softmax(x[t] @ router.gate.weight.T, dim=-1)
        chosen = torch.topk(probs if bias is None else probs + bias, K).indices
        weights = probs[chosen] / (probs[chosen].sum() if normalized else 1.0)
        for w, e in zip(weights, chosen):
            h = F.silu(x[t] @ experts.gate_proj[e].T) * (x[t] @ experts.up_proj[e].T)
            out[t] = out[t] + w * (h @ experts.down_proj[e].T)
    if ffn.shared is not None:
        out = out + ffn.shared(x)
    return out


@pytest.mark.parametrize("router", ["softmax", "softmax_normalized"])
@pytest.mark.parametrize("shared", [0, 1])
def test_the_routed_forward_and_its_gradients_are_the_per_token_loop(router: str, shared: int) -> None:
    ffn = layer(router=router, n_shared_experts=shared, aux_loss_coef=0.0)
    x = torch.randn(9, D, dtype=torch.float64, requires_grad=True)
    ours = ffn(x)
    x_ref = x.detach().clone().requires_grad_()
    theirs = reference(ffn, x_ref, normalized=router == "softmax_normalized")
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(ours)
    ours_grads = torch.autograd.grad(ours, [x, *ffn.parameters()], grad)
    theirs_grads = torch.autograd.grad(theirs, [x_ref, *ffn.parameters()], grad, allow_unused=True)
    for a, b in zip(ours_grads, theirs_grads):
        torch.testing.assert_close(a, b if b is not None else torch.zeros_like(a), rtol=1e-10, atol=1e-10)


def test_the_grouped_and_the_looped_experts_agree_in_fp32() -> None:
    torch.manual_seed(1)
    experts = GroupedExperts(D, H, E, K)
    experts.init_weights(0.3, 0.3)
    x = torch.randn(11, D, requires_grad=True)
    chosen = torch.stack([torch.randperm(E)[:K] for _ in range(11)])
    weights = torch.rand(11, K)
    grouped = experts(x, chosen, weights)
    rows_sorted = x[chosen.flatten().argsort(stable=True) // K]
    sizes = torch.bincount(chosen.flatten(), minlength=E).tolist()
    looped = GroupedExperts.compute(rows_sorted, torch.tensor(sizes), sizes, experts.gate_proj, experts.up_proj,
                                    experts.down_proj)
    per_token = torch.empty_like(looped).index_copy_(0, chosen.flatten().argsort(stable=True), looped)
    torch.testing.assert_close(grouped, (per_token.view(11, K, D) * weights[..., None]).sum(1), rtol=1e-5, atol=1e-6)


def test_experts_of_any_width_compute_grouped_or_looped() -> None:
    """A width of no whole 16-byte rows (torch._grouped_mm's rule) takes the loop, with the same result."""
    torch.manual_seed(2)
    odd = GroupedExperts(D, 13, E, K)
    odd.init_weights(0.3, 0.3)
    x = torch.randn(7, D)
    chosen, weights = torch.stack([torch.randperm(E)[:K] for _ in range(7)]), torch.rand(7, K)
    out = odd(x, chosen, weights)
    expected = torch.stack([sum(w * (F.silu(x[t] @ odd.gate_proj[e].T) * (x[t] @ odd.up_proj[e].T)) @ odd.down_proj[e].T
                                for w, e in zip(weights[t], chosen[t])) for t in range(7)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_the_load_balancing_and_z_losses_are_their_formulas() -> None:
    """The router losses reach the gradient as aux = coef·E·Σ f_i P_i and z = coef·mean(logsumexp²) would."""
    ffn = layer(aux_loss_coef=0.1, z_loss_coef=0.01)
    x = torch.randn(10, D, dtype=torch.float64)
    out = ffn(x)
    out.sum().backward()
    ours = ffn.router.gate.weight.grad.clone()
    ffn.zero_grad()
    logits = x @ ffn.router.gate.weight.T
    probs = logits.softmax(-1)
    chosen = probs.topk(K, dim=-1).indices
    share = torch.bincount(chosen.flatten(), minlength=E).double() / (10 * K)  # f_i, a constant
    aux = 0.1 * E * (share * probs.mean(0)).sum()
    z = 0.01 * torch.logsumexp(logits, dim=-1).square().mean()
    (reference(ffn, x).sum() + aux + z).backward()
    torch.testing.assert_close(ours, ffn.router.gate.weight.grad, rtol=1e-9, atol=1e-12)
    stats = dict(((stat, value) for _, stat, value in step_statistics_of(ffn)))
    assert stats["aux_loss"] == pytest.approx(aux.item()) and stats["z_loss"] == pytest.approx(z.item())


def step_statistics_of(ffn: MoEFeedForward) -> list[tuple[int, str, float]]:
    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([ffn])

    return step_statistics(Wrapper())


def test_the_losses_leave_the_output_and_need_their_scale() -> None:
    """The router losses change the gradient, never the output (the loss a run logs is the model's)."""
    plain, lossy = layer(aux_loss_coef=0.0), layer(aux_loss_coef=1.0)
    x = torch.randn(6, D, dtype=torch.float64)
    assert torch.equal(plain(x), lossy(x))
    lossy.router_loss_scale = 0.0
    lossy(x).sum().backward()
    grad_unscaled = lossy.router.gate.weight.grad.clone()
    plain(x).sum().backward()
    torch.testing.assert_close(grad_unscaled, plain.router.gate.weight.grad)


def test_the_balancing_bias_chooses_and_moves_toward_the_mean_load() -> None:
    ffn = layer(bias_update_rate=0.1, aux_loss_coef=0.0)
    bias = torch.tensor([0.5, 0.0, -0.5, 0.0], dtype=torch.float64)
    ffn.router.expert_bias.copy_(bias)
    x = torch.randn(8, D, dtype=torch.float64)
    torch.testing.assert_close(ffn(x), reference(ffn, x, bias=bias), rtol=1e-10, atol=1e-10)  # weighs unbiased
    load = ffn.router.tokens_per_expert.clone()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([ffn])

    finish_step(Wrapper())
    torch.testing.assert_close(ffn.router.expert_bias, bias + 0.1 * torch.sign(load.mean() - load))
    assert load.sum() == 8 * K


def test_the_layers_that_route_follow_every_and_first_dense() -> None:
    args = ModelArgs(**{**moe_args().__dict__, "n_layers": 6, "moe": MoE(n_experts=E, top_k=K, every=2,
                                                                      first_dense=2)})
    assert [is_moe_layer(args, i) for i in range(6)] == [False, False, False, True, False, True]
    model = build_model(args)
    assert [isinstance(block.mlp, MoEFeedForward) for block in model.layers] == [False, False, False, True, False, True]
    with pytest.raises(ConfigError, match="leave no MoE layer"):
        build_model(ModelArgs(**{**args.__dict__, "moe": MoE(first_dense=6)}))
    with pytest.raises(ConfigError, match="model.moe.top_k=5 exceeds model.moe.n_experts=4"):
        build_model(ModelArgs(**{**args.__dict__, "moe": MoE(n_experts=4, top_k=5)}))


def test_the_counts_are_total_and_active_written_out() -> None:
    """Two MoE layers: attention 4·D² (linear query), router D·E, E experts of 3·D·H, two norms; active = the top K."""
    args = moe_args()
    vocab, seq = 40, 32
    attention, router, expert, norms = 4 * D * D, D * E, 3 * D * H, 2 * D
    total = vocab * D + 2 * (attention + router + E * expert + norms) + D  # rope: no position table; tied head
    active = total - 2 * (E - K) * expert
    assert num_params(args) == total and num_params(args, active=True) == active
    n = active - vocab * D + vocab * D  # non-embedding active + the tied head's matmul
    assert flops_per_token(args, seq) == 6 * n + 12 * 2 * 2 * (D // 2) * seq


def test_every_query_type_trains_in_an_moe() -> None:
    for qtype in QUERY_TYPES:
        torch.manual_seed(0)
        model = build_model(ModelArgs(**{**moe_args().__dict__, "query": Query(type=qtype)}))
        tokens = torch.randint(0, 40, (2, 12))
        loss = model(tokens, targets=tokens)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad is not None for name, p in model.named_parameters() if "experts" in name), qtype


def test_the_moe_flavors_are_their_sizes() -> None:
    small = build_model_args(Model(flavor="moe_gpt_small"), 50304)
    d, layers, experts, hidden = 768, 12, 8, 1024
    assert (small.family, small.moe.n_experts, small.moe.top_k, small.qk_norm) == ("moe", experts, 2, True)
    active_experts = layers * 2 * 3 * d * hidden
    assert active_experts == layers * 2 * d * 4 * d  # GPT-2 small's MLP, per token
    assert num_params(small) - num_params(small, active=True) == layers * (experts - 2) * 3 * d * hidden


def routing_load(coef: float, steps: int = 300) -> float:
    """The largest expert's share of the tokens after training one top-1 MoE layer on a skewed toy task (the tokens
    crowd around one point, so one expert is first choice for all of them), a regression any expert can fit."""
    torch.manual_seed(0)
    ffn = MoEFeedForward(ModelArgs(**{**moe_args().__dict__, "moe": MoE(n_experts=E, top_k=1, expert_hidden=H,
                                                                         aux_loss_coef=coef)}))
    ffn.init_weights(0.1, 0.1)
    x = torch.randn(D) + 0.5 * torch.randn(512, D)
    target = torch.tanh(x @ torch.randn(D, D))
    optimizer = torch.optim.Adam(ffn.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(ffn(x), target).backward()
        optimizer.step()
    with torch.no_grad():
        chosen = ffn.router(x)[0].flatten()
    return torch.bincount(chosen, minlength=E).max().item() / len(chosen)


def test_routing_collapses_without_the_balancing_loss_and_stays_balanced_with_it() -> None:
    """Documented band (docs/models.md, "MoE"): with the loss, no expert holds more than 1.5 / n_experts."""
    collapsed, balanced = routing_load(0.0), routing_load(0.1)
    assert collapsed > 0.9, collapsed
    assert balanced <= 1.5 / E, balanced


def test_the_statistics_are_the_steps_and_clear() -> None:
    torch.manual_seed(0)
    model = build_model(moe_args(aux_loss_coef=0.01))
    tokens = torch.randint(0, 40, (2, 12))
    model(tokens, targets=tokens).backward()
    stats = {(i, s): v for i, s, v in step_statistics(model)}
    for index in (0, 1):
        loads = [stats[index, f"load/{e}"] for e in range(E)]
        assert sum(loads) == pytest.approx(1.0) and stats[index, "load_max"] == max(loads)
        assert 0 < stats[index, "entropy"] <= math.log(E) + 1e-6
    clear_step_statistics(model)
    assert step_statistics(model) == []


def test_the_paper_check_of_the_same_parameter_count_holds_at_equal_active_and_total() -> None:
    """model_summary's params_vs_linear_query of an MoE: the residual GELU query's extra parameters (two norm gains
    per layer, over linear's W_Q) are the same in the total and in the active count, counted here from the built
    models (an expert's parameters active at top_k / n_experts)."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.preflight import check_job_config
    from torchnlq.train.summary import summarize

    def counts(query: str) -> tuple[int, float]:
        cfg = load_job_config(["--data.tokenizer=byte", "--model.flavor=moe_debug", f"--model.query.type={query}"])
        args = check_job_config(cfg)
        model = build_model(args)
        total = sum(p.numel() for p in model.parameters())
        experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
        return total, total - experts * (1 - args.moe.top_k / args.moe.n_experts)

    (linear, linear_active), (residual, residual_active) = counts("linear"), counts("residual_mlp")
    assert residual - linear == residual_active - linear_active > 0
    line = dict(x.split(": ", 1) for x in summarize(load_job_config(
        ["--data.tokenizer=byte", "--model.flavor=moe_debug", "--model.query.type=residual_mlp"])))
    assert line["params_vs_linear_query"] == (f"{residual - linear:+,} (the same config with model.query.type = "
                                              f"linear has {linear:,}; active {residual - linear:+,}, against its "
                                              f"{int(linear_active):,})")


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_run_info_records_the_active_non_embedding_parameters(top_k: int) -> None:
    """run_info.json (what compare_runs' params column reads) holds the non-embedding parameters a token computes
    with: the written-out count of the test above, minus the token table."""
    from torchnlq.checkpoint.record import RunRecord

    info = RunRecord(model_args=moe_args(top_k=top_k), tokenizer={}).to_run_info(finished=False)
    attention, router, expert, norms = 4 * D * D, D * E, 3 * D * H, 2 * D
    total = 2 * (attention + router + E * expert + norms) + D
    assert info["non_embedding_params"] == total
    assert info["active_non_embedding_params"] == total - 2 * (E - top_k) * expert


#: Each [model.moe] knob that can change nothing in some model: its setting on, and off.
KNOBS = {"bias_update_rate": (0.1, 0.0), "aux_loss_coef": (0.5, 0.0), "router": ("softmax_normalized", "softmax"),
         "z_loss_coef": (0.5, 0.0)}
OFF = {name: off for name, (_, off) in KNOBS.items()}


def trained_output(n_experts: int, top_k: int, **moe: object) -> torch.Tensor:
    """The layer's output on fresh tokens after one SGD step on other tokens (the router's losses in the gradient), a
    fixed random choosing bias in place: what a setting would change if it changed anything."""
    ffn = layer(n_experts=n_experts, top_k=top_k, **{**OFF, **moe})
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        ffn.router.expert_bias.copy_(torch.randn(n_experts, generator=gen, dtype=torch.float64))
    # 13 tokens: no top_k < n_experts <= 4 splits them evenly, where the balancing loss's gradient would vanish.
    ffn(torch.randn(13, D, generator=gen, dtype=torch.float64)).square().sum().backward()
    with torch.no_grad():
        for p in ffn.parameters():
            p -= 0.5 * p.grad
        return ffn(torch.randn(12, D, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("knob", KNOBS)
@pytest.mark.parametrize("n_experts, top_k", [(n, k) for n in (1, 2, 3, 4) for k in range(1, n + 1)])
def test_a_moe_setting_is_warned_about_exactly_when_it_changes_nothing(knob: str, n_experts: int, top_k: int) -> None:
    """The moe family's warnings (config_warnings' hook) name a knob iff the layer trained with it on computes what it
    computes with it off (issue 47.5: a choosing bias at top_k = n_experts, and the others' no-op combinations)."""
    from torchnlq.models.moe import moe_warnings

    on = KNOBS[knob][0]
    warned = [w for w in moe_warnings(moe_args(n_experts=n_experts, top_k=top_k, **{**OFF, knob: on}))
              if f"model.moe.{knob} " in w]
    same = torch.allclose(trained_output(n_experts, top_k, **{knob: on}), trained_output(n_experts, top_k),
                          rtol=1e-10, atol=1e-12)
    assert bool(warned) == same, (warned, same)
    assert len(warned) <= 1 and all("no effect" in w and ("set " in w or "use " in w) for w in warned), warned


def test_config_warnings_carry_the_moe_familys_own() -> None:
    """config_warnings calls the family's warnings hook (train/ names no family): a run's config at top_k =
    n_experts with a choosing bias is warned about; the same config at top_k < n_experts is not."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.preflight import config_warnings

    argv = ["--model.flavor=moe_debug", "--model.moe.n_experts=4", "--model.moe.bias_update_rate=0.001",
            "--model.moe.aux_loss_coef=0"]
    said = config_warnings(load_job_config([*argv, "--model.moe.top_k=4"]))
    assert [w for w in said if w.startswith("model.moe.top_k = n_experts = 4") and "bias_update_rate" in w], said
    assert not [w for w in config_warnings(load_job_config([*argv, "--model.moe.top_k=2"])) if "model.moe" in w]
