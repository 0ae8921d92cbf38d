"""Export any torchnlq model as a Hugging Face transformers folder (``scripts/convert_checkpoint.py --format hf``).

The folder loads with ``AutoModelForCausalLM.from_pretrained(folder)`` once torchnlq is imported
(:mod:`torchnlq.hf.auto` registers the classes), or with ``trust_remote_code=True`` without
torchnlq: it carries ``modeling_torchnlq.py``, the self-contained model code. Every query type,
RoPE, GQA, biases and tied or untied heads export; the weights keep torchnlq's names under ``model.``
(an untied head is ``lm_head.weight``), so the conversion is a rename.

Writing needs no transformers: ``config.json`` is written from :class:`ModelArgs` through
:data:`CONFIG_NAMES`, and ``TorchnlqConfig`` in the copied file reads it back.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

import torch

from torchnlq.checkpoint.export import (
    HF_EXPORT_FILE,
    HF_MODELING_FILE,
    atomic_folder,
    check_export_folder,
    export_source,
    parse_dtype,
    write_json,
)
from torchnlq.checkpoint.load import LoadedModel, as_loaded
from torchnlq.checkpoint.metadata import CONFIG_FILE, FORMAT_KEYS, WEIGHTS_FILE
from torchnlq.data.hf_tokenizer import write_hf_tokenizer_files
from torchnlq.errors import UserError
from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT

#: The model code copied into every export (and registered by torchnlq.hf.auto).
MODELING_SOURCE = Path(__file__).with_name("modeling_torchnlq.py")
#: ModelArgs field -> TorchnlqConfig field (transformers' usual names where one exists).
CONFIG_NAMES = {
    "n_layers": "num_hidden_layers",
    "dim": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "mlp_hidden": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_seq_len": "max_position_embeddings",
    "tie_embeddings": "tie_word_embeddings",
    "positions": "positions",
    "rope_theta": "rope_theta",
    "norm_eps": "norm_eps",
    "init_std": "initializer_range",
    "bias": "bias",
    "mlp_activation": "mlp_activation",
    "query": "query",
}
#: ModelArgs fields that say how weights start, not what the model computes.
NOT_IN_CONFIG = ("init",)
AUTO_MAP = {
    "AutoConfig": "modeling_torchnlq.TorchnlqConfig",
    "AutoModelForCausalLM": "modeling_torchnlq.TorchnlqForCausalLM",
}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
#: Prefix of every torchnlq state-dict name but the untied head's (TorchnlqForCausalLM.model).
WEIGHT_PREFIX = "model."
HEAD_WEIGHT = "lm_head.weight"


@cache
def supported_query_types() -> tuple[str, ...]:
    """``QUERY_TYPES`` of modeling_torchnlq.py, read from its source: writing must not import transformers."""
    tree = ast.parse(MODELING_SOURCE.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "QUERY_TYPES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"{MODELING_SOURCE} defines no QUERY_TYPES")


def hf_weight_name(name: str) -> str:
    """The export's name of a torchnlq state-dict entry: ``model.`` + name, the untied head unchanged."""
    return name if name == HEAD_WEIGHT else WEIGHT_PREFIX + name


def hf_state_dict(model: GPT, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's weights under the export's names, in ``dtype``, on the CPU (a tied head is stored once)."""
    return {hf_weight_name(k): v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}


def end_of_text_id(args: ModelArgs, tokenizer: dict[str, Any]) -> int | None:
    """The tokenizer's end-of-text id when it lies within the model's vocabulary, else None.

    transformers warns about (and generate() mishandles) a special id outside the vocabulary.
    """
    eot = tokenizer.get("eot_id")
    return eot if isinstance(eot, int) and 0 <= eot < args.vocab_size else None


def hf_config(args: ModelArgs, tokenizer: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """config.json: every ModelArgs field under its TorchnlqConfig name, plus what transformers reads.

    Every field is written, defaults included (``to_dict`` leaves some defaults out), so the file
    says what the model is without relying on the defaults of the copied modeling code.
    """
    values = {k: v for k, v in asdict(args).items() if k not in NOT_IN_CONFIG}
    unmapped = sorted(set(values) - set(CONFIG_NAMES))
    if unmapped:  # a new ModelArgs field needs a config name here and support in modeling_torchnlq.py
        raise RuntimeError(f"ModelArgs fields {unmapped} have no TorchnlqConfig name in CONFIG_NAMES")
    eot = end_of_text_id(args, tokenizer)
    return {
        **{CONFIG_NAMES[k]: v for k, v in values.items()},
        "architectures": ["TorchnlqForCausalLM"],
        "model_type": "torchnlq",
        "auto_map": dict(AUTO_MAP),
        "torch_dtype": DTYPE_NAMES[dtype],
        "bos_token_id": eot,
        "eos_token_id": eot,
        "use_cache": True,
    }


def generation_config(eot: int) -> dict[str, Any]:
    """generation_config.json: end-of-text stops generation and pads finished rows (as GPT-2 has no pad token)."""
    return {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}


def export_hf(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write a transformers folder for any torchnlq model; return its path.

    ``source`` is a checkpoint folder, an export folder or a :class:`LoadedModel`. The folder holds
    config.json (``model_type: torchnlq`` and the ``auto_map`` to the carried modeling_torchnlq.py),
    model.safetensors (in ``dtype``: fp32, bf16 or fp16), modeling_torchnlq.py,
    generation_config.json (when the tokenizer's end-of-text id is in the vocabulary),
    torchnlq_export.json (the run's metadata; it marks the folder as a torchnlq export) and the
    tokenizer files (``AutoTokenizer.from_pretrained`` encodes to the model's ids). It is written
    under a temporary name and renamed when complete (:func:`atomic_folder`).
    """
    from safetensors.torch import save_file

    from torchnlq.version import __version__

    target = parse_dtype(dtype)
    loaded = as_loaded(source)
    qtype = loaded.args.query.type
    if qtype not in supported_query_types():
        raise UserError(
            f"query type {qtype} has no Hugging Face implementation in torchnlq/hf/{HF_MODELING_FILE} "
            f"(it has {', '.join(supported_query_types())}); export with --format safetensors"
        )
    check_export_folder(out_dir, export_source(loaded), overwrite)  # before converting the weights
    extra = {
        **{k: v for k, v in loaded.meta.items() if k not in ("model_args", *FORMAT_KEYS)},
        "torchnlq_version": __version__,
        "dtype": DTYPE_NAMES[target],
        "model_args": loaded.args.to_dict(),
        "tokenizer": loaded.tokenizer,
        "source": str(loaded.path),
    }
    eot = end_of_text_id(loaded.args, loaded.tokenizer)
    config = hf_config(loaded.args, loaded.tokenizer, target)
    with atomic_folder(out_dir, overwrite, export_source(loaded)) as tmp:
        # The tokenizer first: a gpt2 model whose ranks cannot be found fails before the weights are converted.
        write_hf_tokenizer_files(loaded.tokenizer, tmp, loaded.args.max_seq_len, export_source(loaded))
        save_file(hf_state_dict(loaded.model, target), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        shutil.copyfile(MODELING_SOURCE, tmp / HF_MODELING_FILE)
        if eot is not None:
            write_json(tmp / "generation_config.json", generation_config(eot))
        write_json(tmp / HF_EXPORT_FILE, extra)
        write_json(tmp / CONFIG_FILE, config)
    return Path(out_dir).expanduser()
