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


def moe_warnings(args: ModelArgs) -> list[str]:
    """The [model.moe] settings that change nothing in this model: with top_k = n_experts every token goes to every
    expert, so nothing is chosen (a choosing bias, a balancing loss that is then the constant coef, a renormalisation
    of probabilities that already sum to 1); with one expert its router weight is always 1 (a z-loss moves nothing)."""
    moe, said = args.moe, []
    if moe.top_k == moe.n_experts:
        every = (f"model.moe.top_k = n_experts = {moe.n_experts}: every token goes to every expert, so nothing is "
                 "chosen and")
        fix = "lower top_k (or raise n_experts) for routing"
        if moe.bias_update_rate > 0:
            said.append(f"{every} model.moe.bias_update_rate = {moe.bias_update_rate:g} (a bias for choosing) has "
                        f"no effect; {fix}, or set bias_update_rate = 0")
        if moe.aux_loss_coef > 0:
            said.append(f"{every} model.moe.aux_loss_coef = {moe.aux_loss_coef:g} (the load-balancing loss, then the "
                        f"constant {moe.aux_loss_coef:g}, gradient 0) has no effect; {fix}, or set aux_loss_coef = 0")
        if moe.router == "softmax_normalized":
            said.append(f"{every} model.moe.router = 'softmax_normalized' has no effect (the probabilities of all "
                        f"experts already sum to 1); {fix}, or use router = 'softmax'")
    if moe.n_experts == 1 and moe.z_loss_coef > 0:
        said.append(f"model.moe.z_loss_coef = {moe.z_loss_coef:g} has no effect with model.moe.n_experts = 1 (the one "
                    "expert's router weight is always 1); raise n_experts, or set z_loss_coef = 0")
    return said


def describe_moe(args: ModelArgs) -> str:
    """The experts in words: "2 of 2 layers route to top 2 of 4 experts"."""
    moe, layers = args.moe, sum(is_moe_layer(args, layer) for layer in range(args.n_layers))
    shared = f" + {moe.n_shared_experts} shared" if moe.n_shared_experts else ""
    return f"{layers} of {args.n_layers} layers route to top {moe.top_k} of {moe.n_experts} experts{shared}"


MOE_FAMILY = register_family(Family(
    name="moe", block=MoEBlock, description="pre-norm blocks whose MLP routes each token to top_k of n_experts",
    sections={"moe": MoE}, check=check_moe, hf_architectures=(QWEN3_MOE,), describe=describe_moe, warnings=moe_warnings,
    runtime=MoERuntime(),
))
FLAVORS.update(MOE_FLAVORS)

__all__ = ["MOE_FAMILY", "MoE", "MoEBlock"]
