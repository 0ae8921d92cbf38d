"""The moe family's standard Hugging Face architecture both ways: Qwen3-MoE (``Qwen3MoeForCausalLM``).

Qwen3-MoE is Qwen3's block (RMSNorm, RoPE, QK-norm, no biases) whose MLP, in its sparse layers, is a softmax
router over SwiGLU experts: torchnlq's moe family with a linear query, no shared experts and no choosing bias.
Its sparse layers are those whose index + 1 is a multiple of ``decoder_sparse_step`` and not in
``mlp_only_layers``: torchnlq's ``moe.every`` and ``moe.first_dense`` (the dense layers first). The attention,
norms and embeddings map as Qwen3's (models/dense/hf.py); each expert is written as Hugging Face stores it on disk
(``mlp.experts.<e>.gate_proj`` / ``up_proj`` / ``down_proj``), the router as ``mlp.gate``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ..args import MODEL_FIELDS, ModelArgs, recorded_fields
from ..dense.hf import (
    DECODER_FIELDS,
    LLAMA_LAYER_NAMES,
    QWEN3_BLOCK,
    block_incompatibility,
    decoder_config,
    decoder_model_args,
    llama_state_dict,
    no_sliding_window,
    read_attention,
    read_embeddings,
    read_layer_names,
)
from ..errors import UserError
from ..hf_mapping import HFArchitecture, Take
from ..recorded import Field, check_record, integer
from .block import expert_hidden, is_moe_layer
from .config import MoE

MOE_FIELDS = recorded_fields(MoE)
#: torchnlq's router choices and Qwen3-MoE's norm_topk_prob.
NORMALIZED = {"softmax": False, "softmax_normalized": True}
#: The Qwen3MoeConfig keys torchnlq reads, each checked as the field it becomes (others are ignored).
QWEN3_MOE_FIELDS = {
    **DECODER_FIELDS, "moe_intermediate_size": MODEL_FIELDS["mlp_hidden"], "num_experts": MOE_FIELDS["n_experts"],
    "num_local_experts": MOE_FIELDS["n_experts"], "num_experts_per_tok": MOE_FIELDS["top_k"],
    "norm_topk_prob": Field(bool), "decoder_sparse_step": MOE_FIELDS["every"],
    "mlp_only_layers": Field(list, values=integer(0)), "router_aux_loss_coef": MOE_FIELDS["aux_loss_coef"],
    "use_sliding_window": Field(bool), "sliding_window": integer(0, null=True),
    "max_window_layers": integer(0, null=True),
}
#: The dense layers' MLP names, which the MoE layers do not have.
_DENSE_MLP = {ours for ours in LLAMA_LAYER_NAMES if ours.startswith("mlp.")}
_EXPERT_NAMES = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


def qwen3_moe_incompatibility(args: ModelArgs) -> str | None:
    """Why ``Qwen3MoeForCausalLM`` cannot compute this model, or None when it can."""
    block = block_incompatibility(args, "Qwen3-MoE", QWEN3_BLOCK,
                                  "RoPE, RMSNorm, SwiGLU experts without biases and QK-norm (model.qk_norm = true)")
    if block:
        return block
    fallback = "; export with --format hf (any model) or --format safetensors"
    if args.moe.n_shared_experts:
        return f"model.moe.n_shared_experts={args.moe.n_shared_experts}: Qwen3-MoE has no shared experts{fallback}"
    if args.moe.bias_update_rate:
        return (f"model.moe.bias_update_rate={args.moe.bias_update_rate}: Qwen3-MoE chooses experts by their "
                f"probabilities alone, with no balancing bias{fallback}")
    return None


def hf_aux_loss_coef(moe: MoE) -> float:
    """Qwen3-MoE's ``router_aux_loss_coef`` that gives a layer torchnlq's balancing loss: transformers'
    ``load_balancing_loss_func`` counts each of a token's top_k choices (its f_i sum to top_k, torchnlq's to 1), so its
    term is top_k times torchnlq's and the coefficient is divided by top_k (the import multiplies it back). Over
    several MoE layers transformers averages the layers' counts and probabilities before the product, torchnlq sums
    the layers' losses: the two then differ by more than a coefficient (docs/models.md)."""
    return moe.aux_loss_coef / moe.top_k


