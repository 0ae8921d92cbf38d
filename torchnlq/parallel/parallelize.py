"""Apply parallelism to a GPT from outside: float8 -> activation checkpointing -> compile -> FSDP2.

The model knows nothing of this; every function takes the model and only its
own config section. The order matters:

1. float8 first: it swaps ``nn.Linear`` modules, and everything after must see
   (checkpoint, compile, shard) the final modules, not ones about to be replaced.
2. Activation checkpointing next, so that compile traces the checkpointed
   forward and its partitioner applies the recompute policy inside the graph.
3. compile before FSDP, so each compiled block is one graph of compute only;
   FSDP's all-gather / reduce-scatter hooks are added afterwards per block.
4. FSDP2 last: it shards the parameters of exactly the modules above, block by
   block (one all-gather per block), then the root (embeddings, final norm, head).

None of these wraps changes a parameter name or a ``state_dict`` key.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from torchnlq.config.job_config import (
    ActivationCheckpoint,
    Float8,
    Parallelism,
    Training,
)
from torchnlq.models.gpt import GPT
from torchnlq.models.rope import RotaryEmbedding
from torchnlq.parallel.activation_checkpoint import apply_activation_checkpointing
from torchnlq.parallel.float8 import apply_float8, convert_to_float8

__all__ = [
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_float8",
    "apply_fsdp",
    "clip_grad_norm",
    "convert_to_float8",
    "materialize_and_init",
    "mixed_precision_dtypes",
    "parallelize_model",
    "reference_state_dict",
    "set_gradient_sync",
]


def apply_compile(model: nn.Module, fullgraph: bool = True, backend: str = "inductor") -> nn.Module:
    """``torch.compile`` each block of ``model.layers`` in place.

    ``Module.compile`` compiles the block's ``__call__`` without wrapping it in an
    ``OptimizedModule`` (which would add ``_orig_mod.`` to every key); names and
    ``state_dict`` keys stay those of the eager model. All blocks share one code
    object, so dynamo compiles once and reuses the graph for the other blocks.
    ``backend`` is inductor for training; the graph-break tests trace with a cheaper
    one (dynamo's graph breaks and recompiles do not depend on the backend).
    """
    for block in model.layers:
        block.compile(fullgraph=fullgraph, backend=backend)
    return model


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: bool,
) -> nn.Module:
    """FSDP2 ``fully_shard`` each block, then the root; a 2-D mesh (replicate, shard) gives HSDP.

    Parameters are all-gathered in ``param_dtype`` and gradients reduced in
    ``reduce_dtype``. The last block is never resharded after forward: backward
    needs it first, so freeing it would only force an immediate re-gather.
    """
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    last = len(model.layers) - 1
    for index, block in enumerate(model.layers):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward and index < last)
    # The root holds the token/position embeddings, the final norm and the (tied or untied) head.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def mixed_precision_dtypes(training: Training, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """(param_dtype, reduce_dtype): bf16 compute with fp32 reductions on CUDA with bf16; else fp32/fp32."""
    if device.type == "cuda" and training.mixed_precision == "bf16":
        return torch.bfloat16, torch.float32
    return torch.float32, torch.float32


def parallelize_model(
    model: nn.Module,
    *,
    training: Training,
    ac: ActivationCheckpoint,
    float8: Float8,
    parallelism: Parallelism,
    mesh: DeviceMesh | None,
    device: torch.device,
) -> nn.Module:
    """Apply float8, activation checkpointing, compile and (with a mesh) FSDP2, in that order (see module doc).

    Build the model on the meta device, call this, then :func:`materialize_and_init`.
    """
    apply_float8(model, float8, device)
    apply_activation_checkpointing(model, ac)
    if training.compile:
        apply_compile(model, fullgraph=True)
    if mesh is not None:
        param_dtype, reduce_dtype = mixed_precision_dtypes(training, device)
        apply_fsdp(model, mesh, param_dtype, reduce_dtype, parallelism.reshard_after_forward)
    return model


def reference_state_dict(args: object, seed: int) -> dict[str, torch.Tensor]:
    """The state dict of ``torch.manual_seed(seed); GPT(args)`` built on the CPU, leaving the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            return GPT(args).state_dict()


def _recompute_buffers(model: nn.Module) -> None:
    """Non-persistent buffers (the RoPE tables) are in no state dict: recompute them on this rank."""
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.init_weights()


@torch.no_grad()
def materialize_and_init(model: nn.Module, device: torch.device, seed: int, mesh: DeviceMesh | None) -> nn.Module:
    """Allocate a meta-built (and possibly sharded) model on ``device`` and initialise it.

    The weights equal ``torch.manual_seed(seed); GPT(args)`` on the CPU, bit for
    bit, whatever the device and world size: initialising on the CPU makes the
    init independent of the hardware (CUDA's generator draws other numbers). Every
    path runs ``GPT.init_weights``, so ``args.init = "paper"`` (the paper's code's
    draws, which it too makes on the CPU) holds for sharded runs as well: rank 0 draws
    the full model and broadcasts it.
    The global RNG is left untouched, so every rank keeps the same RNG state.

    Memory: on CPU without a mesh nothing extra (init in place). Otherwise rank 0
    builds one full fp32 copy in CPU memory (4 bytes per parameter; ~0.5 GB for
    GPT-2 small); ``set_model_state_dict(broadcast_from_rank0=True)`` then sends it
    tensor by tensor, so each device holds its shard plus one full tensor at a time.
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
    _recompute_buffers(model)
    return model


def clip_grad_norm(model_params: Iterable[nn.Parameter], max_norm: float) -> float:
    """Clip the gradients' global L2 norm to ``max_norm`` (0: measure only) and return the norm before clipping.

    With FSDP the gradients are DTensor shards: the norm of the shards is a
    partial DTensor, and ``full_tensor()`` reduces it across ranks so that every
    rank clips with the same global norm.
    """
    params = [p for p in model_params if p.grad is not None]
    grads = [p.grad for p in params]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total.item()


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Reduce-scatter gradients in the next backward (True) or keep accumulating locally (False).

    The trainer disables sync for all micro-steps but the last: the unsharded
    gradients accumulate locally and are reduced once per optimizer step. A no-op
    for a model without FSDP.
    """
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled, recurse=True)
