"""Hugging Face Qwen3 both ways: export a QK-norm model as a standard ``Qwen3ForCausalLM`` folder, and read one.

Qwen3 is the Llama block with QK-norm: one RMSNorm of ``head_dim`` gains per side, shared by the heads, on the
queries and keys after their projections and before RoPE, with the blocks' epsilon (``rms_norm_eps``) — torchnlq's
``model.qk_norm = true`` exactly. The mapping, config and reader are Llama's (:mod:`torchnlq.interop.hf_llama`,
plus ``self_attn.q_norm`` / ``k_norm``; the reader is :func:`torchnlq.interop.hf_folder.read_hf_qwen3`); what Qwen3
adds is refused or fixed: no MLP biases (its ``attention_bias`` alone torchnlq cannot express), full attention in
every layer (no sliding window).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# The reading half lives with the other readers (below the loaders); read here too: Qwen3 both ways.
from torchnlq.interop.hf_folder import QWEN3_FIELDS, qwen3_model_args, read_hf_qwen3  # noqa: F401
from torchnlq.interop.hf_llama import QWEN3_BLOCK, block_incompatibility, decoder_config, export_decoder
from torchnlq.interop.load import LoadedModel
from torchnlq.models.args import ModelArgs


def qwen3_incompatibility(args: ModelArgs) -> str | None:
    """Why ``Qwen3ForCausalLM`` cannot compute this model, or None when it can."""
    return block_incompatibility(args, "Qwen3", QWEN3_BLOCK,
                                 "RoPE, RMSNorm, the SwiGLU MLP without biases and QK-norm (model.qk_norm = true)")


def qwen3_config(args: ModelArgs, tokenizer: dict, dtype: torch.dtype) -> dict[str, Any]:
    """The Hugging Face Qwen3Config dict of this model: full attention in every layer."""
    return {
        **decoder_config(args, tokenizer, dtype, "Qwen3ForCausalLM", "qwen3"),
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": args.n_layers,
        "layer_types": ["full_attention"] * args.n_layers,
    }


def export_hf_qwen3(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write a Hugging Face Qwen3 folder (config.json, model.safetensors, tokenizer files); return its path."""
    return export_decoder(source, out_dir, dtype, overwrite, incompatibility=qwen3_incompatibility,
                          config=qwen3_config)
