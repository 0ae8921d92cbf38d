"""The dense family's standard Hugging Face architectures, both ways: GPT-2, Llama and Qwen3 (Llama with QK-norm).

Only models an architecture computes exactly qualify (each ``*_incompatibility``). GPT-2's ``c_attn`` fuses
[Q | K | V] and its Conv1D weights are nn.Linear's transposed; the biases torchnlq's bias-free models lack are
written as zeros. Llama's and Qwen3's weights are a rename (:data:`LLAMA_LAYER_NAMES`; ``k_proj``/``v_proj`` are
the halves of torchnlq's fused ``kv``); Qwen3 adds ``q_norm``/``k_norm`` and refuses what it cannot hold (MLP
biases, sliding windows). docs/checkpoints.md has the tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn as nn

from ..args import MODEL_FIELDS, ModelArgs
from ..config import Query
from ..errors import UserError
from ..hf_mapping import HFArchitecture, Take
from ..query import LinearInX, claims, get_query_class
from ..recorded import Field, check_record, integer

#: What a standard export suggests for a model its architecture cannot compute.
FALLBACK = "; export with --format hf (any model) or --format safetensors"


def query_incompatibility(args: ModelArgs, architecture: str) -> str | None:
    """Why ``architecture``'s linear W_Q (and standard parametrization) cannot hold this model's query, or None."""
    if args.width_multiplier != 1.0:  # away from its base width a µP model has multipliers no standard config holds
        return (f"model.parametrization='mup' at model.dim={args.dim}, not its base width "
                f"{args.mup_base_width}: {architecture} has no µP multipliers{FALLBACK}")
    if not claims(get_query_class(args.query.type), LinearInX):
        return (f"query type {args.query.type} has no {architecture} equivalent ({architecture}'s query is linear "
                f"in X, this one is not){FALLBACK}")
    return None


def _bias(sd: dict[str, torch.Tensor], name: str, n: int) -> torch.Tensor:
    """``sd[name]``, or zeros for a bias the bias-free model lacks."""
    return sd[name] if name in sd else torch.zeros(n, dtype=torch.float32, device=sd["tok_emb.weight"].device)


# ---------------------------------------------------------------- GPT-2

#: torchnlq block name -> GPT-2 block name; GPT-2's Conv1D weights (not its LayerNorms') are nn.Linear's transposed.
GPT2_LAYER_NAMES = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc",
                    "mlp.proj": "mlp.c_proj"}
#: GPT-2's activation_function values and torchnlq's MLP activation for each.
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


def conv1d(name: str, weight: torch.Tensor) -> torch.Tensor:
    """A weight between nn.Linear's [out, in] and Conv1D's [in, out] (LayerNorm weights as they are)."""
    return weight if name.startswith("ln_") else weight.t().contiguous()


def gpt2_incompatibility(args: ModelArgs) -> str | None:
    """Why GPT-2 cannot represent this model, or None when it can."""
    fallback = "; export with --format safetensors"
    query = query_incompatibility(args, "GPT-2")
    if query:
        return query
    if args.positions != "learned":
        return f"positions={args.positions!r}: GPT-2 has learned absolute positions only{fallback}"
    if not args.is_gpt2_block:
        return (f"norm={args.norm!r}, mlp_activation={args.mlp_activation!r}, qk_norm={args.qk_norm}: GPT-2 has "
                f"LayerNorms, a GELU MLP and no QK-norm{fallback}")
    if args.n_kv_heads != args.n_heads:
        return (f"n_kv_heads={args.n_kv_heads} != n_heads={args.n_heads} (GQA/MQA): GPT-2 has one K,V head per "
                f"query head{fallback}")
    if args.head_dim * args.n_heads != args.dim:
        return (f"head_dim*n_heads={args.head_dim * args.n_heads} != dim={args.dim}: GPT-2 needs head_dim = "
                f"dim / n_heads{fallback}")
    return None


def gpt2_config(args: ModelArgs) -> dict[str, Any]:
    """The Hugging Face GPT2Config keys of this model (dropouts 0: an inference export)."""
    return {
        "vocab_size": args.vocab_size,  # the padded vocabulary: logits have the same width as torchnlq's
        "n_positions": args.max_seq_len, "n_ctx": args.max_seq_len, "n_embd": args.dim, "n_layer": args.n_layers,
        "n_head": args.n_heads, "n_inner": args.mlp_hidden,
        # exact erf GELU, as torchnlq's default; GPT-2's own gelu_new (tanh) for model.mlp_activation = "gelu_tanh"
        "activation_function": "gelu_new" if args.mlp_activation == "gelu_tanh" else "gelu",
        "layer_norm_epsilon": args.norm_eps, "initializer_range": args.init_std,
        **dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"), 0.0),
        "scale_attn_weights": True,  # 1/sqrt(head_dim), torchnlq's SDPA default
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": args.tie_embeddings,
    }


def gpt2_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """torchnlq weights under GPT2LMHeadModel's names, fp32, on the model's device."""
    args = model.args
    d = args.dim
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    out = {"transformer.wte.weight": sd["tok_emb.weight"], "transformer.wpe.weight": sd["pos_emb.weight"]}
    for i, block in enumerate(model.layers):
        src, dst = f"layers.{i}.", f"transformer.h.{i}."
        w_q = block.attn.query.linear_weight().to(sd["tok_emb.weight"].device)  # [q_dim, dim]: query(x) = x·Wᵀ
        out[dst + "attn.c_attn.weight"] = torch.cat([w_q, sd[src + "attn.kv.weight"]]).t()  # [Q; K; V], d rows each
        out[dst + "attn.c_attn.bias"] = torch.cat([_bias(sd, src + "attn.q_bias", d), _bias(sd, src + "attn.kv.bias",
                                                                                            2 * d)])
        for ours, theirs in GPT2_LAYER_NAMES.items():
            weight = sd[src + ours + ".weight"]
            out[dst + theirs + ".weight"] = conv1d(ours, weight)
            out[dst + theirs + ".bias"] = _bias(sd, src + ours + ".bias", weight.shape[0])
    out["transformer.ln_f.weight"] = sd["ln_f.weight"]
    out["transformer.ln_f.bias"] = _bias(sd, "ln_f.bias", d)
    if not args.tie_embeddings:  # tied: from_pretrained re-ties lm_head to wte (safetensors stores it once)
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def gpt2_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a GPT2Config dict, checked against :data:`GPT2_FIELDS`."""
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


