"""Reading Hugging Face model folders (``save_pretrained``): which architecture, its config.json, its weights, and
the reading half of each architecture torchnlq imports (GPT-2, Llama, Qwen3: :func:`read_hf_model`); the writing
halves are :mod:`~torchnlq.interop.hf_gpt2`, :mod:`~torchnlq.interop.hf_llama` and :mod:`~torchnlq.interop.hf_qwen3`
(they re-export these readers). Here, below the loaders, so that :func:`~torchnlq.interop.load.load_model` opens
these folders like its own.

Weights are read with safetensors only: a pickle is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchnlq.config.job_config import Query
from torchnlq.data.tokenizer import BASE_VOCAB_SIZE, GPT2_EOT_ID
from torchnlq.errors import UserError
from torchnlq.files import read_json
from torchnlq.interop.tokenizer_files import tokenizer_from_folder
from torchnlq.models.args import MODEL_FIELDS, ModelArgs
from torchnlq.models.recorded import Field, check_record, integer

#: The ``model_type`` values of config.json that torchnlq reads (initial load, upcycling).
IMPORTABLE_TYPES = ("gpt2", "llama", "qwen3")
_HINT = "pass a Hugging Face GPT-2, Llama or Qwen3 folder (save_pretrained)"


def hf_model_type(path: str | Path) -> str | None:
    """The ``model_type`` of the folder's config.json when torchnlq can import it, else None."""
    try:
        config = read_json(Path(path, "config.json"), "a Hugging Face config.json", _HINT)
    except (UserError, OSError):
        return None
    kind = config.get("model_type") if isinstance(config, dict) else None
    return kind if kind in IMPORTABLE_TYPES else None


#: ``take(name, shape)``: the fp32 weight ``name`` of a Hugging Face folder, checked to have ``shape``.
Take = Callable[[str, tuple[int, ...]], torch.Tensor]


def read_hf_folder(path: str | Path, model_type: str, architecture: str,
                   model_args: Callable[[dict[str, Any]], ModelArgs], prefix: str = "") -> tuple[ModelArgs, Take]:
    """(ModelArgs of the folder's config.json, which must say ``model_type``; ``take(name, shape)``, the fp32 weight
    ``name`` with its ``prefix`` removed, which must have the ``shape`` the config implies).

    ``model_args`` checks the config against its schema (:func:`~torchnlq.models.recorded.check_record`): a wrong
    type or size is one line naming config.json and the key; a weight missing, not floating point or of another
    shape is one line naming the tensor, the file and both shapes.
    """
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise UserError(f"'{folder}' has no config.json; {_HINT}")
    config = read_json(config_file, "a Hugging Face config.json", _HINT)
    if not isinstance(config, dict) or config.get("model_type") != model_type:
        got = config.get("model_type") if isinstance(config, dict) else None
        raise UserError(f"'{folder}' is not a Hugging Face {model_type} folder (model_type {got!r}, not {model_type!r})")
    try:
        args = model_args(config)
    except KeyError as e:
        raise UserError(f"'{folder}' config.json lacks or mangles {e}; it is not a {architecture} config") from None
    except UserError as e:
        raise UserError(f"'{config_file}': {e}") from None
    tensors, files = read_hf_weights(folder)

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        stored = prefix + name if prefix + name in tensors else name
        if stored not in tensors:
            raise UserError(f"'{folder}' lacks the {architecture} weight {name!r}; is it a complete {architecture} "
                            "model saved with save_pretrained?")
        tensor = tensors[stored]
        if not tensor.is_floating_point():
            raise UserError(f"'{files[stored]}' holds {stored!r} as {tensor.dtype}, not floating point weights")
        if tuple(tensor.shape) != tuple(shape):
            raise UserError(f"'{files[stored]}': tensor {stored!r} has shape {tuple(tensor.shape)} but config.json "
                            f"gives {tuple(shape)}; the weights do not belong to '{config_file}'")
        return tensor.float()

    return args, take


