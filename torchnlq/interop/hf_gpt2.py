"""Export a torchnlq model as a Hugging Face GPT-2 folder (``GPT2LMHeadModel.from_pretrained``).

Written without importing transformers. Only models GPT-2 computes exactly qualify: learned
positions, n_kv_heads == n_heads, head_dim == dim / n_heads and a query linear in X
(``identity`` exports as W_Q = I, ``residual`` as I + W). GPT-2's ``Conv1D`` weights are
[in, out] and ``c_attn`` fuses [Q | K | V]; biases torchnlq lacks are written as zeros
(docs/checkpoints.md has the table).
"""

from __future__ import annotations

from pathlib import Path

import torch

from torchnlq.interop.export import (
    HF_EXPORT_FILE,
    atomic_folder,
    check_export_folder,
    export_source,
    cast_weights,
    check_tokenizer_fits,
    parse_dtype,
    write_json,
)
from torchnlq.interop.load import LoadedModel, as_loaded
from torchnlq.checkpoint.metadata import FORMAT_KEYS
from torchnlq.interop.tokenizer_files import write_hf_tokenizer_files
from torchnlq.errors import UserError
from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT
from torchnlq.models.query import get_query_class

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def gpt2_incompatibility(args: ModelArgs) -> str | None:
    """Why GPT-2 cannot represent this model, or None when it can."""
    fallback = "; export with --format safetensors"
    if not get_query_class(args.query.type).linear_in_x:
        return f"query type {args.query.type} has no GPT-2 equivalent{fallback}"
    if args.positions != "learned":
        return f"positions={args.positions!r}: GPT-2 has learned absolute positions only{fallback}"
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
    """Write a Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer files); return its path.

    ``torchnlq_export.json`` keeps the tokenizer description and run metadata (Hugging Face ignores it).
    """
    from safetensors.torch import save_file

    from torchnlq.version import __version__

    target = parse_dtype(dtype)
    loaded = as_loaded(source)
    check_tokenizer_fits(loaded)
    reason = gpt2_incompatibility(loaded.args)
    if reason:
        raise UserError(reason)
    check_export_folder(out_dir, export_source(loaded), overwrite)  # before converting the weights
    extra = {
        **{k: v for k, v in loaded.meta.items() if k not in ("model_args", *FORMAT_KEYS)},
        "torchnlq_version": __version__,
        "model_args": loaded.args.to_dict(),
        "tokenizer": loaded.tokenizer,
        "source": str(loaded.path),
    }
    with atomic_folder(out_dir, overwrite, export_source(loaded)) as tmp:
        # The tokenizer first: a gpt2 model whose ranks cannot be found fails before the weights are converted.
        write_hf_tokenizer_files(loaded.tokenizer, tmp, loaded.args.max_seq_len, export_source(loaded))
        state = cast_weights(gpt2_state_dict(loaded.model), target)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_json(tmp / HF_EXPORT_FILE, extra)
        write_json(tmp / "config.json", gpt2_config(loaded.args, loaded.tokenizer, target))
    return Path(out_dir).expanduser()