def gpt2_read_state_dict(args: ModelArgs, take: Take) -> dict[str, torch.Tensor]:
    """The torchnlq state dict of a GPT-2 folder's weights (names without ``transformer.``)."""
    d, hidden, vocab = args.dim, args.mlp_hidden, args.vocab_size
    sd = {"tok_emb.weight": take("wte.weight", (vocab, d)), "pos_emb.weight": take("wpe.weight", (args.max_seq_len, d))}
    # Conv1D weights are [in, out]; LayerNorm gains and every bias are [out].
    shapes = {"ln_1": (d,), "ln_2": (d,), "attn.proj": (d, d), "mlp.fc": (d, hidden), "mlp.proj": (hidden, d)}
    for i in range(args.n_layers):
        h, t = f"h.{i}.", f"layers.{i}."
        c_attn_w, c_attn_b = take(h + "attn.c_attn.weight", (d, 3 * d)), take(h + "attn.c_attn.bias", (3 * d,))
        sd[t + "attn.query.w_q.weight"], sd[t + "attn.q_bias"] = c_attn_w[:, :d].t().contiguous(), c_attn_b[:d]
        sd[t + "attn.kv.weight"], sd[t + "attn.kv.bias"] = c_attn_w[:, d:].t().contiguous(), c_attn_b[d:]
        for ours, theirs in GPT2_LAYER_NAMES.items():
            sd[t + ours + ".weight"] = conv1d(ours, take(h + theirs + ".weight", shapes[ours]))
            sd[t + ours + ".bias"] = take(h + theirs + ".bias", shapes[ours][-1:])
    sd["ln_f.weight"], sd["ln_f.bias"] = take("ln_f.weight", (d,)), take("ln_f.bias", (d,))
    if not args.tie_embeddings:
        sd["lm_head.weight"] = take("lm_head.weight", (vocab, d))
    return sd


