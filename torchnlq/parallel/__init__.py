"""Parallelism applied from outside the model: process group and mesh (dist), float8,
activation checkpointing, compile and FSDP2 (parallelize). See docs/parallelism.md."""

from torchnlq.parallel.dist import (
    DistInfo,
    build_mesh,
    destroy_distributed,
    init_distributed,
)
from torchnlq.parallel.parallelize import (
    apply_activation_checkpointing,
    apply_compile,
    apply_float8,
    apply_fsdp,
    clip_grad_norm,
    convert_to_float8,
    materialize_and_init,
    parallelize_model,
    set_gradient_sync,
)

__all__ = [
    "DistInfo",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_float8",
    "apply_fsdp",
    "build_mesh",
    "clip_grad_norm",
    "convert_to_float8",
    "destroy_distributed",
    "init_distributed",
    "materialize_and_init",
    "parallelize_model",
    "set_gradient_sync",
]
