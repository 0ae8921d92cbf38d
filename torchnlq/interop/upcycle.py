"""Start from a pretrained model: read a Hugging Face GPT-2 folder, and give a linear-query model the anchored query.

:func:`read_hf_gpt2` turns a ``GPT2LMHeadModel`` folder into torchnlq's ModelArgs and state dict
(``model.bias`` and ``gelu_tanh`` make the logits transformers' own; the layout is the reverse of
:mod:`torchnlq.interop.hf_gpt2`). Weights are read with safetensors only: a pickle is refused.

:func:`upcycle` gives the pretrained model the anchored query with f = 0 at the start, so it
computes exactly the pretrained function until its first update.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from torchnlq.interop.load import LoadedModel, is_export, load_model
from torchnlq.checkpoint.metadata import META_FILE
from torchnlq.config.job_config import Query
from torchnlq.interop.tokenizer_files import tokenizer_from_folder
from torchnlq.errors import UserError
from torchnlq.files import read_json
from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT

# GPT-2's activation_function values and torchnlq's MLP activation for each.
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def is_hf_gpt2_folder(path: str | Path) -> bool:
    """True for a folder whose config.json says ``model_type: gpt2`` (a Hugging Face GPT-2)."""
    try:
        config = json.loads(Path(path, "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "gpt2"


def _read_config(folder: Path) -> dict[str, Any]:
    if not (folder / "config.json").is_file():
        raise UserError(f"'{folder}' has no config.json; pass a Hugging Face GPT-2 folder (save_pretrained)")
    config = read_json(folder / "config.json", "a Hugging Face config.json", "pass a Hugging Face GPT-2 folder")
    if not isinstance(config, dict) or config.get("model_type") != "gpt2":
        got = config.get("model_type") if isinstance(config, dict) else None
        raise UserError(f"'{folder}' is not a Hugging Face GPT-2 folder (model_type {got!r}, not 'gpt2')")
    return config


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


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's safetensors weights (one file, or the shards an index names); never a pickle."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = [folder / "model.safetensors"]
    index = folder / "model.safetensors.index.json"
    if not files[0].is_file() and index.is_file():
        index_json = read_json(index, "a safetensors index", "save the model again")
        weight_map = index_json.get("weight_map") if isinstance(index_json, dict) else None
        names = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else None
        # Shards are plain names inside the folder: an index naming ../elsewhere.safetensors is refused.
        if not names or not all(isinstance(n, str) and n == Path(n).name and n.endswith(".safetensors") for n in names):
            raise UserError(f"'{index}' is unreadable (its weight_map must name .safetensors files of this folder)")
        files = [folder / name for name in names]
    if not files[0].is_file():
        pickled = [n for n in ("pytorch_model.bin", "tf_model.h5") if (folder / n).exists()]
        hint = (f" (it holds {pickled[0]}, which torchnlq does not unpickle: save it again with "
                "model.save_pretrained(folder), which writes safetensors)") if pickled else ""
        raise UserError(f"'{folder}' has no model.safetensors{hint}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError) as e:
            raise UserError(f"'{file}' is unreadable ({e})") from None
    return tensors


def read_hf_gpt2(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor], dict[str, Any]]:
    """(ModelArgs, torchnlq state dict in fp32, tokenizer description) of a Hugging Face GPT-2 folder."""
    folder = Path(path)
    args = gpt2_model_args(_read_config(folder))
    raw = _read_weights(folder)
    # GPT2LMHeadModel prefixes the body with "transformer."; a saved GPT2Model has no prefix.
    hf = {k.removeprefix("transformer."): v.float() for k, v in raw.items()}
    d = args.dim

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise UserError(f"'{folder}' lacks the GPT-2 weight {name!r}; is it a complete GPT2LMHeadModel?")
        return hf[name]

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
    tokenizer = tokenizer_from_folder(folder) if (folder / "vocab.json").is_file() else None
    return args, sd, tokenizer.describe() if tokenizer is not None else {}


def _pretrained(source: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(args, state dict, tokenizer, run metadata) of a Hugging Face GPT-2 folder or a torchnlq checkpoint/export."""
    path = Path(source)
    if not path.is_dir():
        raise UserError(f"'{source}' does not exist or is not a folder; pass a Hugging Face GPT-2 folder or a "
                        "torchnlq checkpoint or export")
    if is_hf_gpt2_folder(path) and not is_export(path):
        args, sd, tokenizer = read_hf_gpt2(path)
        return args, sd, tokenizer, {"source": str(path), "imported_from": "huggingface-gpt2"}
    if not (is_export(path) or (path / META_FILE).is_file()):
        raise UserError(f"'{source}' is neither a Hugging Face GPT-2 folder (config.json with model_type 'gpt2') "
                        "nor a torchnlq checkpoint or export")
    loaded = load_model(path, "cpu")
    meta = {"source": str(path)}
    return loaded.args, {k: v.float() for k, v in loaded.model.state_dict().items()}, loaded.tokenizer, meta


def pretrained_weights(source: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, fp32 state dict) of a Hugging Face GPT-2 folder or a torchnlq export/checkpoint."""
    args, state, _, _ = _pretrained(source)
    return args, state


def anchored_from_linear(source: ModelArgs, target: ModelArgs) -> bool:
    """True when ``target`` is ``source`` with its linear query made anchored (what upcycling loads)."""
    return source.query.type == "linear" and target.query.type == "anchored"


def upcycle(source: str | Path, query: Query | None = None, seed: int = 0) -> LoadedModel:
    """The pretrained model at ``source`` with the query ``query`` (None: as pretrained), as a LoadedModel.

    ``anchored`` keeps a linear source's W_Q as the anchor and draws f with ``seed`` (f = 0 at the
    start): the result's logits equal the source's.
    """
    args, sd, tokenizer, meta = _pretrained(source)
    if query is None or query.type == args.query.type == "linear" and query == args.query:
        target = args
    else:
        if args.query.type != "linear":
            raise UserError(f"'{source}' has a {args.query.type!r} query; upcycling needs a pretrained linear W_Q "
                            "(GPT-2's, or a torchnlq model with model.query.type = 'linear')")
        if query.type not in ("linear", "anchored"):
            raise UserError(f"upcycling gives a pretrained model the 'anchored' query (or keeps it 'linear'), "
                            f"not {query.type!r}")
        target = dataclasses.replace(args, query=query)
        target.validate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            model = GPT(target)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    branch = {"input_norm", "w1", "w2", "output_norm"}
    stray = [k for k in missing if k.split(".")[-2] not in branch]
    if unexpected or stray:
        raise UserError(f"'{source}' does not fit the upcycled model (missing {stray[:3]}, unexpected "
                        f"{list(unexpected)[:3]}); is it a linear-query model?")
    model.eval()
    return LoadedModel(model, target, tokenizer, meta, Path(source), "python", None)
