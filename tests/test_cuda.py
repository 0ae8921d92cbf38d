"""What only a CUDA GPU can check (marked ``cuda``, skipped without one): the first thing to run on a new
GPU machine, ``./run_tests.sh -m cuda`` (docs/performance.md, "The first GPU run").

- one bf16 (autocast) training step of blocks compiled by inductor with ``fullgraph=True``, per registered
  query type: a finite loss, every trainable parameter with a finite gradient, no graph break;
- float8 (torchao) on compute capability >= 8.9: the eligible linears are swapped and a compiled bf16 step
  is finite (skipped below 8.9, where float8 matmuls do not exist);
- FSDP2 over NCCL in one process (a world of one on a FileStore): the sharded model computes the unsharded
  model's loss and gradients in fp32, and a compiled bf16 FSDP step is finite;
- ``python -m benchmarks.gpu_check`` end to end on the default profile with ``--steps 3``: exit 0, every figure present
  and consistent, no graph break or recompilation.

The CPU halves of these checks are in tests/test_compile_graphs.py, tests/test_parallel.py and
tests/test_gpu_check.py.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from torchnlq.config.job_config import ActivationCheckpoint, Float8, Parallelism, Query, Training
from torchnlq.config.manager import load_job_config
from torchnlq.models import QUERY_TYPES, ModelArgs
from torchnlq.parallel.float8 import MIN_CAPABILITY, convert_to_float8, quiet_torchao_import
from torchnlq.models import build_model
from torchnlq.parallel.parallelize import (
    apply_compile,
    clip_grad_norm,
    materialize_and_init,
    parallelize_model,
    reference_state_dict,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)"),
]

REPO = Path(__file__).resolve().parents[1]
BATCH, SEQ = 4, 128


def small_args(query_type: str, **kw: object) -> ModelArgs:
    """A model whose every matmul dimension is a multiple of 16 (float8's tiles), big enough for real kernels."""
    return ModelArgs(n_layers=2, dim=128, n_heads=4, vocab_size=512, max_seq_len=SEQ,
                     query=Query(type=query_type), **kw)  # type: ignore[arg-type]


def batch(device: torch.device, vocab: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0)).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def bf16_step(model: torch.nn.Module, device: torch.device) -> float:
    """One forward + backward under bf16 autocast, as the trainer runs a micro-batch; returns the loss."""
    x, y = batch(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(x, targets=y, loss_chunk_tokens=4096)
    loss.backward()
    return loss.item()


def assert_finite_gradients(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        assert p.grad is not None, f"{name} has no gradient"
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        assert torch.isfinite(grad).all(), f"{name}: non-finite gradient"


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """fp32 comparisons in full fp32: the trainer turns TF32 on (process-wide) when it builds."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("query_type", [name for name in QUERY_TYPES if not name.startswith("my_")])
def test_bf16_compiled_step_per_query_type(query_type: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = build_model(small_args(query_type)).to(device)
    torch._dynamo.reset()
    counters.clear()
    apply_compile(model, fullgraph=True)  # inductor, as the trainer compiles
    loss = bf16_step(model, device)
    assert math.isfinite(loss) and 0 < loss < 2 * math.log(512)  # near ln(vocab) at init
    assert_finite_gradients(model)
    assert dict(counters["graph_break"]) == {}
    torch._dynamo.reset()


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < MIN_CAPABILITY,
                    reason=f"float8 matmuls need compute capability >= {'.'.join(map(str, MIN_CAPABILITY))}")
@pytest.mark.parametrize("query_type", ["linear", "residual_mlp"])
def test_float8_compiled_step(query_type: str, device: torch.device) -> None:
    torch.manual_seed(0)
    model = build_model(small_args(query_type)).to(device)
    convert_to_float8(model, "tensorwise")
    with quiet_torchao_import():
        from torchao.float8.float8_linear import Float8Linear
    swapped = [name for name, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert any(".attn.kv" in name for name in swapped) and any(".mlp." in name for name in swapped)
    torch._dynamo.reset()
    apply_compile(model, fullgraph=True)
    loss = bf16_step(model, device)
    assert math.isfinite(loss)
    assert_finite_gradients(model)
    torch._dynamo.reset()


@pytest.mark.usefixtures("no_tf32")
def test_fsdp_over_nccl_in_one_process(tmp_path: Path, device: torch.device) -> None:
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            device_id=device)
    try:
        assert dist.get_backend() == "nccl"
        ones = torch.ones(4, device=device)
        dist.all_reduce(ones)  # a real NCCL collective
        assert ones.tolist() == [1.0] * 4
        mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp_shard",))
        args = small_args("residual_mlp")
        parallelism = Parallelism(fsdp_single_process=True)

        # fp32: the sharded model is the unsharded one (same init, loss, gradients, clipped norm).
        with torch.device("meta"):
            sharded = build_model(args)
        parallelize_model(sharded, training=Training(mixed_precision="fp32"), ac=ActivationCheckpoint(),
                          float8=Float8(), parallelism=parallelism, mesh=mesh, device=device)
        materialize_and_init(sharded, device, seed=5, mesh=mesh)
        assert all(isinstance(p, DTensor) for p in sharded.parameters())
        plain = build_model(args).to(device)
        plain.load_state_dict(reference_state_dict(args, 5))
        x, y = batch(device)
        losses = []
        for model in (sharded, plain):
            loss = model(x, targets=y, loss_chunk_tokens=4096)
            loss.backward()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)
        assert float(clip_grad_norm(sharded.parameters(), 1.0)) == pytest.approx(float(clip_grad_norm(plain.parameters(), 1.0)),
                                                                          rel=1e-4)
        for (name, p), q in zip(sharded.named_parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-4, atol=1e-6, msg=name)

        # bf16 compute (FSDP's MixedPrecisionPolicy) with compiled blocks, as a multi-GPU run trains.
        with torch.device("meta"):
            fast = build_model(args)
        parallelize_model(fast, training=Training(mixed_precision="bf16", compile=True), ac=ActivationCheckpoint(),
                          float8=Float8(), parallelism=parallelism, mesh=mesh, device=device)
        materialize_and_init(fast, device, seed=5, mesh=mesh)
        torch._dynamo.reset()
        loss = fast(x, targets=y, loss_chunk_tokens=4096)
        loss.backward()
        assert math.isfinite(loss.item()) and loss.item() == pytest.approx(losses[1], rel=5e-2)
        assert_finite_gradients(fast)
        torch._dynamo.reset()
    finally:
        dist.destroy_process_group()


@pytest.mark.integration  # compiles gpt_small and trains a few 491,520-token steps per row: minutes
def test_gpu_check_on_the_default_profile(tmp_path: Path) -> None:
    out_json, steps, warmup = tmp_path / "gpu_check.json", 3, 2
    # As from the repository root (the benchmarks package is not installed), in a folder of its own.
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--steps", str(steps),
                           "--warmup", str(warmup), "--json", str(out_json)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=3600, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    data = json.loads(out_json.read_text())
    assert list(tmp_path.iterdir()) == [out_json]  # the run folders were temporary
    capability = tuple(map(int, data["device"]["capability"].split(".")))
    float8 = capability >= MIN_CAPABILITY
    profile = load_job_config([str(REPO / "train_configs/gpt_small_res_gelu.toml")]).training
    rows = data["rows"]
    expected = [(q, f8) for q in ("linear", "residual_mlp") for f8 in ((False, True) if float8 else (False,))]
    assert [(r["query_type"], r["float8"]) for r in rows] == expected
    assert data["device"]["memory_bytes"] == torch.cuda.get_device_properties(0).total_memory
    for row in rows:
        assert row["error"] is None, row["error"]
        assert row["precision"] == "bf16 autocast" and row["compile"] and row["compile_backend"] == "inductor"
        # the profile's micro-batch, or a smaller one with more accumulation (same tokens) where it did not fit
        assert row["seq_len"] == profile.seq_len
        assert row["micro_batch_size"] * row["grad_accum_steps"] == profile.micro_batch_size * profile.grad_accum_steps
        assert row["tokens_per_step"] == row["micro_batch_size"] * profile.seq_len * row["grad_accum_steps"]
        assert all(math.isfinite(v) for v in row["losses"]) and len(row["losses"]) == warmup + steps + 1
        assert row["graph_breaks"] == 0 and row["recompiles"] == 0, row["graph_break_reasons"]
        assert row["step_ms"] == pytest.approx(statistics.median(row["step_ms_all"]))
        assert row["tokens_per_s"] == pytest.approx(row["tokens_per_step"] / (row["step_ms"] / 1000))
        assert row["tflops"] == pytest.approx(row["flops_per_token"] * row["tokens_per_s"] / 1e12)
        peak = data["device"]["peak_bf16_tflops"]
        assert (row["mfu"] is None) == (peak is None)
        if peak is not None:
            assert row["mfu"] == pytest.approx(row["tflops"] / peak)
        assert 0 < row["peak_memory_bytes"] <= row["capacity_bytes"]
        assert 0 <= row["data_share"] < 1
        assert row["verdict"] == ("; ".join(row["problems"]) or "ok")
    ok = sum(not r["problems"] for r in rows)
    assert "| query |" in done.stdout and f"{ok} of {len(rows)} rows ok" in done.stdout