GPT2 = HFArchitecture("hf-gpt2", "GPT2LMHeadModel", "gpt2", gpt2_incompatibility, gpt2_config, gpt2_state_dict,
                      gpt2_model_args, gpt2_read_state_dict, prefix="transformer.")


# ---------------------------------------------------------------- Llama, and Qwen3 (Llama with QK-norm)

#: The block options of Llama's block, and of Qwen3's (the Llama block with QK-norm, bias-free).
LLAMA_BLOCK = {"positions": "rope", "norm": "rms", "mlp_activation": "swiglu", "qk_norm": False}
QWEN3_BLOCK = {**LLAMA_BLOCK, "qk_norm": True, "bias": False}
#: torchnlq block name -> Llama decoder-layer name (weights, and biases under model.bias); the QK-norm gains only
#: exist in (and are only read for) a model with model.qk_norm (Qwen3).
LLAMA_LAYER_NAMES = {
    "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.proj": "self_attn.o_proj",
    "mlp.gate": "mlp.gate_proj", "mlp.fc": "mlp.up_proj", "mlp.proj": "mlp.down_proj",
    "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
}
LLAMA_NORMS = ("ln_1", "ln_2", "attn.q_norm", "attn.k_norm")  # RMSNorms: a gain, no bias
_ROPE_FIELDS = {
    "rope_type": Field(str), "type": Field(str), "rope_theta": MODEL_FIELDS["rope_theta"],
    "factor": MODEL_FIELDS["rope_scaling_factor"], "low_freq_factor": MODEL_FIELDS["rope_low_freq_factor"],
    "high_freq_factor": MODEL_FIELDS["rope_high_freq_factor"],
    "original_max_position_embeddings": MODEL_FIELDS["rope_original_max_seq_len"],
}
#: The config.json keys of Llama and Qwen3 that torchnlq reads, each checked as the ModelArgs field it becomes.
DECODER_FIELDS = {
    "hidden_size": MODEL_FIELDS["dim"], "num_attention_heads": MODEL_FIELDS["n_heads"],
    "num_hidden_layers": MODEL_FIELDS["n_layers"], "num_key_value_heads": MODEL_FIELDS["n_kv_heads"],
    "head_dim": MODEL_FIELDS["head_dim"],
    "intermediate_size": dataclasses.replace(MODEL_FIELDS["mlp_hidden"], null=False),
    "vocab_size": MODEL_FIELDS["vocab_size"], "max_position_embeddings": MODEL_FIELDS["max_seq_len"],
    "tie_word_embeddings": Field(bool), "rope_theta": MODEL_FIELDS["rope_theta"],
    "rms_norm_eps": MODEL_FIELDS["norm_eps"],
    "initializer_range": MODEL_FIELDS["init_std"], "attention_bias": Field(bool),
    "hidden_act": Field(str), "rope_scaling": Field(dict, null=True, fields=_ROPE_FIELDS),
    "rope_parameters": Field(dict, null=True, fields=_ROPE_FIELDS),
}
#: The LlamaConfig keys torchnlq reads (others are ignored).
LLAMA_FIELDS = {**DECODER_FIELDS, "mlp_bias": Field(bool)}
#: A Qwen3 layer's attention (transformers' layer_types).
ATTENTION_KINDS = ("full_attention", "sliding_attention")
#: The Qwen3Config keys torchnlq reads, each checked as the ModelArgs field it becomes or bounds (others ignored).
QWEN3_FIELDS = {
    **DECODER_FIELDS, "use_sliding_window": Field(bool), "sliding_window": integer(0, null=True),
    "max_window_layers": integer(0, null=True),
    "layer_types": Field(list, null=True, values=Field(str, choices=ATTENTION_KINDS)),
}


