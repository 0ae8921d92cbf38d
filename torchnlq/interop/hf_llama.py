"""Hugging Face Llama both ways: export a Llama-style torchnlq model as a ``LlamaForCausalLM`` folder, and read one.

Written without importing transformers. Llama computes exactly the models with RMSNorm, SwiGLU, RoPE (Llama 3
scaling included), no QK-norm and a query linear in X; GQA, head_dim, tied heads and biases carry over.
The weights are a rename (:data:`_LAYER_NAMES`; k_proj/v_proj are the halves of torchnlq's fused ``kv``).
"""

from __future__ import annotations

import dataclasses
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


def llama_incompatibility(args: ModelArgs) -> str | None:
    """Why ``LlamaForCausalLM`` cannot compute this model, or None when it can."""
    fallback = "; export with --format hf (any model) or --format safetensors"
    if not get_query_class(args.query.type).linear_in_x:
        return f"query type {args.query.type} has no Llama equivalent (Llama's query is linear){fallback}"
    needs = {"positions": "rope", "norm": "rms", "mlp_activation": "swiglu", "qk_norm": False}
    wrong = [f"model.{key}={getattr(args, key)!r}" for key, want in needs.items() if getattr(args, key) != want]
    if wrong:
        return (f"{', '.join(wrong)}: Llama has RoPE, RMSNorm, the SwiGLU MLP and no QK-norm "
                f"(train_configs/llama_debug.toml sets them){fallback}")
    return None


def llama_config(args: ModelArgs, tokenizer: dict, dtype: torch.dtype) -> dict[str, Any]:
    """The Hugging Face LlamaConfig dict of this model (dropout 0: an inference export)."""
    scaling = None
    if args.rope_scaling_factor != 1.0:
        scaling = {"rope_type": "llama3", "factor": args.rope_scaling_factor,
                   "low_freq_factor": args.rope_low_freq_factor, "high_freq_factor": args.rope_high_freq_factor,
                   "original_max_position_embeddings": args.rope_original_max_seq_len}
    return {
        **hf_config_base(args, tokenizer, dtype, "LlamaForCausalLM", "llama"),
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
        "mlp_bias": args.bias,
        "attention_dropout": 0.0,
        "initializer_range": args.init_std,
        "pretraining_tp": 1,
        "tie_word_embeddings": args.tie_embeddings,
    }


# torchnlq block name -> Llama decoder-layer name (weights, and biases under model.bias).
_LAYER_NAMES = {
    "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.proj": "self_attn.o_proj",
    "mlp.gate": "mlp.gate_proj", "mlp.fc": "mlp.up_proj", "mlp.proj": "mlp.down_proj",
}


