"""Hugging Face GPT-2 both ways: export a torchnlq model as a ``GPT2LMHeadModel`` folder, and read one.

Written without importing transformers. Only models GPT-2 computes exactly qualify (:func:`gpt2_incompatibility`);
``c_attn`` fuses [Q | K | V] and the biases torchnlq lacks are written as zeros (docs/checkpoints.md has the table).
"""

from __future__ import annotations

from pathlib import Path

import torch

from torchnlq.errors import UserError
from torchnlq.interop.export import export_standard, hf_config_base
# The reading half lives with the other readers (below the loaders); read here too: GPT-2 both ways.
from torchnlq.interop.hf_folder import (GPT2_ACTIVATIONS, GPT2_FIELDS, GPT2_LAYER_NAMES, conv1d,  # noqa: F401
                                        gpt2_model_args, read_hf_gpt2)
from torchnlq.interop.load import LoadedModel
from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT
from torchnlq.models.query import get_query_class


def gpt2_incompatibility(args: ModelArgs) -> str | None:
    """Why GPT-2 cannot represent this model, or None when it can."""
    fallback = "; export with --format safetensors"
    if not get_query_class(args.query.type).linear_in_x:
        return f"query type {args.query.type} has no GPT-2 equivalent{fallback}"
    if args.positions != "learned":
        return f"positions={args.positions!r}: GPT-2 has learned absolute positions only{fallback}"
    if not args.is_gpt2_block:
        return (f"norm={args.norm!r}, mlp_activation={args.mlp_activation!r}, qk_norm={args.qk_norm}: GPT-2 has "
                f"LayerNorms, a GELU MLP and no QK-norm{fallback}")
    if args.n_kv_heads != args.n_heads:
        return (
            f"n_kv_heads={args.n_kv_heads} != n_heads={args.n_heads} (GQA/MQA): GPT-2 has one K,V head per "
            f"query head{fallback}"
        )
    if args.head_dim * args.n_heads != args.dim:
        return (
            f"head_dim*n_heads={args.head_dim * args.n_heads} != dim={args.dim}: "
            f"GPT-2 needs head_dim = dim / n_heads{fallback}"
        )
    return None


def gpt2_config(args: ModelArgs, tokenizer: dict, dtype: torch.dtype) -> dict:
    """The Hugging Face GPT2Config dict of this model (dropouts 0: an inference export)."""
    return {
        **hf_config_base(args, tokenizer, dtype, "GPT2LMHeadModel", "gpt2"),
        "vocab_size": args.vocab_size,  # the padded vocabulary: logits have the same width as torchnlq's
        "n_positions": args.max_seq_len,
        "n_ctx": args.max_seq_len,
        "n_embd": args.dim,
        "n_layer": args.n_layers,
        "n_head": args.n_heads,
        "n_inner": args.mlp_hidden,
        # exact erf GELU, as torchnlq's default; GPT-2's own gelu_new (tanh) for model.mlp_activation = "gelu_tanh"
        "activation_function": "gelu_new" if args.mlp_activation == "gelu_tanh" else "gelu",
        "layer_norm_epsilon": args.norm_eps,
        "initializer_range": args.init_std,
        **dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"), 0.0),
        "scale_attn_weights": True,  # 1/sqrt(head_dim), torchnlq's SDPA default
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": args.tie_embeddings,
    }


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """torchnlq weights under GPT2LMHeadModel's names, fp32, on the model's device; GPT-2's biases that
    torchnlq's bias-free models lack are zeros."""
    args = model.args
    d = args.dim
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}

    def bias(name: str, n: int) -> torch.Tensor:
        return sd[name] if name in sd else torch.zeros(n, dtype=torch.float32, device=sd["tok_emb.weight"].device)
    out = {"transformer.wte.weight": sd["tok_emb.weight"], "transformer.wpe.weight": sd["pos_emb.weight"]}
    for i in range(args.n_layers):
        src, dst = f"layers.{i}.", f"transformer.h.{i}."
        w_q = model.layers[i].attn.query.linear_weight()  # [q_dim, dim]: query(x) = x·Wᵀ
        if w_q is None:
            raise UserError(gpt2_incompatibility(args) or f"query type {args.query.type} is not linear")
        w_q = w_q.to(device=sd["tok_emb.weight"].device, dtype=torch.float32)
        qkv = torch.cat([w_q, sd[src + "attn.kv.weight"]], dim=0)  # [Q; K; V], each d rows
        out[dst + "attn.c_attn.weight"] = qkv.t()
        out[dst + "attn.c_attn.bias"] = torch.cat([bias(src + "attn.q_bias", d), bias(src + "attn.kv.bias", 2 * d)])
        for ours, theirs in GPT2_LAYER_NAMES.items():
            weight = sd[src + ours + ".weight"]
            out[dst + theirs + ".weight"] = conv1d(ours, weight)
            out[dst + theirs + ".bias"] = bias(src + ours + ".bias", weight.shape[0])
    out["transformer.ln_f.weight"] = sd["ln_f.weight"]
    out["transformer.ln_f.bias"] = bias("ln_f.bias", d)
    if not args.tie_embeddings:  # tied: from_pretrained re-ties lm_head to wte (safetensors stores it once)
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def export_hf_gpt2(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write a Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer files); return its path."""
    return export_standard(source, out_dir, dtype, overwrite, incompatibility=gpt2_incompatibility,
                           state_dict=gpt2_state_dict, config=gpt2_config)