def block_incompatibility(args: ModelArgs, architecture: str, needs: dict[str, Any], has: str) -> str | None:
    """Why ``architecture``, a Llama-style block whose ModelArgs must be ``needs`` (``has`` in words), cannot compute
    this model, or None when it can. A model that only the other of Llama and Qwen3 computes is pointed to it."""
    query = query_incompatibility(args, architecture)
    if query:
        return query
    wrong = [f"model.{key}={getattr(args, key)!r}" for key, want in needs.items() if getattr(args, key) != want]
    if not wrong:
        return None
    other = {"Llama": ("Qwen3", QWEN3_BLOCK, "hf-qwen3"), "Qwen3": ("Llama", LLAMA_BLOCK, "hf-llama")}.get(architecture)
    if other and all(getattr(args, key) == want for key, want in other[1].items()):
        return f"{', '.join(wrong)}: {architecture} has {has}; this model is a standard {other[0]}: export it with " \
               f"--format {other[2]}"
    return f"{', '.join(wrong)}: {architecture} has {has} (the llama_* flavors set them){FALLBACK}"


def llama_incompatibility(args: ModelArgs) -> str | None:
    """Why ``LlamaForCausalLM`` cannot compute this model, or None when it can."""
    return block_incompatibility(args, "Llama", LLAMA_BLOCK, "RoPE, RMSNorm, the SwiGLU MLP and no QK-norm")


def qwen3_incompatibility(args: ModelArgs) -> str | None:
    """Why ``Qwen3ForCausalLM`` cannot compute this model, or None when it can."""
    return block_incompatibility(args, "Qwen3", QWEN3_BLOCK,
                                 "RoPE, RMSNorm, the SwiGLU MLP without biases and QK-norm (model.qk_norm = true)")


def decoder_config(args: ModelArgs) -> dict[str, Any]:
    """The config.json keys Llama and Qwen3 share (dropout 0: an inference export)."""
    scaling = None
    if args.rope_scaling_factor != 1.0:
        scaling = {"rope_type": "llama3", "factor": args.rope_scaling_factor,
                   "low_freq_factor": args.rope_low_freq_factor, "high_freq_factor": args.rope_high_freq_factor,
                   "original_max_position_embeddings": args.rope_original_max_seq_len}
    return {
        "vocab_size": args.vocab_size, "hidden_size": args.dim, "intermediate_size": args.mlp_hidden,
        "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim, "hidden_act": "silu",
        "max_position_embeddings": args.max_seq_len, "rms_norm_eps": args.norm_eps, "rope_theta": args.rope_theta,
        "rope_scaling": scaling, "attention_bias": args.bias, "attention_dropout": 0.0,
        "initializer_range": args.init_std, "tie_word_embeddings": args.tie_embeddings,
    }


def llama_config(args: ModelArgs) -> dict[str, Any]:
    """The Hugging Face LlamaConfig keys of this model."""
    return {**decoder_config(args), "mlp_bias": args.bias, "pretraining_tp": 1}


def qwen3_config(args: ModelArgs) -> dict[str, Any]:
    """The Hugging Face Qwen3Config keys of this model: full attention in every layer."""
    return {**decoder_config(args), "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": args.n_layers, "layer_types": ["full_attention"] * args.n_layers}


def attention_state_dict(block: nn.Module, sd: dict[str, torch.Tensor], src: str, dst: str,
                         kv_dim: int) -> dict[str, torch.Tensor]:
    """One block's attention weights under Llama's names (``q_proj`` from the query, ``k_proj``/``v_proj`` the
    halves of ``kv``, the out-projection, QK-norm gains and biases where the model has them)."""
    out = {dst + "self_attn.q_proj.weight": block.attn.query.linear_weight().to(sd[src + "attn.kv.weight"].device)}
    for kind in ("weight", "bias"):
        if src + f"attn.kv.{kind}" in sd:
            out[dst + f"self_attn.k_proj.{kind}"], out[dst + f"self_attn.v_proj.{kind}"] = \
                sd[src + f"attn.kv.{kind}"].split(kv_dim)
    if src + "attn.q_bias" in sd:
        out[dst + "self_attn.q_proj.bias"] = sd[src + "attn.q_bias"]
    return out


