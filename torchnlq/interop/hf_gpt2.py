"""Hugging Face GPT-2 both ways: export a torchnlq model as a ``GPT2LMHeadModel`` folder, and read one.

Written without importing transformers. Only models GPT-2 computes exactly qualify: learned
positions, n_kv_heads == n_heads, head_dim == dim / n_heads and a query linear in X
(``identity`` exports as W_Q = I, ``residual`` as I + W). GPT-2's ``Conv1D`` weights are
[in, out] and ``c_attn`` fuses [Q | K | V]; biases torchnlq lacks are written as zeros
(docs/checkpoints.md has the table). :func:`read_hf_gpt2` is the reverse (``model.bias`` and
``gelu_tanh`` make the logits transformers' own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.interop.export import DTYPE_NAMES, export_standard
from torchnlq.interop.hf_folder import read_hf_config, read_hf_weights, weight_taker
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


def query_matrix(model: GPT, layer: int) -> torch.Tensor:
    """The [q_dim, dim] nn.Linear-style weight W with query(x) = x·Wᵀ (fp32, on the model's device)."""
    weight = model.layers[layer].attn.query.linear_weight()
    if weight is None:
        raise UserError(gpt2_incompatibility(model.args) or f"query type {model.args.query.type} is not linear")
    return weight.to(device=model.tok_emb.weight.device, dtype=torch.float32)


def gpt2_config(args: ModelArgs, tokenizer: dict, dtype: torch.dtype) -> dict:
    """The Hugging Face GPT2Config dict of this model (dropouts 0: an inference export)."""
    eot = tokenizer.get("eot_id")
    if not isinstance(eot, int) or not 0 <= eot < args.vocab_size:
        eot = None  # HF warns about (and generate() mishandles) an end-of-text id outside the vocabulary
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
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
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "summary_first_dropout": 0.0,
        "scale_attn_weights": True,  # 1/sqrt(head_dim), torchnlq's SDPA default
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": args.tie_embeddings,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "use_cache": True,
        "torch_dtype": DTYPE_NAMES[dtype],
    }


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """torchnlq weights under GPT2LMHeadModel's names, fp32, on the model's device."""
    args = model.args
    d = args.dim
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    zeros = lambda n: torch.zeros(n, dtype=torch.float32, device=sd["tok_emb.weight"].device)  # noqa: E731

    def bias(name: str, n: int) -> torch.Tensor:
        """The bias of a model.bias model (GPT-2's own), zeros for torchnlq's bias-free models."""
        return sd[name] if name in sd else zeros(n)
    out = {"transformer.wte.weight": sd["tok_emb.weight"], "transformer.wpe.weight": sd["pos_emb.weight"]}
    for i in range(args.n_layers):
        src, dst = f"layers.{i}.", f"transformer.h.{i}."
        # Conv1D computes x·W + b with W: [in, out], i.e. the transpose of nn.Linear's weight.
        qkv = torch.cat([query_matrix(model, i), sd[src + "attn.kv.weight"]], dim=0)  # [Q; K; V], each d rows
        out.update({
            dst + "ln_1.weight": sd[src + "ln_1.weight"],
            dst + "ln_1.bias": bias(src + "ln_1.bias", d),
            dst + "attn.c_attn.weight": qkv.t(),
            dst + "attn.c_attn.bias": torch.cat([bias(src + "attn.q_bias", d), bias(src + "attn.kv.bias", 2 * d)]),
            dst + "attn.c_proj.weight": sd[src + "attn.proj.weight"].t(),
            dst + "attn.c_proj.bias": bias(src + "attn.proj.bias", d),
            dst + "ln_2.weight": sd[src + "ln_2.weight"],
            dst + "ln_2.bias": bias(src + "ln_2.bias", d),
            dst + "mlp.c_fc.weight": sd[src + "mlp.fc.weight"].t(),
            dst + "mlp.c_fc.bias": bias(src + "mlp.fc.bias", args.mlp_hidden),
            dst + "mlp.c_proj.weight": sd[src + "mlp.proj.weight"].t(),
            dst + "mlp.c_proj.bias": bias(src + "mlp.proj.bias", d),
        })
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


def gpt2_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a GPT2Config dict (UserError for what torchnlq cannot compute exactly)."""
    activation = config.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        raise UserError(f"GPT-2 activation_function {activation!r} is not one torchnlq has ({', '.join(GPT2_ACTIVATIONS)})")
    for key, wanted in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if config.get(key, wanted) != wanted:
            raise UserError(f"GPT-2 config {key}={config[key]!r}: torchnlq's attention needs {key}={wanted!r}")
    try:
        dim, n_heads = int(config["n_embd"]), int(config["n_head"])
        return ModelArgs(
            n_layers=int(config["n_layer"]), dim=dim, n_heads=n_heads, head_dim=dim // n_heads,
            mlp_hidden=int(config.get("n_inner") or 4 * dim), vocab_size=int(config["vocab_size"]),
            max_seq_len=int(config["n_positions"]), tie_embeddings=bool(config.get("tie_word_embeddings", True)),
            norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
            init_std=float(config.get("initializer_range", 0.02)), bias=True,
            mlp_activation=GPT2_ACTIVATIONS[activation], query=Query(type="linear"),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"GPT-2 config.json lacks or mangles {e}; it is not a GPT2Config") from None


def read_hf_gpt2(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, torchnlq state dict in fp32) of a Hugging Face GPT-2 folder."""
    folder = Path(path)
    args = gpt2_model_args(read_hf_config(folder, "gpt2"))
    # GPT2LMHeadModel prefixes the body with "transformer."; a saved GPT2Model has no prefix.
    take = weight_taker(folder, {k.removeprefix("transformer."): v for k, v in read_hf_weights(folder).items()},
                        "GPT2LMHeadModel")
    d = args.dim
    sd = {"tok_emb.weight": take("wte.weight"), "pos_emb.weight": take("wpe.weight")}
    for i in range(args.n_layers):
        h, t = f"h.{i}.", f"layers.{i}."
        c_attn_w, c_attn_b = take(h + "attn.c_attn.weight"), take(h + "attn.c_attn.bias")  # [d, 3d], [3d]
        sd.update({
            t + "ln_1.weight": take(h + "ln_1.weight"), t + "ln_1.bias": take(h + "ln_1.bias"),
            t + "attn.query.w_q.weight": c_attn_w[:, :d].t().contiguous(), t + "attn.q_bias": c_attn_b[:d],
            t + "attn.kv.weight": c_attn_w[:, d:].t().contiguous(), t + "attn.kv.bias": c_attn_b[d:],
            t + "attn.proj.weight": take(h + "attn.c_proj.weight").t().contiguous(),
            t + "attn.proj.bias": take(h + "attn.c_proj.bias"),
            t + "ln_2.weight": take(h + "ln_2.weight"), t + "ln_2.bias": take(h + "ln_2.bias"),
            t + "mlp.fc.weight": take(h + "mlp.c_fc.weight").t().contiguous(), t + "mlp.fc.bias": take(h + "mlp.c_fc.bias"),
            t + "mlp.proj.weight": take(h + "mlp.c_proj.weight").t().contiguous(),
            t + "mlp.proj.bias": take(h + "mlp.c_proj.bias"),
        })
    sd["ln_f.weight"], sd["ln_f.bias"] = take("ln_f.weight"), take("ln_f.bias")
    if not args.tie_embeddings:
        sd["lm_head.weight"] = take("lm_head.weight")
    return args, sd
