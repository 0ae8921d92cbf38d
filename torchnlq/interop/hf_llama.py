"""Hugging Face Llama both ways: export a Llama-style torchnlq model as a ``LlamaForCausalLM`` folder, and read one.

Written without importing transformers. Llama computes exactly the models with RMSNorm, SwiGLU, RoPE (Llama 3
scaling included), no QK-norm and a query linear in X; GQA, head_dim, tied heads and biases carry over.
The weights are a rename (:data:`LLAMA_LAYER_NAMES`; k_proj/v_proj are the halves of torchnlq's fused ``kv``). The same
mapping, config and reader serve Qwen3 (:mod:`torchnlq.interop.hf_qwen3`: this block with QK-norm). The readers
(:func:`read_hf_llama`) live in :mod:`torchnlq.interop.hf_folder`, below the loaders.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchnlq.interop.export import export_source, export_standard, hf_config_base
# The reading half lives with the other readers (below the loaders); read here too: Llama both ways.
from torchnlq.interop.hf_folder import (DECODER_FIELDS, LLAMA_FIELDS, LLAMA_LAYER_NAMES,  # noqa: F401
                                        decoder_model_args, llama_model_args, read_hf_llama)
from torchnlq.interop.load import LoadedModel, as_loaded
from torchnlq.interop.tokenizer_files import carried_bos_id
from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT
from torchnlq.models.query import get_query_class

#: What a standard export suggests for a model its architecture cannot compute.
FALLBACK = "; export with --format hf (any model) or --format safetensors"
#: The ModelArgs of the Llama block, and of Qwen3's (the Llama block with QK-norm, bias-free).
LLAMA_BLOCK = {"positions": "rope", "norm": "rms", "mlp_activation": "swiglu", "qk_norm": False}
QWEN3_BLOCK = {**LLAMA_BLOCK, "qk_norm": True, "bias": False}


def block_incompatibility(args: ModelArgs, architecture: str, needs: dict[str, Any], has: str) -> str | None:
    """Why ``architecture``, a Llama-style block whose ModelArgs must be ``needs`` (``has`` in words), cannot compute
    this model, or None when it can. A model that only the other of Llama and Qwen3 computes is pointed to it."""
    if not get_query_class(args.query.type).linear_in_x:
        return f"query type {args.query.type} has no {architecture} equivalent (its query is linear){FALLBACK}"
    wrong = [f"model.{key}={getattr(args, key)!r}" for key, want in needs.items() if getattr(args, key) != want]
    if not wrong:
        return None
    other = {"Llama": ("Qwen3", QWEN3_BLOCK, "hf-qwen3"), "Qwen3": ("Llama", LLAMA_BLOCK, "hf-llama")}.get(architecture)
    if other and all(getattr(args, key) == want for key, want in other[1].items()):
        return f"{', '.join(wrong)}: {architecture} has {has}; this model is a standard {other[0]}: export it with " \
               f"--format {other[2]}"
    return f"{', '.join(wrong)}: {architecture} has {has} (train_configs/llama_debug.toml sets them){FALLBACK}"


def llama_incompatibility(args: ModelArgs) -> str | None:
    """Why ``LlamaForCausalLM`` cannot compute this model, or None when it can."""
    return block_incompatibility(args, "Llama", LLAMA_BLOCK, "RoPE, RMSNorm, the SwiGLU MLP and no QK-norm")


def decoder_config(args: ModelArgs, tokenizer: dict, dtype: torch.dtype, architecture: str,
                   model_type: str) -> dict[str, Any]:
    """The config.json keys Llama and Qwen3 share (dropout 0: an inference export)."""
    scaling = None
    if args.rope_scaling_factor != 1.0:
        scaling = {"rope_type": "llama3", "factor": args.rope_scaling_factor,
                   "low_freq_factor": args.rope_low_freq_factor, "high_freq_factor": args.rope_high_freq_factor,
                   "original_max_position_embeddings": args.rope_original_max_seq_len}
    return {
        **hf_config_base(args, tokenizer, dtype, architecture, model_type),
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.mlp_hidden,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": scaling,
        "attention_bias": args.bias,
        "attention_dropout": 0.0,
        "initializer_range": args.init_std,
        "tie_word_embeddings": args.tie_embeddings,
    }


def llama_config(args: ModelArgs, tokenizer: dict, dtype: torch.dtype) -> dict[str, Any]:
    """The Hugging Face LlamaConfig dict of this model."""
    return {**decoder_config(args, tokenizer, dtype, "LlamaForCausalLM", "llama"), "mlp_bias": args.bias,
            "pretraining_tp": 1}


def llama_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """torchnlq weights under LlamaForCausalLM's (and Qwen3ForCausalLM's) names, fp32, on the model's device."""
    args = model.args
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    out = {"model.embed_tokens.weight": sd["tok_emb.weight"], "model.norm.weight": sd["ln_f.weight"]}
    for i, block in enumerate(model.layers):
        src, dst = f"layers.{i}.", f"model.layers.{i}."
        out[dst + "self_attn.q_proj.weight"] = block.attn.query.linear_weight().float()
        for kind in ("weight", "bias"):
            if src + f"attn.kv.{kind}" in sd:
                k, v = sd[src + f"attn.kv.{kind}"].split(args.kv_dim)
                out[dst + f"self_attn.k_proj.{kind}"], out[dst + f"self_attn.v_proj.{kind}"] = k, v
            for ours, theirs in LLAMA_LAYER_NAMES.items():
                if src + f"{ours}.{kind}" in sd:
                    out[dst + f"{theirs}.{kind}"] = sd[src + f"{ours}.{kind}"]
        if args.bias:
            out[dst + "self_attn.q_proj.bias"] = sd[src + "attn.q_bias"]
    if not args.tie_embeddings:  # tied: from_pretrained re-ties lm_head to embed_tokens
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def export_decoder(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str, overwrite: bool, *,
    incompatibility: Callable[[ModelArgs], str | None],
    config: Callable[[ModelArgs, dict, torch.dtype], dict[str, Any]],
) -> Path:
    """Write a Llama-style standard folder (config.json, model.safetensors, tokenizer files); return its path.

    config.json's ``bos_token_id`` is the carried tokenizer's own BOS (Llama's ``<|begin_of_text|>``), where its
    tokenizer config names one; ``eos_token_id`` is the model's end-of-text.
    """
    loaded = as_loaded(source)

    def config_with_bos(args: ModelArgs, tokenizer: dict, stored: torch.dtype) -> dict[str, Any]:
        values = config(args, tokenizer, stored)
        bos = carried_bos_id(tokenizer, export_source(loaded), args.vocab_size)  # its files are written by now
        return values | ({"bos_token_id": bos} if bos is not None else {})

    return export_standard(loaded, out_dir, dtype, overwrite, incompatibility=incompatibility,
                           state_dict=llama_state_dict, config=config_with_bos)


def export_hf_llama(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write a Hugging Face Llama folder (config.json, model.safetensors, tokenizer files); return its path."""
    return export_decoder(source, out_dir, dtype, overwrite, incompatibility=llama_incompatibility,
                          config=llama_config)