def llama_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """torchnlq weights under LlamaForCausalLM's (and Qwen3ForCausalLM's) names, fp32, on the model's device."""
    args = model.args
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    out = {"model.embed_tokens.weight": sd["tok_emb.weight"], "model.norm.weight": sd["ln_f.weight"]}
    for i, block in enumerate(model.layers):
        src, dst = f"layers.{i}.", f"model.layers.{i}."
        out |= attention_state_dict(block, sd, src, dst, args.kv_dim)
        for ours, theirs in LLAMA_LAYER_NAMES.items():
            for kind in ("weight", "bias"):
                if src + f"{ours}.{kind}" in sd:
                    out[dst + f"{theirs}.{kind}"] = sd[src + f"{ours}.{kind}"]
    if not args.tie_embeddings:  # tied: from_pretrained re-ties lm_head to embed_tokens
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def decoder_model_args(c: dict[str, Any], config: dict[str, Any], architecture: str, **block: Any) -> ModelArgs:
    """torchnlq's ModelArgs of a Llama-style config.json ``config`` whose keys of :data:`DECODER_FIELDS` ``c`` holds
    checked; ``block`` sets the fields the architecture fixes (qk_norm, bias, the family)."""
    if c.get("hidden_act", "silu") != "silu":
        raise UserError(f"{architecture} hidden_act {c['hidden_act']!r}: torchnlq's SwiGLU uses silu")
    # transformers 5 keeps theta and scaling in rope_parameters; 4.x in rope_theta / rope_scaling.
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise UserError(f"{architecture} RoPE type {kind!r}: torchnlq computes the default and llama3 kinds only")
    dim, n_heads = config["hidden_size"], config["num_attention_heads"]
    scaled = {}
    if kind == "llama3":
        scaled = dict(rope_scaling_factor=rope["factor"], rope_low_freq_factor=rope["low_freq_factor"],
                      rope_high_freq_factor=rope["high_freq_factor"],
                      rope_original_max_seq_len=rope["original_max_position_embeddings"])
    if not c.get("head_dim") and dim % n_heads:
        raise UserError(f"{architecture} num_attention_heads={n_heads} does not divide hidden_size={dim} "
                        "(and no head_dim)")
    return ModelArgs(
        n_layers=config["num_hidden_layers"], dim=dim, n_heads=n_heads,
        n_kv_heads=c.get("num_key_value_heads") or n_heads, head_dim=c.get("head_dim") or dim // n_heads,
        mlp_hidden=config["intermediate_size"], vocab_size=config["vocab_size"],
        max_seq_len=config["max_position_embeddings"], tie_embeddings=c.get("tie_word_embeddings", False),
        rope_theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)), norm_eps=c.get("rms_norm_eps", 1e-6),
        init_std=c.get("initializer_range", 0.02), query=Query(type="linear"), **scaled, **{**LLAMA_BLOCK, **block},
    )