def llama_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """torchnlq weights under LlamaForCausalLM's names, fp32, on the model's device."""
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
            for ours, theirs in _LAYER_NAMES.items():
                if src + f"{ours}.{kind}" in sd:
                    out[dst + f"{theirs}.{kind}"] = sd[src + f"{ours}.{kind}"]
        if args.bias:
            out[dst + "self_attn.q_proj.bias"] = sd[src + "attn.q_bias"]
    if not args.tie_embeddings:  # tied: from_pretrained re-ties lm_head to embed_tokens
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def export_hf_llama(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write a Hugging Face Llama folder (config.json, model.safetensors, tokenizer files); return its path."""
    return export_standard(source, out_dir, dtype, overwrite, incompatibility=llama_incompatibility,
                           state_dict=llama_state_dict, config=llama_config)


_ROPE_FIELDS = {
    "rope_type": Field(str), "type": Field(str), "rope_theta": MODEL_FIELDS["rope_theta"],
    "factor": MODEL_FIELDS["rope_scaling_factor"], "low_freq_factor": MODEL_FIELDS["rope_low_freq_factor"],
    "high_freq_factor": MODEL_FIELDS["rope_high_freq_factor"],
    "original_max_position_embeddings": MODEL_FIELDS["rope_original_max_seq_len"],
}
#: The LlamaConfig keys torchnlq reads, each checked as the ModelArgs field it becomes (others are ignored).
LLAMA_FIELDS = {
    "hidden_size": MODEL_FIELDS["dim"], "num_attention_heads": MODEL_FIELDS["n_heads"],
    "num_hidden_layers": MODEL_FIELDS["n_layers"], "num_key_value_heads": MODEL_FIELDS["n_kv_heads"],
    "head_dim": MODEL_FIELDS["head_dim"],
    "intermediate_size": dataclasses.replace(MODEL_FIELDS["mlp_hidden"], null=False),
    "vocab_size": MODEL_FIELDS["vocab_size"], "max_position_embeddings": MODEL_FIELDS["max_seq_len"],
    "tie_word_embeddings": Field(bool), "rope_theta": MODEL_FIELDS["rope_theta"],
    "rms_norm_eps": MODEL_FIELDS["norm_eps"],
    "initializer_range": MODEL_FIELDS["init_std"], "attention_bias": Field(bool), "mlp_bias": Field(bool),
    "hidden_act": Field(str), "rope_scaling": Field(dict, null=True, fields=_ROPE_FIELDS),
    "rope_parameters": Field(dict, null=True, fields=_ROPE_FIELDS),
}


def llama_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a LlamaConfig dict, checked against :data:`LLAMA_FIELDS`: UserError for a wrong type
    or size and for what torchnlq cannot compute exactly, KeyError for a missing key (:func:`read_hf_folder` words
    them)."""
    c = check_record(config, LLAMA_FIELDS, "")
    if c.get("hidden_act", "silu") != "silu":
        raise UserError(f"Llama hidden_act {c['hidden_act']!r}: torchnlq's SwiGLU uses silu")
    if c.get("attention_bias", False) != c.get("mlp_bias", False):
        raise UserError("Llama attention_bias != mlp_bias: torchnlq's model.bias sets both")
    # transformers 5 keeps theta and scaling in rope_parameters; 4.x in rope_theta / rope_scaling.
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise UserError(f"Llama RoPE type {kind!r}: torchnlq computes the default and llama3 kinds only")
    dim, n_heads = config["hidden_size"], config["num_attention_heads"]
    scaled = {}
    if kind == "llama3":
        scaled = dict(rope_scaling_factor=rope["factor"], rope_low_freq_factor=rope["low_freq_factor"],
                      rope_high_freq_factor=rope["high_freq_factor"],
                      rope_original_max_seq_len=rope["original_max_position_embeddings"])
    if not c.get("head_dim") and dim % n_heads:
        raise UserError(f"Llama num_attention_heads={n_heads} does not divide hidden_size={dim} (and no head_dim)")
    return ModelArgs(
        n_layers=config["num_hidden_layers"], dim=dim, n_heads=n_heads,
        n_kv_heads=c.get("num_key_value_heads") or n_heads, head_dim=c.get("head_dim") or dim // n_heads,
        mlp_hidden=config["intermediate_size"], vocab_size=config["vocab_size"],
        max_seq_len=config["max_position_embeddings"], tie_embeddings=c.get("tie_word_embeddings", False),
        positions="rope", rope_theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
        norm_eps=c.get("rms_norm_eps", 1e-6), init_std=c.get("initializer_range", 0.02),
        bias=c.get("attention_bias", False), mlp_activation="swiglu", norm="rms", query=Query(type="linear"), **scaled,
    )


def read_hf_llama(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, torchnlq state dict in fp32) of a Hugging Face Llama folder (safetensors only); every weight has
    the shape its config.json implies (else one line naming it)."""
    args, take = read_hf_folder(path, "llama", "LlamaForCausalLM", llama_model_args)
    d, hidden, q, kv, vocab = args.dim, args.mlp_hidden, args.q_dim, args.kv_dim, args.vocab_size
    kinds = ("weight", "bias") if args.bias else ("weight",)
    # nn.Linear weights are [out, in], RMSNorm gains and biases [out].
    shapes = {"ln_1": (d,), "ln_2": (d,), "attn.proj": (d, q), "mlp.gate": (hidden, d), "mlp.fc": (hidden, d),
              "mlp.proj": (d, hidden), "q": (q, d), "kv": (kv, d)}
    shape = lambda part, kind: shapes[part] if kind == "weight" else shapes[part][:1]  # noqa: E731
    sd = {"tok_emb.weight": take("model.embed_tokens.weight", (vocab, d)),
          "ln_f.weight": take("model.norm.weight", (d,))}
    for i in range(args.n_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        sd[dst + "attn.query.w_q.weight"] = take(src + "self_attn.q_proj.weight", shapes["q"])
        for kind in kinds:
            sd[dst + f"attn.kv.{kind}"] = torch.cat([take(src + f"self_attn.k_proj.{kind}", shape("kv", kind)),
                                                     take(src + f"self_attn.v_proj.{kind}", shape("kv", kind))])
            for ours, theirs in _LAYER_NAMES.items():
                if kind == "weight" or not ours.startswith("ln_"):  # an RMSNorm has no bias
                    sd[dst + f"{ours}.{kind}"] = take(src + f"{theirs}.{kind}", shape(ours, kind))
        if args.bias:
            sd[dst + "attn.q_bias"] = take(src + "self_attn.q_proj.bias", (q,))
    if not args.tie_embeddings:
        sd["lm_head.weight"] = take("lm_head.weight", (vocab, d))
    return args, sd
