"""The moe family's flavors: Qwen3-MoE-style blocks (RMSNorm, RoPE, QK-norm, SwiGLU experts)."""

from __future__ import annotations

from ..dense.hf import QWEN3_BLOCK
from ..family import Flavor

#: Qwen3's block, which Qwen3-MoE's layers keep: RMSNorm, SwiGLU, RoPE, QK-norm, no biases.
QWEN3 = {key: QWEN3_BLOCK[key] for key in ("norm", "mlp_activation", "positions", "qk_norm")}

MOE_FLAVORS: dict[str, Flavor] = {
    # Tiny: trains on a CPU in seconds. 4 experts of 128 units, 2 per token: the routed part is 2 x 3 x 128 x 128
    # active parameters per layer of 4 x 3 x 128 x 128.
    "moe_debug": Flavor(n_layers=2, dim=128, n_heads=4, max_seq_len=256, family="moe", options=QWEN3,
                        sections={"moe": {"n_experts": 4, "top_k": 2, "expert_hidden": 128}}),
    # GPT-2 small's active size: 12 x 768, 12 heads; 8 SwiGLU experts of 1024 units, 2 per token, so a token
    # computes with 2 x 3 x 768 x 1024 = 4.72 M expert parameters per layer, GPT-2 small's MLP (2 x 768 x 3072).
    "moe_gpt_small": Flavor(n_layers=12, dim=768, n_heads=12, family="moe", options=QWEN3,
                            sections={"moe": {"n_experts": 8, "top_k": 2, "expert_hidden": 1024}}),
}
