"""Reading Hugging Face model folders (``save_pretrained``): which architecture, its config.json and its weights,
handed to the family that reads that architecture (:class:`~torchnlq.models.hf_mapping.HFArchitecture`: GPT-2,
Llama, Qwen3, Qwen3-MoE of the built-in families, ...). Here, below the loaders, so that
:func:`~torchnlq.interop.load.load_model` opens these folders like its own.

Weights are read with safetensors only: a pickle is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchnlq.data.tokenizer import BASE_VOCAB_SIZE, GPT2_EOT_ID
from torchnlq.errors import UserError
from torchnlq.files import read_json
from torchnlq.interop.tokenizer_files import tokenizer_from_folder
from torchnlq.models.args import ModelArgs
from torchnlq.models.family import FAMILIES
from torchnlq.models.hf_mapping import HFArchitecture, Take

_HINT = "pass a Hugging Face folder of an architecture torchnlq reads (save_pretrained)"


def standard_architectures() -> dict[str, HFArchitecture]:
    """Every family's standard Hugging Face architectures, by export format (``hf-llama``)."""
    return {arch.format: arch for family in FAMILIES.values() for arch in family.hf_architectures}


def importable_architectures() -> dict[str, HFArchitecture]:
    """The architectures torchnlq reads, by config.json's ``model_type`` (initial load, upcycling)."""
    return {arch.model_type: arch for arch in standard_architectures().values()}


def readable_folders() -> str:
    """"a Hugging Face folder of transformers' GPT2LMHeadModel, ... or Qwen3MoeForCausalLM": the folders torchnlq
    reads, named from the registered families' architectures (a family's folder appears once it registers)."""
    names = [arch.architecture for arch in standard_architectures().values()]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"a Hugging Face folder of transformers' {listed}"


def hf_model_type(path: str | Path) -> str | None:
    """The ``model_type`` of the folder's config.json when torchnlq can import it, else None."""
    try:
        config = read_json(Path(path, "config.json"), "a Hugging Face config.json", _HINT)
    except (UserError, OSError):
        return None
    kind = config.get("model_type") if isinstance(config, dict) else None
    return kind if kind in importable_architectures() else None


def config_model_args(folder: Path, model_type: str, architecture: str,
                      model_args: Callable[[dict[str, Any]], ModelArgs]) -> ModelArgs:
    """The ModelArgs of ``folder``'s config.json, which must say ``model_type`` (no weight is read); one line naming
    config.json and the key for a wrong type or size."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise UserError(f"'{folder}' has no config.json; {_HINT}")
    config = read_json(config_file, "a Hugging Face config.json", _HINT)
    if not isinstance(config, dict) or config.get("model_type") != model_type:
        got = config.get("model_type") if isinstance(config, dict) else None
        raise UserError(f"'{folder}' is not a Hugging Face {model_type} folder "
                        f"(model_type {got!r}, not {model_type!r})")
    try:
        return model_args(config)
    except KeyError as e:
        raise UserError(f"'{folder}' config.json lacks or mangles {e}; it is not a {architecture} config") from None
    except UserError as e:
        raise UserError(f"'{config_file}': {e}") from None


def hf_folder_model_args(path: str | Path) -> ModelArgs:
    """The ModelArgs of a Hugging Face folder of an architecture a family reads, from its config.json alone."""
    folder = Path(path)
    arch = importable_architectures()[hf_model_type(folder)]
    return config_model_args(folder, arch.model_type, arch.architecture, arch.model_args)


def read_hf_folder(path: str | Path, model_type: str, architecture: str,
                   model_args: Callable[[dict[str, Any]], ModelArgs], prefix: str = "") -> tuple[ModelArgs, Take]:
    """(ModelArgs of the folder's config.json, which must say ``model_type``; ``take(name, shape)``, the fp32 weight
    ``name`` with its ``prefix`` removed, which must have the ``shape`` the config implies).

    ``model_args`` checks the config against its schema (:func:`~torchnlq.models.recorded.check_record`): a wrong
    type or size is one line naming config.json and the key; a weight missing, not floating point or of another
    shape is one line naming the tensor, the file and both shapes.
    """
    folder = Path(path)
    args = config_model_args(folder, model_type, architecture, model_args)
    config_file = folder / "config.json"
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


def read_hf_architecture(path: str | Path, arch: HFArchitecture) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, torchnlq state dict in fp32) of a Hugging Face folder of ``arch`` (safetensors only); every
    weight has the shape its config.json implies (else one line naming it)."""
    args, take = read_hf_folder(path, arch.model_type, arch.architecture, arch.model_args, prefix=arch.prefix)
    return args, arch.read_state_dict(args, take)


def read_hf_model(path: str | Path) -> tuple[ModelArgs, dict[str, torch.Tensor], dict[str, Any]]:
    """(ModelArgs, torchnlq state dict in fp32, tokenizer description) of a Hugging Face folder of any
    architecture a family reads (GPT-2 when its config.json names none)."""
    folder = Path(path)
    architectures = importable_architectures()
    args, sd = read_hf_architecture(folder, architectures.get(hf_model_type(folder) or "gpt2", architectures["gpt2"]))
    if any((folder / name).is_file() for name in ("vocab.json", "tokenizer.json")):
        return args, sd, tokenizer_from_folder(folder).describe()
    # save_pretrained of a model alone writes no tokenizer: GPT-2's vocabulary is taken to be GPT-2's, whose ranks
    # an export finds offline (--tiktoken-file, $TORCHNLQ_TIKTOKEN_FILE or tiktoken's cache) and carries on.
    gpt2 = {"name": "gpt2", "vocab_size": BASE_VOCAB_SIZE["gpt2"], "eot_id": GPT2_EOT_ID}
    return args, sd, gpt2 if args.vocab_size == BASE_VOCAB_SIZE["gpt2"] else {}