def read_hf_weights(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """The folder's safetensors weights (one file, or the shards an index names), and the file of each; never a
    pickle."""
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
    where: dict[str, Path] = {}
    for file in files:
        try:
            part = load_file(str(file))
        except (SafetensorError, OSError) as e:
            raise UserError(f"'{file}' is unreadable ({e})") from None
        tensors.update(part)
        where.update(dict.fromkeys(part, file))
    return tensors, where


# ---------------------------------------------------------------- GPT-2


#: torchnlq block name -> GPT-2 block name; GPT-2's Conv1D weights (not its LayerNorms') are nn.Linear's transposed.
GPT2_LAYER_NAMES = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc",
                    "mlp.proj": "mlp.c_proj"}


def conv1d(name: str, weight: torch.Tensor) -> torch.Tensor:
    """A weight between nn.Linear's [out, in] and Conv1D's [in, out] (LayerNorm weights as they are)."""
    return weight if name.startswith("ln_") else weight.t().contiguous()


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
        for ours, theirs in GPT2_LAYER_NAMES.items():
            sd[t + ours + ".weight"] = conv1d(ours, take(h + theirs + ".weight", shapes[ours]))
            sd[t + ours + ".bias"] = take(h + theirs + ".bias", shapes[ours][-1:])
    sd["ln_f.weight"], sd["ln_f.bias"] = take("ln_f.weight", (d,)), take("ln_f.bias", (d,))
    if not args.tie_embeddings:
        sd["lm_head.weight"] = take("lm_head.weight", (vocab, d))
    return args, sd


# ---------------------------------------------------------------- Llama, and Qwen3 (Llama with QK-norm)


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


def decoder_model_args(c: dict[str, Any], config: dict[str, Any], architecture: str, **block: Any) -> ModelArgs:
    """torchnlq's ModelArgs of a Llama-style config.json ``config`` whose keys of :data:`DECODER_FIELDS` ``c`` holds
    checked; ``block`` sets the fields the architecture fixes (qk_norm, bias). UserError for what torchnlq cannot
    compute exactly, KeyError for a missing key."""
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
        positions="rope", rope_theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
        norm_eps=c.get("rms_norm_eps", 1e-6), init_std=c.get("initializer_range", 0.02),
        mlp_activation="swiglu", norm="rms", query=Query(type="linear"), **scaled, **block,
    )


