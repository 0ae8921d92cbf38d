"""The moe family: the dense block with routed SwiGLU experts in its MoE layers (``[model.moe]``), its flavors, and
the Hugging Face architecture that computes it (Qwen3-MoE)."""

from __future__ import annotations

from ..args import ModelArgs
from ..errors import ConfigError
from ..family import FLAVORS, Family, register_family
from .block import MoEBlock, is_moe_layer
from .config import MoE
from .flavors import MOE_FLAVORS
from .hf import QWEN3_MOE
from .runtime import MoERuntime


def check_moe(args: ModelArgs) -> None:
    """ConfigError for [model.moe] settings no model can have."""
    moe = args.moe
    if moe.top_k > moe.n_experts:
        raise ConfigError(f"model.moe.top_k={moe.top_k} exceeds model.moe.n_experts={moe.n_experts}: a token cannot "
                          "go to more experts than there are; lower top_k or raise n_experts")
    if not any(is_moe_layer(args, layer) for layer in range(args.n_layers)):
        raise ConfigError(f"model.moe.first_dense={moe.first_dense} and model.moe.every={moe.every} leave no MoE layer "
                          f"among the {args.n_layers} layers; lower them (or use model.family = 'dense')")


def describe_moe(args: ModelArgs) -> str:
    """The experts in words: "2 of 2 layers route to top 2 of 4 experts"."""
    moe, layers = args.moe, sum(is_moe_layer(args, layer) for layer in range(args.n_layers))
    shared = f" + {moe.n_shared_experts} shared" if moe.n_shared_experts else ""
    return f"{layers} of {args.n_layers} layers route to top {moe.top_k} of {moe.n_experts} experts{shared}"


MOE_FAMILY = register_family(Family(
    name="moe", block=MoEBlock, description="pre-norm blocks whose MLP routes each token to top_k of n_experts",
    sections={"moe": MoE}, check=check_moe, hf_architectures=(QWEN3_MOE,), describe=describe_moe,
    runtime=MoERuntime(),
))
FLAVORS.update(MOE_FLAVORS)

__all__ = ["MOE_FAMILY", "MoE", "MoEBlock"]
