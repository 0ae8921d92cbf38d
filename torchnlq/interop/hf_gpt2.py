"""Hugging Face GPT-2 both ways: export a torchnlq model as a ``GPT2LMHeadModel`` folder, and read one.

Written without importing transformers. Only models GPT-2 computes exactly qualify (:func:`gpt2_incompatibility`);
``c_attn`` fuses [Q | K | V] and the biases torchnlq lacks are written as zeros (docs/checkpoints.md has the table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.interop.export import export_standard, hf_config_base
from torchnlq.interop.hf_folder import read_hf_folder
from torchnlq.interop.load import LoadedModel
from torchnlq.models.args import MODEL_FIELDS, ModelArgs
from torchnlq.models.gpt import GPT
from torchnlq.models.query import get_query_class
from torchnlq.models.recorded import Field, check_record


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


# torchnlq block name -> GPT-2 block name; GPT-2's Conv1D weights (not its LayerNorms') are nn.Linear's transposed.
_LAYER_NAMES = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc",
                "mlp.proj": "mlp.c_proj"}


def _conv1d(name: str, weight: torch.Tensor) -> torch.Tensor:
    """A weight between nn.Linear's [out, in] and Conv1D's [in, out] (LayerNorm weights as they are)."""
    return weight if name.startswith("ln_") else weight.t().contiguous()


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
        for ours, theirs in _LAYER_NAMES.items():
            weight = sd[src + ours + ".weight"]
            out[dst + theirs + ".weight"] = _conv1d(ours, weight)
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


# GPT-2's activation_function values and torchnlq's MLP activation for each.
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
#: The GPT2Config keys torchnlq reads, each checked as the ModelArgs field it becomes (others are ignored).
GPT2_FIELDS = {
    "n_embd": MODEL_FIELDS["dim"], "n_head": MODEL_FIELDS["n_heads"], "n_layer": MODEL_FIELDS["n_layers"],
    "n_inner": MODEL_FIELDS["mlp_hidden"], "vocab_size": MODEL_FIELDS["vocab_size"],
    "n_positions": MODEL_FIELDS["max_seq_len"], "tie_word_embeddings": Field(bool),
    "layer_norm_epsilon": MODEL_FIELDS["norm_eps"], "initializer_range": MODEL_FIELDS["init_std"],
    "activation_function": Field(str), "scale_attn_weights": Field(bool),
    "scale_attn_by_inverse_layer_idx": Field(bool),
}


def gpt2_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a GPT2Config dict, checked against :data:`GPT2_FIELDS`: UserError for a wrong type
    or size and for what torchnlq cannot compute exactly, KeyError for a missing key (:func:`read_hf_folder` words
    them)."""
    c = check_record(config, GPT2_FIELDS, "")
    activation = c.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        raise UserError(f"GPT-2 activation_function {activation!r} is not one torchnlq has "
                        f"({', '.join(GPT2_ACTIVATIONS)})")
    for key, wanted in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if c.get(key, wanted) != wanted:
            raise UserError(f"GPT-2 config {key}={c[key]!r}: torchnlq's attention needs {key}={wanted!r}")
    dim, n_heads = config["n_embd"], config["n_head"]
    if dim % n_heads:
        raise UserError(f"GPT-2 config n_head={n_heads} does not divide n_embd={dim}")
    return ModelArgs(
        n_layers=config["n_layer"], dim=dim, n_heads=n_heads, mlp_hidden=c.get("n_inner") or 4 * dim,
        vocab_size=config["vocab_size"], max_seq_len=config["n_positions"],
        tie_embeddings=c.get("tie_word_embeddings", True), norm_eps=c.get("layer_norm_epsilon", 1e-5),
        init_std=c.get("initializer_range", 0.02), bias=True, mlp_activation=GPT2_ACTIVATIONS[activation],
        query=Query(type="linear"),
    )


def read_hf_gpt2(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, torchnlq state dict in fp32) of a Hugging Face GPT-2 folder; every weight has the shape its
    config.json implies (else one line naming it)."""
    # GPT2LMHeadModel prefixes the body with "transformer."; a saved GPT2Model has no prefix.
    args, take = read_hf_folder(path, "gpt2", "GPT2LMHeadModel", gpt2_model_args, prefix="transformer.")
    d, hidden, vocab = args.dim, args.mlp_hidden, args.vocab_size
    sd = {"tok_emb.weight": take("wte.weight", (vocab, d)), "pos_emb.weight": take("wpe.weight", (args.max_seq_len, d))}
    # Conv1D weights are [in, out]; LayerNorm gains and every bias are [out].
    shapes = {"ln_1": (d,), "ln_2": (d,), "attn.proj": (d, d), "mlp.fc": (d, hidden), "mlp.proj": (hidden, d)}
    for i in range(args.n_layers):
        h, t = f"h.{i}.", f"layers.{i}."
        c_attn_w, c_attn_b = take(h + "attn.c_attn.weight", (d, 3 * d)), take(h + "attn.c_attn.bias", (3 * d,))
        sd[t + "attn.query.w_q.weight"], sd[t + "attn.q_bias"] = c_attn_w[:, :d].t().contiguous(), c_attn_b[:d]
        sd[t + "attn.kv.weight"], sd[t + "attn.kv.bias"] = c_attn_w[:, d:].t().contiguous(), c_attn_b[d:]
        for ours, theirs in _LAYER_NAMES.items():
            sd[t + ours + ".weight"] = _conv1d(ours, take(h + theirs + ".weight", shapes[ours]))
            sd[t + ours + ".bias"] = take(h + theirs + ".bias", shapes[ours][-1:])
    sd["ln_f.weight"], sd["ln_f.bias"] = take("ln_f.weight", (d,)), take("ln_f.bias", (d,))
    if not args.tie_embeddings:
        sd["lm_head.weight"] = take("lm_head.weight", (vocab, d))
    return args, sd
