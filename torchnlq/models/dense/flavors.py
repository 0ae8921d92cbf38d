"""The dense family's flavors: GPT-2 sizes with the paper's block, and Llama-style models with Llama's block."""

from __future__ import annotations

from ..family import Flavor
from .hf import LLAMA_BLOCK

#: Llama's block (RMSNorm, SwiGLU, RoPE): what the llama_* flavors are, not only their sizes.
LLAMA = {key: LLAMA_BLOCK[key] for key in ("norm", "mlp_activation", "positions")}

DENSE_FLAVORS: dict[str, Flavor] = {
    # Tiny: trains on a CPU in seconds.
    "debug": Flavor(n_layers=2, dim=128, n_heads=4, max_seq_len=256),
    # GPT-2 small, the paper's baseline (124M with the tied 50304-token embedding).
    "gpt_small": Flavor(n_layers=12, dim=768, n_heads=12),
    # The paper's bigger-MLP control: 4.75 * 768 = 3648 hidden units.
    "gpt_small_mlp4_75": Flavor(n_layers=12, dim=768, n_heads=12, mlp_ratio=4.75),
    "gpt_medium": Flavor(n_layers=24, dim=1024, n_heads=16),
    "gpt_large": Flavor(n_layers=24, dim=1536, n_heads=16),
    # torchtitan's llama3 debug model: dim 256, 6 layers, 16 heads (SwiGLU hidden 768).
    # RoPE base 500000, untied head, depth-scaled init, as torchtitan's.
    "llama_debug": Flavor(n_layers=6, dim=256, n_heads=16, max_seq_len=256,
                          options={**LLAMA, "rope_theta": 500000.0, "tie_embeddings": False, "init": "depth"}),
    # GPT-2 small's 12 x 768 with 12 heads; SwiGLU hidden int(2/3 * 4.0625 * 768) = 2080 (mlp_multiple_of 32)
    # matches GPT-2 small's parameter count without its 1024 x 768 position table (docs/models.md).
    "llama_gpt_small": Flavor(n_layers=12, dim=768, n_heads=12, mlp_ratio=4.0625, mlp_multiple_of=32,
                              options={**LLAMA, "init": "depth"}),
    # Llama 3.2 1B: 16 x 2048, 32 heads, 8 KV heads, SwiGLU hidden int(2/3 * 6 * 2048) = 8192, RoPE base 500000,
    # frequencies scaled by 32 from an 8192-token original context, the head tied to the embedding.
    "llama3_1b": Flavor(n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, mlp_ratio=6.0, max_seq_len=2048,
                        options={**LLAMA, "rope_theta": 500000.0, "rope_scaling_factor": 32.0,
                                 "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                                 "rope_original_max_seq_len": 8192, "init": "depth"}),
}
