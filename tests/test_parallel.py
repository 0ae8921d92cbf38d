"""Single-process tests of torchnlq.parallel: activation checkpointing, compile, float8, mesh, init, clipping."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torchnlq.config.job_config import ActivationCheckpoint, Float8, Parallelism, Query, Training
from torchnlq.errors import UserError
from torchnlq.models import Decoder, QUERY_TYPES, ModelArgs
from torchnlq.parallel.dist import DistInfo, build_mesh, destroy_distributed, init_distributed
from torchnlq.parallel.parallelize import (
    apply_compile,
    clip_grad_norm,
    materialize_and_init,
    parallelize_model,
    set_gradient_sync,
)
from torchnlq.parallel.activation_checkpoint import apply_activation_checkpointing, is_checkpointed
from benchmarks.timing import measure_allocations
from torchnlq.parallel.float8 import apply_float8, convert_to_float8, quiet_torchao_import
from torchnlq.models import build_model

CPU = torch.device("cpu")
AC_MODES = [ActivationCheckpoint(mode="full"), ActivationCheckpoint(mode="selective", every=2),
            ActivationCheckpoint(mode="op")]


def tiny_args(query_type: str = "residual_mlp", **overrides) -> ModelArgs:
    base = dict(n_layers=4, dim=64, n_heads=4, vocab_size=128, max_seq_len=64, query=Query(type=query_type))
    base.update(overrides)
    return ModelArgs(**base)


def seeded_model(args: ModelArgs, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return build_model(args)


def loss_and_grads(model: nn.Module, seed: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    tokens = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(seed))
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same(a: tuple, b: tuple, rtol: float, atol: float) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=rtol, atol=atol)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=rtol, atol=atol, msg=name)


# --- activation checkpointing ---------------------------------------------------------------

@pytest.mark.parametrize("query_type", sorted(QUERY_TYPES))
@pytest.mark.parametrize("ac", AC_MODES, ids=lambda c: f"{c.mode}{c.every if c.mode == 'selective' else ''}")
def test_activation_checkpointing_matches_none(query_type: str, ac: ActivationCheckpoint) -> None:
    args = tiny_args(query_type, positions="rope" if query_type == "linear" else "learned")
    reference = loss_and_grads(seeded_model(args))
    model = apply_activation_checkpointing(seeded_model(args), ac)
    assert_same(loss_and_grads(model), reference, rtol=1e-6, atol=1e-7)


def test_activation_checkpointing_which_blocks() -> None:
    for ac, expected in ((ActivationCheckpoint(mode="none"), [False] * 4),
                         (ActivationCheckpoint(mode="full"), [True] * 4),
                         (ActivationCheckpoint(mode="selective", every=2), [False, True, False, True]),
                         (ActivationCheckpoint(mode="selective", every=3), [False, False, True, False]),
                         (ActivationCheckpoint(mode="op"), [True] * 4)):
        model = apply_activation_checkpointing(seeded_model(tiny_args()), ac)
        assert [is_checkpointed(block) for block in model.layers] == expected, ac


def test_measure_allocations_counts_bytes_and_keeps_stderr_clean(capfd: pytest.CaptureFixture) -> None:
    """A 4 MB tensor kept and a 40 MB one freed: held ≈ 4 MB, peak ≥ 44 MB; the profiler's own
    start/stop lines are hidden, what fn writes to stderr is not."""

    def fn() -> torch.Tensor:
        kept = torch.ones(1_000_000)
        del_me = torch.ones(10_000_000)
        del del_me
        os.write(2, b"from fn\n")
        return kept

    kept, held, peak = measure_allocations(fn)
    assert kept.numel() == 1_000_000
    assert 4_000_000 <= held < 4_100_000 and peak >= 44_000_000
    err = capfd.readouterr().err
    assert "from fn" in err and "profiler_st" not in err


@pytest.mark.integration  # three profiled forwards: seconds
def test_op_mode_saves_less_than_none_and_more_than_full() -> None:
    """Bytes forward leaves alive for backward: none > op > full (the modes really differ)."""

    def held_after_forward(mode: str) -> int:
        model = apply_activation_checkpointing(seeded_model(tiny_args(n_layers=2)), ActivationCheckpoint(mode=mode))
        tokens = torch.randint(0, 128, (4, 64))
        _, held, _ = measure_allocations(lambda: model(tokens))
        return held

    none, op, full = (held_after_forward(mode) for mode in ("none", "op", "full"))
    assert none > op > full, (none, op, full)


# --- state_dict keys and compile ------------------------------------------------------------

@pytest.mark.parametrize("mode", ["full", "selective", "op"])
def test_activation_checkpointing_keeps_names(mode: str) -> None:
    plain = seeded_model(tiny_args())
    model = apply_activation_checkpointing(seeded_model(tiny_args()), ActivationCheckpoint(mode=mode, every=2))
    assert list(model.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert [n for n, _ in model.named_modules()] == [n for n, _ in plain.named_modules()]
    model.load_state_dict(plain.state_dict())  # strict load both ways
    plain.load_state_dict(model.state_dict())


@pytest.mark.integration  # torch.compile: tens of seconds
@pytest.mark.parametrize("mode", ["none", "op"])
def test_compile_matches_eager_and_keeps_keys(mode: str) -> None:
    args = tiny_args()
    reference = loss_and_grads(seeded_model(args))
    model = apply_compile(apply_activation_checkpointing(seeded_model(args), ActivationCheckpoint(mode=mode)))
    assert list(model.state_dict()) == list(seeded_model(args).state_dict())
    assert all(type(block).__name__ == "Block" for block in model.layers)  # no OptimizedModule wrapper
    assert_same(loss_and_grads(model), reference, rtol=1e-5, atol=1e-6)


# --- float8 ---------------------------------------------------------------------------------

def float8_swapped(model: nn.Module) -> set[str]:
    with quiet_torchao_import():
        from torchao.float8.float8_linear import Float8Linear
    return {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_conversion_swaps_exactly_the_eligible_linears(recipe: str) -> None:
    # r = 0.375 * 64 = 24: the query's w1 (64 -> 24) and w2 (24 -> 64) are not multiples of 16.
    args = tiny_args(n_layers=2, tie_embeddings=False, query=Query(type="residual_mlp", bottleneck_ratio=0.375))
    model = seeded_model(args)
    keys = list(model.state_dict())
    convert_to_float8(model, recipe)
    expected = {f"layers.{i}.{name}" for i in range(2) for name in ("attn.kv", "attn.proj", "mlp.fc", "mlp.proj")}
    assert float8_swapped(model) == expected
    assert type(model.lm_head) is nn.Linear  # untied head kept in high precision
    assert all(type(model.layers[i].attn.query.w1) is nn.Linear for i in range(2))
    assert list(model.state_dict()) == keys


def test_float8_conversion_swaps_the_gate_of_swiglu() -> None:
    model = convert_to_float8(seeded_model(tiny_args(n_layers=1, query_type="linear", **LLAMA_BLOCK)), "tensorwise")
    assert float8_swapped(model) == {f"layers.0.{name}" for name in (
        "attn.query.w_q", "attn.kv", "attn.proj", "mlp.fc", "mlp.gate", "mlp.proj")}


def test_float8_conversion_tied_head_and_query_linears() -> None:
    model = convert_to_float8(seeded_model(tiny_args(n_layers=1, query_type="linear")), "tensorwise")
    assert model.lm_head is None
    assert float8_swapped(model) == {"layers.0.attn.query.w_q", "layers.0.attn.kv", "layers.0.attn.proj",
                                     "layers.0.mlp.fc", "layers.0.mlp.proj"}


def test_apply_float8_on_cpu_is_a_user_error() -> None:
    model = seeded_model(tiny_args(n_layers=1))
    with pytest.raises(UserError, match=r"float8.enabled needs a GPU with float8 support .*this device is a CPU"):
        apply_float8(model, Float8(enabled=True), CPU)
    assert apply_float8(model, Float8(enabled=False), CPU) is model
    assert not float8_swapped(model)


# --- distributed set-up ---------------------------------------------------------------------

def test_init_distributed_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert init_distributed("cpu") == DistInfo(rank=0, local_rank=0, world_size=1, device=CPU)
    assert not torch.distributed.is_initialized()


def test_init_distributed_device_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(UserError, match="training.device='cuda' but no CUDA device is visible"):
        init_distributed("cuda")
    assert init_distributed("auto").device == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    message = "NGPU=8 but only 2 CUDA devices are visible; set NGPU<=2 or use --training.device=cpu"
    with pytest.raises(UserError, match=message):
        init_distributed("auto")


def test_build_mesh_errors_and_single_process() -> None:
    def info(world: int) -> DistInfo:
        return DistInfo(rank=0, local_rank=0, world_size=world, device=CPU)

    with pytest.raises(UserError, match=r"parallelism.dp_replicate=2 x parallelism.dp_shard=3 = 6 != world size 8"):
        build_mesh(info(8), Parallelism(dp_replicate=2, dp_shard=3))
    with pytest.raises(UserError, match=r"parallelism.dp_replicate=3 does not divide the world size 8"):
        build_mesh(info(8), Parallelism(dp_replicate=3))
    with pytest.raises(UserError, match=r"parallelism.dp_shard=0"):
        build_mesh(info(1), Parallelism(dp_shard=0))
    assert build_mesh(info(1), Parallelism()) is None


LLAMA_BLOCK = dict(positions="rope", norm="rms", mlp_activation="swiglu", qk_norm=True, rope_scaling_factor=8.0,
                   rope_original_max_seq_len=16, init="depth", n_kv_heads=2)


@pytest.mark.parametrize("block", [{}, LLAMA_BLOCK], ids=["gpt2", "llama"])
def test_fsdp_single_process_matches_plain(block: dict) -> None:
    """fsdp_single_process: a 1-rank gloo group, DTensor params; same init, loss, grads and clipped norm."""
    args = tiny_args(n_layers=2, **{"positions": "rope", **block})
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=CPU)
    parallelism = Parallelism(fsdp_single_process=True)
    try:
        mesh = build_mesh(info, parallelism)
        assert mesh is not None and mesh.mesh_dim_names == ("dp_shard",)
        with torch.device("meta"):
            model = build_model(args)
        parallelize_model(model, training=Training(), ac=ActivationCheckpoint(mode="full"), float8=Float8(),
                          parallelism=parallelism, mesh=mesh, device=CPU)
        materialize_and_init(model, CPU, seed=5, mesh=mesh)
        plain = seeded_model(args, seed=5)
        assert list(model.state_dict()) == list(plain.state_dict())
        loss, _ = loss_and_grads(model)
        plain_loss, _ = loss_and_grads(plain)
        torch.testing.assert_close(loss, plain_loss, rtol=1e-6, atol=0)
        set_gradient_sync(model, True)
        norm = float(clip_grad_norm(model.parameters(), 0.1))
        plain_norm = float(clip_grad_norm(plain.parameters(), 0.1))
        assert norm == pytest.approx(plain_norm, rel=1e-6)
        for (name, p), q in zip(model.named_parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-5, atol=1e-8, msg=name)
    finally:
        destroy_distributed()


# --- initialisation, clipping, gradient sync without a mesh ---------------------------------

@pytest.mark.parametrize("positions", ["learned", "rope", "llama"])
def test_materialize_without_mesh_equals_seeded_model(positions: str) -> None:
    block = LLAMA_BLOCK if positions == "llama" else {"positions": positions}
    args = tiny_args(tie_embeddings=positions == "learned", **block)
    positions = args.positions
    with torch.device("meta"):
        model = build_model(args)
    apply_activation_checkpointing(model, ActivationCheckpoint(mode="full"))
    torch.manual_seed(99)
    state = torch.get_rng_state()
    materialize_and_init(model, CPU, seed=3, mesh=None)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    reference = seeded_model(args, seed=3)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    if positions == "rope":
        assert torch.equal(model.rope.cos, reference.rope.cos)


def test_clip_grad_norm_plain_model() -> None:
    a, b = seeded_model(tiny_args(n_layers=1)), seeded_model(tiny_args(n_layers=1))
    loss_and_grads(a)
    loss_and_grads(b)
    set_gradient_sync(a, False)  # a no-op without FSDP
    norm = float(clip_grad_norm(a.parameters(), 0.05))
    expected = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.05).item()
    assert norm == pytest.approx(expected, rel=1e-6)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    before = [p.grad.clone() for p in a.parameters()]
    assert float(clip_grad_norm(a.parameters(), 0.0)) == pytest.approx(0.05, rel=1e-4)  # 0: measure only
    assert all(torch.equal(p.grad, g) for p, g in zip(a.parameters(), before))