def qwen3_moe_config(args: ModelArgs) -> dict[str, Any]:
    """The Hugging Face Qwen3MoeConfig keys of this model: full attention in every layer."""
    moe = args.moe
    return {
        **decoder_config(args), "moe_intermediate_size": expert_hidden(args), "num_experts": moe.n_experts,
        "num_experts_per_tok": moe.top_k, "norm_topk_prob": NORMALIZED[moe.router],
        "decoder_sparse_step": moe.every, "mlp_only_layers": list(range(moe.first_dense)),
        "router_aux_loss_coef": hf_aux_loss_coef(moe), "output_router_logits": False, "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": args.n_layers,
    }


def qwen3_moe_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """torchnlq weights under Qwen3MoeForCausalLM's names (as save_pretrained writes them), fp32: Llama's names for
    all but the MoE layers' MLPs (which hold no dense MLP weights), then their routers and experts."""
    out = llama_state_dict(model)
    for i, layer in enumerate(model.layers):
        if is_moe_layer(model.args, i):
            dst = f"model.layers.{i}.mlp."
            out[dst + "gate.weight"] = layer.mlp.router.gate.weight.detach().float()
            for ours, theirs in _EXPERT_NAMES.items():
                for e, weight in enumerate(getattr(layer.mlp.experts, ours).detach().float()):
                    out[dst + f"experts.{e}.{theirs}.weight"] = weight
    return out


def qwen3_moe_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a Qwen3MoeConfig dict, checked against :data:`QWEN3_MOE_FIELDS`."""
    c = check_record(config, QWEN3_MOE_FIELDS, "")
    if c.get("attention_bias", False):
        raise UserError("Qwen3-MoE attention_bias = true: torchnlq's Qwen3 blocks have no biases")
    no_sliding_window(c, config["num_hidden_layers"], "Qwen3-MoE")
    dense = sorted(set(c.get("mlp_only_layers", [])))
    if dense != list(range(len(dense))):
        raise UserError(f"Qwen3-MoE mlp_only_layers={dense}: torchnlq's dense layers are the first ones "
                        "(model.moe.first_dense); this model's are not")
    experts = c.get("num_experts", c.get("num_local_experts"))
    if experts is None:
        raise KeyError("num_experts")
    moe = MoE(n_experts=experts, top_k=config["num_experts_per_tok"], expert_hidden=config["moe_intermediate_size"],
              router="softmax_normalized" if c.get("norm_topk_prob", False) else "softmax",
              aux_loss_coef=c.get("router_aux_loss_coef", 0.001) * config["num_experts_per_tok"],  # hf_aux_loss_coef
              every=c.get("decoder_sparse_step", 1),
              first_dense=len(dense), bias_update_rate=0.0, z_loss_coef=0.0)
    if moe.top_k > moe.n_experts:
        raise UserError(f"Qwen3-MoE num_experts_per_tok={moe.top_k} exceeds num_experts={moe.n_experts}")
    return decoder_model_args(c, config, "Qwen3-MoE", qk_norm=True, bias=False, family="moe", moe=moe)


def qwen3_moe_read_state_dict(args: ModelArgs, take: Take) -> dict[str, torch.Tensor]:
    """The torchnlq state dict of a Qwen3-MoE folder's weights (experts stacked per layer)."""
    d, hidden, n = args.dim, expert_hidden(args), args.moe.n_experts
    sd = read_embeddings(args, take)
    shapes = {"gate_proj": (hidden, d), "up_proj": (hidden, d), "down_proj": (d, hidden)}
    for i in range(args.n_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        moe = is_moe_layer(args, i)
        names = {k: v for k, v in LLAMA_LAYER_NAMES.items() if not (moe and k in _DENSE_MLP)}
        sd |= read_attention(args, take, src, dst) | read_layer_names(args, take, src, dst, names)
        if moe:
            sd[dst + "mlp.router.gate.weight"] = take(src + "mlp.gate.weight", (n, d))
            sd[dst + "mlp.router.expert_bias"] = torch.zeros(n)
            for ours, theirs in _EXPERT_NAMES.items():
                sd[dst + f"mlp.experts.{ours}"] = torch.stack(
                    [take(src + f"mlp.experts.{e}.{theirs}.weight", shapes[ours]) for e in range(n)])
    return sd


QWEN3_MOE = HFArchitecture("hf-qwen3-moe", "Qwen3MoeForCausalLM", "qwen3_moe", qwen3_moe_incompatibility,
                           qwen3_moe_config, qwen3_moe_state_dict, qwen3_moe_model_args, qwen3_moe_read_state_dict)