def llama_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a LlamaConfig dict, checked against :data:`LLAMA_FIELDS`: UserError for a wrong type
    or size and for what torchnlq cannot compute exactly, KeyError for a missing key (:func:`read_hf_folder` words
    them)."""
    c = check_record(config, LLAMA_FIELDS, "")
    if c.get("attention_bias", False) != c.get("mlp_bias", False):
        raise UserError("Llama attention_bias != mlp_bias: torchnlq's model.bias sets both")
    return decoder_model_args(c, config, "Llama", bias=c.get("attention_bias", False))


def read_decoder_folder(path: str | Path, model_type: str, architecture: str,
                        model_args: Callable[[dict[str, Any]], ModelArgs]) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, torchnlq state dict in fp32) of a Hugging Face folder of a Llama-style ``architecture``
    (safetensors only); every weight has the shape its config.json implies (else one line naming it)."""
    args, take = read_hf_folder(path, model_type, architecture, model_args)
    d, hidden, q, kv, vocab = args.dim, args.mlp_hidden, args.q_dim, args.kv_dim, args.vocab_size
    kinds = ("weight", "bias") if args.bias else ("weight",)
    # nn.Linear weights are [out, in], RMSNorm gains and biases [out].
    shapes = {"ln_1": (d,), "ln_2": (d,), "attn.proj": (d, q), "mlp.gate": (hidden, d), "mlp.fc": (hidden, d),
              "mlp.proj": (d, hidden), "q": (q, d), "kv": (kv, d)}
    if args.qk_norm:
        shapes |= {"attn.q_norm": (args.head_dim,), "attn.k_norm": (args.head_dim,)}
    shape = lambda part, kind: shapes[part] if kind == "weight" else shapes[part][:1]  # noqa: E731
    sd = {"tok_emb.weight": take("model.embed_tokens.weight", (vocab, d)),
          "ln_f.weight": take("model.norm.weight", (d,))}
    for i in range(args.n_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        sd[dst + "attn.query.w_q.weight"] = take(src + "self_attn.q_proj.weight", shapes["q"])
        for kind in kinds:
            sd[dst + f"attn.kv.{kind}"] = torch.cat([take(src + f"self_attn.k_proj.{kind}", shape("kv", kind)),
                                                     take(src + f"self_attn.v_proj.{kind}", shape("kv", kind))])
            for ours, theirs in LLAMA_LAYER_NAMES.items():
                if ours in shapes and (kind == "weight" or ours not in LLAMA_NORMS):
                    sd[dst + f"{ours}.{kind}"] = take(src + f"{theirs}.{kind}", shape(ours, kind))
        if args.bias:
            sd[dst + "attn.q_bias"] = take(src + "self_attn.q_proj.bias", (q,))
    if not args.tie_embeddings:
        sd["lm_head.weight"] = take("lm_head.weight", (vocab, d))
    return args, sd


def read_hf_llama(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, torchnlq state dict in fp32) of a Hugging Face Llama folder (safetensors only); every weight has
    the shape its config.json implies (else one line naming it)."""
    return read_decoder_folder(path, "llama", "LlamaForCausalLM", llama_model_args)


#: A Qwen3 layer's attention (transformers' layer_types).
ATTENTION_KINDS = ("full_attention", "sliding_attention")
#: The Qwen3Config keys torchnlq reads, each checked as the ModelArgs field it becomes or bounds (others ignored).
QWEN3_FIELDS = {
    **DECODER_FIELDS, "use_sliding_window": Field(bool), "sliding_window": integer(0, null=True),
    "max_window_layers": integer(0, null=True),
    "layer_types": Field(list, null=True, values=Field(str, choices=ATTENTION_KINDS)),
}


def qwen3_model_args(config: dict[str, Any]) -> ModelArgs:
    """torchnlq's ModelArgs for a Qwen3Config dict, checked against :data:`QWEN3_FIELDS`: UserError for a wrong type
    or size and for what torchnlq cannot compute exactly, KeyError for a missing key (:func:`read_hf_folder` words
    them)."""
    c = check_record(config, QWEN3_FIELDS, "")
    if c.get("attention_bias", False):
        raise UserError("Qwen3 attention_bias = true: torchnlq's model.bias gives the MLP biases too, which Qwen3 "
                        "has not")
    layers, types = config["num_hidden_layers"], c.get("layer_types")
    if types is None:  # transformers 4.x: the layers from max_window_layers on slide, when the window is on
        sliding = (c.get("use_sliding_window", False) and c.get("sliding_window") is not None
                   and c.get("max_window_layers", 28) < layers)
    else:
        sliding = "sliding_attention" in types
    if sliding:
        raise UserError("Qwen3 sliding-window attention (use_sliding_window, layer_types): torchnlq attends to every "
                        "earlier position in every layer")
    return decoder_model_args(c, config, "Qwen3", qk_norm=True, bias=False)


def read_hf_qwen3(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, torchnlq state dict in fp32) of a Hugging Face Qwen3 folder (safetensors only); every weight has
    the shape its config.json implies (else one line naming it)."""
    return read_decoder_folder(path, "qwen3", "Qwen3ForCausalLM", qwen3_model_args)


# ---------------------------------------------------------------- any of them


#: model_type -> the reader of its Hugging Face folder: (ModelArgs, torchnlq state dict in fp32).
HF_READERS: dict[str, Callable[[Path], tuple[ModelArgs, dict[str, torch.Tensor]]]] = {
    "gpt2": read_hf_gpt2, "llama": read_hf_llama, "qwen3": read_hf_qwen3,
}


def read_hf_model(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor], dict[str, Any]]:
    """(ModelArgs, torchnlq state dict in fp32, tokenizer description) of a Hugging Face GPT-2, Llama or Qwen3
    folder."""
    folder = Path(path)
    args, sd = HF_READERS.get(hf_model_type(folder) or "gpt2", read_hf_gpt2)(folder)
    if any((folder / name).is_file() for name in ("vocab.json", "tokenizer.json")):
        return args, sd, tokenizer_from_folder(folder).describe()
    # save_pretrained of a model alone writes no tokenizer: GPT-2's vocabulary is taken to be GPT-2's, whose ranks
    # an export finds offline (--tiktoken-file, $TORCHNLQ_TIKTOKEN_FILE or tiktoken's cache) and carries on.
    gpt2 = {"name": "gpt2", "vocab_size": BASE_VOCAB_SIZE["gpt2"], "eot_id": GPT2_EOT_ID}
    return args, sd, gpt2 if args.vocab_size == BASE_VOCAB_SIZE["gpt2"] else {}
