"""Apply parallelism to a Decoder from outside: float8 -> activation checkpointing -> compile -> the family's own
(its runtime's parallelize hook: an MoE's experts) -> FSDP2.

The order matters: float8 swaps ``nn.Linear`` modules first; compile traces the checkpointed forward and,
before FSDP, keeps each compiled block compute only. None of these changes a parameter name or state_dict key.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from torchnlq.config.job_config import ActivationCheckpoint, Float8, Parallelism, Training
from torchnlq.models.family import build_model, get_family
from torchnlq.models.rope import RotaryEmbedding
from torchnlq.parallel.activation_checkpoint import apply_activation_checkpointing
from torchnlq.parallel.float8 import apply_float8


def apply_compile(model: nn.Module, fullgraph: bool = True, backend: str = "inductor") -> nn.Module:
    """``torch.compile`` each block of ``model.layers`` and the head's loss (``model.head_loss``) in place (no
    ``_orig_mod.`` wrapper to change the keys)."""
    for block in model.layers:
        block.compile(fullgraph=fullgraph, backend=backend)
    model.head_loss.compile(fullgraph=fullgraph, backend=backend)
    return model


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype, reduce_dtype: torch.dtype,
               reshard_after_forward: bool, ignored: set[nn.Parameter] | None = None) -> nn.Module:
    """FSDP2 ``fully_shard`` each block, then the root; a 2-D mesh (replicate, shard) gives HSDP. ``ignored``:
    parameters sharded otherwise (expert parallelism's)."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    last = len(model.layers) - 1
    for index, block in enumerate(model.layers):  # backward needs the last block first: never reshard it
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward and index < last,
                    ignored_params=ignored)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward,
                ignored_params=ignored)
    return model


def parallelize_model(model: nn.Module, *, training: Training, ac: ActivationCheckpoint, float8: Float8,
                      parallelism: Parallelism, mesh: DeviceMesh | None, device: torch.device) -> nn.Module:
    """Apply float8, activation checkpointing, compile and (with a mesh) FSDP2, in that order (see module doc)."""
    apply_float8(model, float8, device)
    apply_activation_checkpointing(model, ac)
    if training.compile:
        apply_compile(model, fullgraph=True)
    if mesh is not None:
        # The family's own parallelism first (an MoE's experts split over the processes: torchtitan's
        # parallelize_fn), on the meta model; FSDP shards the rest.
        sharded = get_family(model.args.family).runtime.parallelize(model, mesh, parallelism)
        # bf16 compute with fp32 reductions on CUDA with bf16; else fp32 throughout.
        bf16 = device.type == "cuda" and training.mixed_precision == "bf16"
        apply_fsdp(model, mesh, torch.bfloat16 if bf16 else torch.float32, torch.float32,
                   parallelism.reshard_after_forward, sharded or None)
    return model


def reference_state_dict(args: object, seed: int) -> dict[str, torch.Tensor]:
    """The state dict of ``torch.manual_seed(seed); build_model(args)`` on the CPU, leaving the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            return build_model(args).state_dict()


@torch.no_grad()
def materialize_and_init(model: nn.Module, device: torch.device, seed: int, mesh: DeviceMesh | None) -> nn.Module:
    """Allocate a meta-built (possibly sharded) model on ``device`` and initialise it, leaving the global RNG alone.

    The weights equal ``torch.manual_seed(seed); build_model(args)`` on the CPU, bit for bit, on any device and world
    size (CUDA's generator draws other numbers); with a mesh, rank 0 builds them and broadcasts them.
    """
    model.to_empty(device=device)
    if mesh is None and device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model.init_weights()
        return model
    if mesh is None:
        model.load_state_dict(reference_state_dict(model.args, seed))
    else:
        full = reference_state_dict(model.args, seed) if dist.get_rank() == 0 else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full, options=options)
    for module in model.modules():  # non-persistent buffers (the RoPE tables) are in no state dict
        if isinstance(module, RotaryEmbedding):
            module.init_weights()
    return model


def clip_grad_norm(model_params: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradients' global L2 norm to ``max_norm`` (0: measure only); return the unclipped norm (on device)."""
    params = [p for p in model_params if p.grad is not None]
    grads = [p.grad for p in params]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if isinstance(total, DTensor):  # FSDP: reduce the shards' partial norm, so every rank clips alike
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Reduce-scatter gradients in the next backward (True) or keep accumulating locally (False); FSDP only."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled, recurse=True)
