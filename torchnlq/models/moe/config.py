"""The moe family's ``[model.moe]`` section: its options, declared once (the family registers them as a section of
``[model]`` and of ModelArgs: models/sections.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import LIMITS, option

#: ``model.moe.router``: how the router turns its logits into the weights of the chosen experts.
ROUTER_SCORES = ("softmax", "softmax_normalized")


@dataclass
class MoE:
    """Routed SwiGLU experts (Qwen3-MoE / OLMoE style; the moe family reads them): each token to top_k of n_experts."""

    n_experts: int = option(8, "Routed experts per MoE layer.", min=1, max=4096)
    top_k: int = option(2, "Experts each token is sent to (at most n_experts).", min=1, max=4096)
    expert_hidden: int | None = option(
        None, "Hidden size of each expert's SwiGLU MLP; unset means model.mlp_hidden.", min=1, max=LIMITS["mlp_hidden"],
        width=True)
    n_shared_experts: int = option(
        0, "Shared experts every token also passes through (DeepSeek's), as one SwiGLU MLP of n_shared_experts x "
        "expert_hidden units.", min=0, max=64)
    router: str = option(
        "softmax",
        "softmax: the top_k experts of the softmax over all experts, weighted by their probabilities (Qwen3-MoE, "
        "OLMoE); softmax_normalized: those weights renormalised to sum to 1 (Mixtral; Qwen3-MoE's norm_topk_prob).",
        choices=ROUTER_SCORES,
    )
    aux_loss_coef: float = option(
        0.01, "Load-balancing loss (Switch/GShard): coef · n_experts · sum_i f_i · P_i, f_i the share of the routed "
        "tokens expert i gets, P_i its mean router probability (coef at an even load); 0 turns it off.", min=0.0)
    bias_update_rate: float = option(
        0.0, "Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores for choosing (not "
        "for weighting), moved by this much after each step toward the mean load; 0 is off (DeepSeek: 0.001).",
        min=0.0)
    z_loss_coef: float = option(
        0.0, "Router z-loss (ST-MoE): coef · mean over tokens of logsumexp(router logits)^2; 0 turns it off.", min=0.0)
    every: int = option(
        1, "MoE layers are those whose index + 1 is a multiple of this (Qwen3-MoE's decoder_sparse_step), from "
        "first_dense on; the others are dense.", min=1)
    first_dense: int = option(0, "Leading layers that stay dense (Qwen3-MoE's mlp_only_layers, DeepSeek's "
                                 "first_k_dense_replace).", min=0)
