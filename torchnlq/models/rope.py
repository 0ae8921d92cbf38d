"""Rotary position embeddings (RoPE), in the rotate-half form.

Channel pairs are (i, i + head_dim/2), not interleaved (2i, 2i+1): the head
vector x = [x1, x2] at position m becomes
``x * cos(m·θ) + [-x2, x1] * sin(m·θ)`` with θ_i = theta^(-2i/head_dim),
each frequency repeated for both halves. Rotating q at position m and k at
position n by these angles makes q·k depend only on m - n. (The interleaved /
complex form is the same function up to a fixed permutation of channels, which
the adjacent linear layers absorb.)

Llama 3's frequency scaling (``model.rope_scaling_factor``) divides the low frequencies
(wavelengths beyond ``original_max_seq_len / low_freq_factor``) by the factor, keeps the high
ones (below ``original_max_seq_len / high_freq_factor``) and interpolates between, as Meta's
reference code computes them.

The cos/sin tables are non-persistent buffers (not in checkpoints), recomputed by
:meth:`RotaryEmbedding.init_weights` so that a model materialised with ``to_empty`` gets them back.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from .args import ModelArgs


class RopeScaling(NamedTuple):
    """Llama 3's RoPE frequency scaling (the ``rope_scaling`` of a Hugging Face Llama-3.1+ config)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_seq_len: int


def rope_scaling(args: ModelArgs) -> RopeScaling | None:
    """The model's RoPE scaling, or None without (``rope_scaling_factor`` 1)."""
    if args.rope_scaling_factor == 1.0:
        return None
    return RopeScaling(args.rope_scaling_factor, args.rope_low_freq_factor, args.rope_high_freq_factor,
                       args.rope_original_max_seq_len)


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None, device: torch.device | None = None
                        ) -> torch.Tensor:
    """θ_i = theta^(-2i/head_dim), i < head_dim/2, in float64; scaled as Llama 3 does when ``scaling`` is given."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv_freq
    factor, low, high, original = scaling
    wavelength = 2 * math.pi / inv_freq
    # 0 where the wavelength exceeds original/low (fully scaled), 1 below original/high (kept).
    smooth = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def rope_at(
    positions: torch.Tensor, head_dim: int, theta: float, scaling: RopeScaling | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [*positions.shape, head_dim] for integer ``positions`` of any shape.

    Computed in float64, returned in ``dtype``: the rows of :class:`RotaryEmbedding`'s tables, bit for bit
    (for per-row positions of a left-padded batch).
    """
    inv_freq = inverse_frequencies(head_dim, theta, scaling, positions.device)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [..., head_dim/2]
    angles = torch.cat((angles, angles), dim=-1)  # the same angle for channel i and i + head_dim/2
    # float64 for the angles: m·θ at m ~ 1e4 loses digits in float32.
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """x·cos + sign·[-x2, x1]·sin, in three passes over x: one product, then each half's other term added in
    place (the halves of ``sin`` are equal: its first is used)."""
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-sign)
    out[..., half:].addcmul_(x[..., :half], sin[..., :half], value=sign)
    return out


class _RotateHalf(torch.autograd.Function):
    """The rotation and its backward, the rotation by −θ of the gradient: no activation is saved, only the tables
    (half the passes of autograd's own graph of the formula; docs/performance.md, "Around the model")."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, cos: torch.Tensor,  # type: ignore[override]
                sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, 1.0)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, -1.0), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape [B, T, H, head_dim] by tables cos, sin of shape [T, head_dim] (or [B, T, head_dim]: per row).

    Applied before the heads are transposed for attention: elementwise work on the contiguous layout
    (torchtitan's order) is cheaper than on the transposed view.
    """
    # Cast the tables, not x: under bf16 autocast q/k are bf16 and SDPA needs q, k, v of one dtype.
    return _RotateHalf.apply(x, cos.to(x.dtype).unsqueeze(-2), sin.to(x.dtype).unsqueeze(-2))  # shared by the heads


def adjacent_order(n_heads: int, head_dim: int, device: torch.device | None = None) -> torch.Tensor:
    """Channel indices that put each head's rotate-half pairs (i, i + head_dim/2) side by side (2i, 2i + 1): the
    rows of a projection whose output :func:`apply_rotary_adjacent` then rotates."""
    one_head = torch.arange(head_dim, device=device).view(2, head_dim // 2).t().reshape(-1)
    return (torch.arange(n_heads, device=device)[:, None] * head_dim + one_head).reshape(-1)


def apply_rotary_adjacent(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rotary` of a tensor whose head channels are in :func:`adjacent_order`: each pair rotated as one
    complex number (torchtitan's form: one complex multiply forward, one backward). The output keeps that order.

    The same rotation as :func:`apply_rotary` (channels permuted alike in q and k leave q·k as it was, to
    rounding); cheaper, since the pairs are adjacent in memory.
    """
    half = x.shape[-1] // 2
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()  # no complex bf16: as torchtitan, in fp32
    turn = torch.complex(cos[..., :half].to(work.dtype), sin[..., :half].to(work.dtype)).unsqueeze(-2)  # all heads
    pairs = torch.view_as_complex(work.unflatten(-1, (half, 2)))
    return torch.view_as_real(pairs * turn).flatten(-2).type_as(x)


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin tables for positions 0..max_seq_len-1; shared by every block."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float, scaling: RopeScaling | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.theta = theta
        self.scaling = scaling
        self.register_buffer("cos", torch.empty(max_seq_len, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_seq_len, head_dim), persistent=False)

    def init_weights(self) -> None:
        """(Re)compute the tables in place, on the buffers' device and in their dtype (no randomness)."""
        positions = torch.arange(self.max_seq_len, device=self.cos.device)
        cos, sin = rope_at(positions, self.head_dim, self.theta, self.scaling, self.cos.dtype)
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def span(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables for positions start..start+length-1, each [length, head_dim]."""
        return self.cos[start:start + length], self.sin[start:start + length]

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables' rows for integer ``positions`` of any shape: [*positions.shape, head_dim] each."""
        return self.cos[positions], self.sin[positions]

    def extra_repr(self) -> str:
        scaled = f", scaling={tuple(self.scaling)}" if self.scaling else ""
        return f"head_dim={self.head_dim}, max_seq_len={self.max_seq_len}, theta={self.theta}{scaled}"
