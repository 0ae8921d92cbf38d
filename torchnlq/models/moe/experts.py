"""Routed SwiGLU experts, computed for the tokens routed to them only: grouped, or one expert at a time.

The weights of all experts are three stacked tensors, ``[n_experts, out, in]`` as nn.Linear's (Hugging Face's
per-expert ``gate_proj``, ``up_proj``, ``down_proj`` one above the other). The tokens' assignments are sorted by
expert; ``torch._grouped_mm`` multiplies each expert's rows by its matrices in one call where the device and dtype
have it (CUDA from compute capability 9.0 in bf16; the CPU in eager mode; a compiled CPU graph in bf16; widths of
whole 16-byte rows), and a
loop over the experts' row blocks does elsewhere (under torch.compile's fullgraph, its block sizes are unbacked
sizes: no graph break). Either way the cost is that of the routed tokens, never of
every expert on every token. The outputs are gathered back per token and summed over its top_k in a fixed
order (deterministic, where an index_add would not be on a GPU).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F


def grouped_mm_supported(x: torch.Tensor, hidden: int) -> bool:
    """Whether ``torch._grouped_mm`` runs for tokens ``x`` and experts of ``hidden`` units here (see the module doc;
    its matrices' rows must also be multiples of 16 bytes)."""
    if not hasattr(torch, "_grouped_mm") or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    if (x.shape[-1] * x.element_size()) % 16 or (hidden * x.element_size()) % 16:
        return False
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    if x.device.type == "cpu":
        return x.dtype == torch.bfloat16 or not torch.compiler.is_compiling()
    return False


class GroupedExperts(nn.Module):
    """``n_experts`` SwiGLU MLPs dim -> hidden -> dim: ``down(silu(gate(x)) * up(x))`` each."""

    component: ClassVar[str] = "experts"  # parameter roles (models/roles.py)

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        #: The share of the experts a token uses (models/counts.py's PartlyActive: the active parameters).
        self.active_fraction = top_k / n_experts
        self.gate_proj = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.up_proj = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.down_proj = nn.Parameter(torch.empty(n_experts, dim, hidden))

    def init_weights(self, init_std: float, residual_std: float) -> None:
        """gate and up N(0, init_std); down, into the residual stream, N(0, residual_std)."""
        nn.init.normal_(self.gate_proj, mean=0.0, std=init_std)
        nn.init.normal_(self.up_proj, mean=0.0, std=init_std)
        nn.init.normal_(self.down_proj, mean=0.0, std=residual_std)

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Σ_j weights[t, j] · expert_{experts[t, j]}(x[t]) for tokens x [N, dim]; experts, weights [N, top_k]."""
        order, rows, counts = self.dispatch(x, experts)
        return self.combine(self.compute(rows, counts, None, self.gate_proj, self.up_proj, self.down_proj), order,
                            weights)

    def dispatch(self, x: torch.Tensor, experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the order that sorts the token-expert assignments by expert, stable within; their rows of x; the
        number of rows of each expert)."""
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=x.device).index_add_(
            0, flat, torch.ones_like(flat))  # a fixed shape, where bincount's depends on the values
        return order, x[order // self.top_k], counts

    def combine(self, out: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each token's top_k outputs (``out`` in the sorted order) weighted and summed, in a fixed order."""
        per_token = torch.empty_like(out).index_copy_(0, order, out).view(weights.shape[0], self.top_k, -1)
        return (per_token * weights.unsqueeze(-1)).sum(dim=1)

    @staticmethod
    def compute(rows: torch.Tensor, counts: torch.Tensor, sizes: list[int] | None, gate: torch.Tensor,
                up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """The experts ``gate``, ``up``, ``down`` ([experts, out, in]) on their blocks of ``rows`` (``counts``
        rows each, in order; ``sizes`` the same as a list when already known on the host)."""
        if sizes is None and grouped_mm_supported(rows, gate.shape[1]):
            offsets = counts.cumsum(0).to(torch.int32)
            hidden = F.silu(torch._grouped_mm(rows, gate.transpose(-2, -1), offs=offsets)) * torch._grouped_mm(
                rows, up.transpose(-2, -1), offs=offsets)
            return torch._grouped_mm(hidden, down.transpose(-2, -1), offs=offsets)
        parts = []
        for e, part in enumerate(rows.split(counts.tolist() if sizes is None else sizes)):
            parts.append(F.linear(F.silu(F.linear(part, gate[e])) * F.linear(part, up[e]), down[e]))
        return torch.cat(parts)

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, top_k={self.top_k}, hidden={self.gate_proj.shape[1]}"