def llama_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a LlamaConfig dict, checked against :data:`LLAMA_FIELDS`."""
    c = check_record(config, LLAMA_FIELDS, "")
    if c.get("attention_bias", False) != c.get("mlp_bias", False):
        raise UserError("Llama attention_bias != mlp_bias: torchnlq's model.bias sets both")
    return decoder_model_args(c, config, "Llama", bias=c.get("attention_bias", False))


def no_sliding_window(c: dict[str, Any], n_layers: int, architecture: str) -> None:
    """UserError for a Qwen-style config.json whose layers use sliding-window attention (torchnlq's attend fully)."""
    types = c.get("layer_types")
    if types is None:  # transformers 4.x: the layers from max_window_layers on slide, when the window is on
        sliding = (c.get("use_sliding_window", False) and c.get("sliding_window") is not None
                   and c.get("max_window_layers", 28) < n_layers)
    else:
        sliding = "sliding_attention" in types
    if sliding:
        raise UserError(f"{architecture} sliding-window attention (use_sliding_window, layer_types): torchnlq "
                        "attends to every earlier position in every layer")


def qwen3_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a Qwen3Config dict, checked against :data:`QWEN3_FIELDS`."""
    c = check_record(config, QWEN3_FIELDS, "")
    if c.get("attention_bias", False):
        raise UserError("Qwen3 attention_bias = true: torchnlq's model.bias gives the MLP biases too, which Qwen3 "
                        "has not")
    no_sliding_window(c, config["num_hidden_layers"], "Qwen3")
    return decoder_model_args(c, config, "Qwen3", qk_norm=True, bias=False)


def decoder_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """The shapes of a Llama-style block's weights by torchnlq name (nn.Linear's [out, in]; gains [out])."""
    d, hidden, q, kv = args.dim, args.mlp_hidden, args.q_dim, args.kv_dim
    shapes = {"ln_1": (d,), "ln_2": (d,), "attn.proj": (d, q), "mlp.gate": (hidden, d), "mlp.fc": (hidden, d),
              "mlp.proj": (d, hidden), "q": (q, d), "kv": (kv, d)}
    if args.qk_norm:
        shapes |= {"attn.q_norm": (args.head_dim,), "attn.k_norm": (args.head_dim,)}
    return shapes


def read_attention(args: ModelArgs, take: Take, src: str, dst: str) -> dict[str, torch.Tensor]:
    """One block's attention weights from Llama's names (the inverse of :func:`attention_state_dict`)."""
    shapes = decoder_shapes(args)
    sd = {dst + "attn.query.w_q.weight": take(src + "self_attn.q_proj.weight", shapes["q"])}
    for kind in ("weight", "bias") if args.bias else ("weight",):
        shape = shapes["kv"] if kind == "weight" else shapes["kv"][:1]
        sd[dst + f"attn.kv.{kind}"] = torch.cat([take(src + f"self_attn.k_proj.{kind}", shape),
                                                 take(src + f"self_attn.v_proj.{kind}", shape)])
    if args.bias:
        sd[dst + "attn.q_bias"] = take(src + "self_attn.q_proj.bias", (args.q_dim,))
    return sd


def read_layer_names(args: ModelArgs, take: Take, src: str, dst: str, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """The weights (and biases under model.bias) of ``names`` (torchnlq -> Hugging Face) that the block has."""
    shapes = decoder_shapes(args)
    sd = {}
    for kind in ("weight", "bias") if args.bias else ("weight",):
        for ours, theirs in names.items():
            if ours in shapes and (kind == "weight" or ours not in LLAMA_NORMS):
                shape = shapes[ours] if kind == "weight" else shapes[ours][:1]
                sd[dst + f"{ours}.{kind}"] = take(src + f"{theirs}.{kind}", shape)
    return sd


def read_embeddings(args: ModelArgs, take: Take) -> dict[str, torch.Tensor]:
    """The token table, final norm and (untied) head of a Llama-style folder."""
    sd = {"tok_emb.weight": take("model.embed_tokens.weight", (args.vocab_size, args.dim)),
          "ln_f.weight": take("model.norm.weight", (args.dim,))}
    if not args.tie_embeddings:
        sd["lm_head.weight"] = take("lm_head.weight", (args.vocab_size, args.dim))
    return sd


def llama_read_state_dict(args: ModelArgs, take: Take) -> dict[str, torch.Tensor]:
    """The torchnlq state dict of a Llama (or Qwen3) folder's weights."""
    sd = read_embeddings(args, take)
    for i in range(args.n_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        sd |= read_attention(args, take, src, dst) | read_layer_names(args, take, src, dst, LLAMA_LAYER_NAMES)
    return sd


LLAMA = HFArchitecture("hf-llama", "LlamaForCausalLM", "llama", llama_incompatibility, llama_config,
                       llama_state_dict, llama_model_args, llama_read_state_dict)
QWEN3 = HFArchitecture("hf-qwen3", "Qwen3ForCausalLM", "qwen3", qwen3_incompatibility, qwen3_config,
                       llama_state_dict, qwen3_model_args, llama_read_state_dict)
