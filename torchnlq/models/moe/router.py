"""The MoE router: which experts each token goes to, with which weights, and the losses and statistics of that.

Scores are the softmax over all experts in fp32 (as Qwen3-MoE and OLMoE); the chosen experts are the top_k of the
scores plus a per-expert bias (DeepSeek-V3's auxiliary-loss-free balancing; zero unless ``bias_update_rate``),
weighted by their unbiased probabilities, renormalised to sum to 1 with ``router = "softmax_normalized"``.
Training adds the load-balancing and z losses to the gradient, not to the loss a run logs
(:class:`AddToGradient`); what the loop logs (each expert's load, the router's entropy, the losses) is kept in
buffers that the trainer reads and clears once per step (:func:`~torchnlq.models.moe.balance.step_statistics`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn as nn

from .config import MoE


class AddToGradient(torch.autograd.Function):
    """``output`` unchanged; in backward, ``loss`` (a scalar of the graph) receives the gradient ``scale``, as if
    ``scale · loss`` had been added to the objective (Megatron's MoEAuxLossAutoScaler). The loss a run logs stays the
    language model's; the router's losses still train it."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, loss: torch.Tensor,  # type: ignore[override]
                scale: float) -> torch.Tensor:
        ctx.save_for_backward(loss)
        ctx.scale = scale
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        (loss,) = ctx.saved_tensors
        return grad, torch.full_like(loss, ctx.scale), None


class Router(nn.Module):
    """``gate``: dim -> n_experts logits; :meth:`forward` gives each token's experts and their weights."""

    component: ClassVar[str] = "router"  # parameter roles (models/roles.py)

    def __init__(self, dim: int, cfg: MoE, logit_multiplier: float = 1.0) -> None:
        super().__init__()
        #: µP's 1/m on the logits (a readout of the width: models/mup.py); 1 under the standard parametrization.
        self.logit_multiplier = logit_multiplier
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.normalize = cfg.router == "softmax_normalized"
        self.aux_loss_coef, self.z_loss_coef, self.bias_update_rate = cfg.aux_loss_coef, cfg.z_loss_coef, \
            cfg.bias_update_rate
        self.gate = nn.Linear(dim, cfg.n_experts, bias=False)
        #: DeepSeek-V3's choosing bias (a checkpointed buffer: a resume continues its balance exactly).
        self.register_buffer("expert_bias", torch.empty(cfg.n_experts))
        # This step's statistics, summed over its micro-batches (not checkpointed: cleared after every step).
        self.register_buffer("tokens_per_expert", torch.empty(cfg.n_experts), persistent=False)
        self.register_buffer("sums", torch.empty(5), persistent=False)  # forwards, tokens, entropy, aux loss, z loss

    def init_weights(self, init_std: float) -> None:
        """The gate N(0, init_std); the bias and the statistics zero."""
        nn.init.normal_(self.gate.weight, mean=0.0, std=init_std)
        with torch.no_grad():
            self.expert_bias.zero_()
            self.tokens_per_expert.zero_()
            self.sums.zero_()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(experts [N, top_k], weights [N, top_k] in x's dtype, the router's training loss or None) of tokens
        x [N, dim]."""
        logits = self.gate(x).to(torch.promote_types(x.dtype, torch.float32))  # bf16 scores in fp32, as Qwen3-MoE
        if self.logit_multiplier != 1.0:
            logits = logits * self.logit_multiplier
        probs = logits.softmax(dim=-1)
        if self.bias_update_rate:  # the bias chooses; the probabilities weigh
            experts = (probs + self.expert_bias).topk(self.top_k, dim=-1).indices
            weights = probs.gather(-1, experts)
        else:
            weights, experts = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        counts = torch.zeros_like(self.tokens_per_expert).index_add_(
            0, experts.flatten(), torch.ones(experts.numel(), dtype=self.tokens_per_expert.dtype, device=x.device))
        loss = self._losses(logits, probs, counts) if torch.is_grad_enabled() and self.training else None
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
            self.sums[0].add_(1)
            self.sums[1].add_(x.shape[0])
            self.sums[2].add_(-(probs * probs.clamp_min(torch.finfo(probs.dtype).tiny).log()).sum())
        return experts, weights.to(x.dtype), loss

    def _losses(self, logits: torch.Tensor, probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor | None:
        """The load-balancing loss (coef · E · sum_i f_i P_i) plus the z-loss (coef · mean logsumexp²), or None."""
        total = None
        if self.aux_loss_coef:
            share = counts / counts.sum()  # f_i: a constant (no gradient through the choice)
            aux = self.aux_loss_coef * self.n_experts * (share * probs.mean(dim=0)).sum()
            total = aux
            with torch.no_grad():
                self.sums[3].add_(aux.detach())
        if self.z_loss_coef:
            z = self.z_loss_coef * torch.logsumexp(logits, dim=-1).square().mean()
            total = z if total is None else total + z
            with torch.no_grad():
                self.sums[4].add_(z.detach())
        return total

    def extra_repr(self) -> str:
        router = "softmax_normalized" if self.normalize else "softmax"
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, router={router}, aux_loss_coef={self.aux_loss_coef}, "
                f"z_loss_coef={self.z_loss_coef}, bias_update_rate={self.bias_update_rate}")
