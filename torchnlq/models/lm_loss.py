"""The LM head and the cross-entropy: from full logits, or a chunk of tokens at a time.

:class:`HeadLoss` is the model's loss (``Decoder.forward(tokens, targets=...)``): with ``chunk_tokens = 0`` the
full logits and ``F.cross_entropy``; with ``chunk_tokens > 0`` :func:`linear_cross_entropy`, described below.
It is a module without parameters so that ``torch.compile`` is applied to it from outside, as to the blocks
(``parallel/parallelize.py``); both paths compile whole (dynamo traces the autograd.Function below).

At 12 x 1024 tokens and a 50,304-token vocabulary the logits are the largest activation of a
training step: the head's output, its fp32 copy for the loss, the softmax kept for backward and
the gradient of the logits are each ``tokens x vocab``, several GB together. This computes the
mean cross-entropy of ``hidden @ weight.T`` without ever holding more than ``chunk_tokens`` rows
of logits: for each chunk it forms the logits, their log-sum-exp and loss, and at once their
gradient ``softmax - onehot``, which it turns into the chunk's gradient of ``hidden`` and its
contribution to the gradient of ``weight`` (the same two matmuls the plain backward does). The
backward pass then only scales those by the incoming gradient. What stays alive between forward
and backward is ``grad_hidden`` (``tokens x dim``) and ``grad_weight`` (the weight's size), instead
of the logits.

The loss is the mean over the tokens whose target is not ``ignore_index``, in fp32 whatever the
input dtype, as ``F.cross_entropy(logits.float(), targets)``; gradients come back in the dtypes of
``hidden`` and ``weight``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

#: Rows of logits formed at a time: 4096 x 50,304 fp32 is 0.8 GB on a GPU, a few percent of the plain path's.
DEFAULT_CHUNK_TOKENS = 4096


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss forward with the gradients of ``hidden`` and ``weight`` computed chunk by chunk (see module doc)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
        chunk_tokens: int, ignore_index: int,
    ) -> torch.Tensor:
        need_grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        valid = targets != ignore_index
        count = valid.sum().clamp(min=1).to(torch.float32)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_grads else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_grads else None
        for start in range(0, hidden.shape[0], chunk_tokens):
            h = hidden[start : start + chunk_tokens]
            t = targets[start : start + chunk_tokens]
            ok = valid[start : start + chunk_tokens]
            logits = (h @ weight.T).float()
            lse = torch.logsumexp(logits, dim=-1)
            safe_t = torch.where(ok, t, torch.zeros_like(t))
            picked = logits.gather(1, safe_t[:, None]).squeeze(1)
            loss += torch.where(ok, lse - picked, torch.zeros_like(lse)).sum()
            if need_grads:
                # d(mean loss)/d logits = (softmax - onehot) / count, zero on ignored rows; in place on the logits.
                grad = logits.sub_(lse[:, None]).exp_()
                grad[torch.arange(len(t), device=t.device), safe_t] -= 1.0
                grad.mul_((ok.to(grad.dtype) / count)[:, None])
                grad = grad.to(hidden.dtype)
                grad_hidden[start : start + chunk_tokens] = grad @ weight
                if grad.dtype == torch.float32:
                    grad_weight.addmm_(grad.T, h)
                else:  # a bf16 matmul, accumulated over the chunks in fp32
                    grad_weight.add_(grad.T @ h)
        if need_grads:
            ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss / count

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_loss: torch.Tensor):  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        scale_h, scale_w = grad_loss.to(grad_hidden.dtype), grad_loss.to(grad_weight.dtype)
        return grad_hidden * scale_h, grad_weight * scale_w, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS, ignore_index: int = -100,
) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``, never forming all the logits at once.

    ``hidden`` is ``[..., dim]``, ``targets`` the matching ``[...]`` token ids; ``weight`` is the
    head's ``[vocab, dim]``. Equal to ``F.cross_entropy((hidden @ weight.T).float().flatten(0, -2),
    targets.flatten(), ignore_index=ignore_index)``, with the same gradients (to float rounding).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be at least 1")
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1),
                                     chunk_tokens, ignore_index)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32, whatever the autocast dtype (``[..., vocab]`` logits)."""
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


@dataclass(frozen=True)
class LossPath:
    """One way to compute the head's loss: its function and what it holds."""

    #: (hidden, weight, targets, chunk_tokens) -> the mean cross-entropy.
    loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
    #: Its words for the run header and the model summary, given the chunk size.
    describe: Callable[[int], str]
    #: Whether a compiled step fuses the fp32 upcast and the softmax into the kernels that read the logits (the
    #: memory estimate models that), rather than running the path as written.
    fused_when_compiled: bool


#: The head's loss paths, by name: ``training.loss_chunk_tokens`` 0 is the full logits, more is chunked.
LOSS_PATHS: dict[str, LossPath] = {
    "full": LossPath(lambda hidden, weight, targets, chunk: cross_entropy(F.linear(hidden, weight), targets),
                     lambda chunk: "from the full logits", fused_when_compiled=True),
    "chunked": LossPath(linear_cross_entropy, lambda chunk: f"in {chunk}-token chunks", fused_when_compiled=False),
}


def loss_path(chunk_tokens: int) -> LossPath:
    """The loss path of a chunk size (0: the full logits)."""
    return LOSS_PATHS["chunked" if chunk_tokens else "full"]


class HeadLoss(nn.Module):
    """``forward(hidden, weight, targets, chunk_tokens)``: the mean cross-entropy of ``hidden @ weight.T``.

    ``chunk_tokens = 0`` forms the full logits; more computes them that many tokens at a time
    (:func:`linear_cross_entropy`: the same loss and gradients, holding one chunk of logits).
    """

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_tokens: int) -> torch.Tensor:
        return loss_path(chunk_tokens).loss(hidden, weight, targets, chunk_tokens)
