"""Load a model for inference: a checkpoint (``<run>/checkpoints/step-N``), an export, or a Hugging Face GPT-2,
Llama or Qwen3 folder (read by :func:`torchnlq.interop.hf_folder.read_hf_model`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchnlq.checkpoint.metadata import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    FORMAT_VERSION,
    META_FILE,
    MODEL_KEY,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    read_meta,
)
from torchnlq.checkpoint.record import TOKENIZER_FIELDS, RunRecord
from torchnlq.errors import UserError
from torchnlq.files import read_json
from torchnlq.interop.hf_folder import (
    hf_folder_model_args,
    hf_model_type,
    importable_architectures,
    read_hf_model,
    readable_folders,
)
from torchnlq.interop.tokenizer_files import tokenizer_from_folder
from torchnlq.models.args import ModelArgs
from torchnlq.models.decoder import Decoder
from torchnlq.models.family import build_model
from torchnlq.models.recorded import check_record, shown


@dataclass
class LoadedModel:
    """A model ready for inference (eval mode, fp32), its tokenizer description and its run's metadata."""

    model: Decoder
    args: ModelArgs
    tokenizer: dict[str, Any]
    meta: dict[str, Any]  # the JSON ``record`` was read from, which exports carry over
    #: The folder it was read from, whose tokenizer files exports and generate.py use.
    path: Path
    #: "checkpoint", or "export": a folder of config.json + safetensors weights (torchnlq's export, or a Hugging Face
    #: folder: ``meta["imported_from"]``); anything else (a model made in Python) has no folder of files.
    kind: str
    record: RunRecord | None = None
    #: A GPT-2 ranks file the user named (--tiktoken-file): its exports take the ranks from it first.
    tiktoken_file: str | None = None

    def __post_init__(self) -> None:
        if self.record is None:  # a model made in Python: it records only its shapes and tokenizer
            self.record = RunRecord(model_args=self.args, tokenizer=self.tokenizer)


def resolve_device(name: str | torch.device) -> torch.device:
    """``cpu``, ``cuda[:i]`` or ``auto`` (CUDA when present), checked to exist on this machine; else one UserError
    about the device (a missing index would otherwise reach the weights' reader, whose refusal reads as a damaged
    model file)."""
    if isinstance(name, torch.device):
        device = name
    elif name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise UserError(f"unknown device '{name}'; use cpu, cuda, cuda:N or auto") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"device '{name}' is not supported by torchnlq's tools; use cpu, cuda, cuda:N or auto")
    if device.type == "cpu" and device.index not in (None, 0):
        raise UserError(f"device '{name}' does not exist: the CPU is one device (cpu, or cpu:0); use --device cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device '{name}' asked for but no CUDA device is visible; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        have = f"cuda:0 to cuda:{count - 1}" if count > 1 else "cuda:0"
        raise UserError(f"device '{name}' does not exist: this machine has {count} CUDA device"
                        f"{'s' if count != 1 else ''} ({have}); use one of them, or --device cpu")
    return device


def in_words(names: list[str]) -> str:
    """``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def read_config(path: str | Path) -> dict[str, Any] | None:
    """``config.json`` of a folder holding one beside model.safetensors, else None; corrupt JSON is a UserError."""
    config = Path(path, CONFIG_FILE)
    if not (config.is_file() and Path(path, WEIGHTS_FILE).is_file()):
        return None
    return _read_json(config)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of an export; a corrupt one is a UserError."""
    d = read_json(path, "an export's JSON file", "export the model again")  # never unpickled
    if not isinstance(d, dict):
        raise UserError(f"'{path}' is corrupt (not a JSON object); export the model again")
    return d


def is_export(path: str | Path) -> bool:
    """True when ``path`` is a folder written by :func:`torchnlq.interop.export.export_safetensors`."""
    return (read_config(path) or {}).get("format") == EXPORT_FORMAT


def folder_model_args(path: str | Path) -> ModelArgs:
    """The ModelArgs of a checkpoint, an export or a Hugging Face folder a family reads, from its JSON alone (no
    weight is read: the model an initial load would take, ``model.from_checkpoint``)."""
    p = Path(path).expanduser()
    config = read_config(p)
    if config is not None and config.get("format") == EXPORT_FORMAT:
        return RunRecord.from_meta(config, p / CONFIG_FILE).model_args
    if Path(p, META_FILE).is_file():
        return RunRecord.from_meta(read_meta(p), p / META_FILE).model_args
    if hf_model_type(p) is not None:
        return hf_folder_model_args(p)
    raise UserError(f"'{path}' is neither a torchnlq checkpoint (no {META_FILE}), an export (no {CONFIG_FILE} + "
                    f"{WEIGHTS_FILE}) nor a Hugging Face folder torchnlq reads "
                    f"({in_words(list(importable_architectures()))})")


def as_loaded(source: str | Path | LoadedModel, device: str | torch.device = "cpu") -> LoadedModel:
    """Pass a LoadedModel through, load anything else with :func:`load_model`."""
    return source if isinstance(source, LoadedModel) else load_model(source, device)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Load a checkpoint folder, an export folder or a Hugging Face folder a family reads for inference;
    UserError when it is none of them or unusable."""
    p = Path(path).expanduser()
    device = resolve_device(device)
    if not p.exists():
        raise UserError(f"'{path}' does not exist; pass a <run>/checkpoints/step-N folder, an export folder or "
                        f"{readable_folders()}")
    config = read_config(p)
    if config is not None and config.get("format") == EXPORT_FORMAT:
        return _load_export(p, config, device)
    if Path(p, META_FILE).is_file():
        return _load_checkpoint(p, device)
    if hf_model_type(p) is not None:
        return _load_hf_folder(p, device)
    if config is not None:
        raise UserError(
            f"'{path}' is not a torchnlq export, nor a Hugging Face folder torchnlq reads (its model_type is "
            f"{shown(config.get('model_type'))}; torchnlq reads {in_words(list(importable_architectures()))}); "
            "load it with "
            "transformers, or "
            "pass a torchnlq checkpoint or a --format safetensors export"
        )
    hint = ""
    if Path(p, "checkpoints").is_dir():
        hint = f" (it looks like a run folder: pass one of {p / 'checkpoints'}/step-N)"
    raise UserError(
        f"'{path}' is neither a torchnlq checkpoint (no {META_FILE}), an export (no {CONFIG_FILE} + "
        f"{WEIGHTS_FILE}) nor {readable_folders()}{hint}"
    )


def planned_model(args: ModelArgs, device: torch.device, where: str | Path) -> Decoder:
    """The model ``args`` describe, on the meta device: its shapes, nothing allocated. A UserError when its fp32
    weights and buffers alone exceed ``device``'s memory (a stranger's record asking for terabytes), before any
    tensor exists; ``where`` names the file that describes it."""
    from torchnlq.parallel.device_memory import GIB, device_memory_bytes

    with torch.device("meta"):
        model = build_model(args)
    need = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    limit = device_memory_bytes(device)
    if limit is not None and need > limit:
        memory = "this machine's RAM" if device.type == "cpu" else f"the memory of {device}"
        raise UserError(
            f"'{where}' describes a model of {model.num_params():,} parameters: {need / GIB:,.1f} GiB of fp32 weights "
            f"and buffers, more than {memory} ({limit / GIB:,.1f} GiB); if the file is damaged or was edited, use "
            "another copy, else load it on a larger machine"
        )
    return model


def materialize(model: Decoder, device: torch.device) -> Decoder:
    """A :func:`planned_model` with allocated but unset parameters (RoPE tables computed), in eval mode."""
    model.to_empty(device=device)
    if model.rope is not None:
        model.rope.init_weights()
    return model.eval()


def check_tensors(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], weights: str | Path,
                  config: str | Path) -> None:
    """One UserError line for the first tensor missing from the ``weights`` file, of another shape than the
    model_args of the ``config`` file give, or with no place in that model."""
    for name, shape in expected.items():
        if name not in found:
            raise UserError(f"'{weights}' lacks tensor '{name}' {tuple(shape)} that the model_args of '{config}' "
                            "give; the two files do not belong together")
        if tuple(found[name]) != tuple(shape):
            raise UserError(f"'{weights}': tensor '{name}' has shape {tuple(found[name])} but the model_args give "
                            f"{tuple(shape)} ('{config}'); the two files do not belong together")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise UserError(f"'{weights}' holds tensor '{extra[0]}' {tuple(found[extra[0]])} that the model_args of "
                        f"'{config}' have no place for; the two files do not belong together")


def _shapes(model: Decoder) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _load_checkpoint(path: Path, device: torch.device) -> LoadedModel:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from torchnlq.checkpoint.safe_reader import DCPReadError, load_dcp, read_safe_metadata

    meta = read_meta(path)
    record = RunRecord.from_meta(meta, path / META_FILE)
    args = record.model_args
    model = planned_model(args, device, path / META_FILE)
    # Unpickled with an allow-list of DCP's metadata classes; anything else is a UserError (safe_reader.py).
    saved = read_safe_metadata(path).state_dict_metadata
    prefix = MODEL_KEY + "."
    found = {
        k[len(prefix):]: tuple(v.size)
        for k, v in saved.items()
        if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
    }
    check_tensors(_shapes(model), found, path / ".metadata", path / META_FILE)
    state = materialize(model, device).state_dict()  # tensors share storage with the parameters: DCP loads in place
    try:
        load_dcp({MODEL_KEY: state}, path)
    except DCPReadError as e:
        raise UserError(f"could not read checkpoint '{path}': {e}") from None
    model.load_state_dict(state, strict=True)
    return LoadedModel(model, args, record.tokenizer, meta, path, "checkpoint", record)


def imported_meta(path: Path) -> dict[str, Any]:
    """The metadata of a model read from a Hugging Face folder."""
    return {"source": str(path), "imported_from": f"huggingface-{hf_model_type(path)}"}


def _load_hf_folder(path: Path, device: torch.device) -> LoadedModel:
    """A Hugging Face folder a family reads with the tokenizer it carries: kind "export" with ``path`` the
    folder, so that exports and generate.py read the tokenizer files there."""
    args, sd, tokenizer = read_hf_model(path)
    model = materialize(planned_model(args, device, path / CONFIG_FILE), device)
    model.load_state_dict(sd, strict=True)
    return LoadedModel(model, args, tokenizer, imported_meta(path), path, "export")


def safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """name -> shape of the tensors of a safetensors file, from its header alone (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), "pt", device="cpu") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise UserError(f"'{file}' is unreadable ({e}); export the model again") from None


def _load_export(path: Path, config: dict[str, Any], device: torch.device) -> LoadedModel:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    version = config.get("format_version", 0)
    if type(version) is not int:
        raise UserError(f"export '{path}' has format_version {version!r}, not a version number; export the model again")
    if version > FORMAT_VERSION:
        raise UserError(f"export '{path}' has format_version {version}, newer than this torchnlq reads "
                        f"({FORMAT_VERSION}); upgrade torchnlq")
    record = RunRecord.from_meta(config, path / CONFIG_FILE)
    args = record.model_args
    model = planned_model(args, device, path / CONFIG_FILE)
    check_tensors(_shapes(model), safetensors_shapes(path / WEIGHTS_FILE), path / WEIGHTS_FILE, path / CONFIG_FILE)
    try:
        tensors = load_file(str(path / WEIGHTS_FILE), device=str(device))
    except (SafetensorError, OSError) as e:
        raise UserError(f"'{path / WEIGHTS_FILE}' is unreadable ({e}); export the model again") from None
    not_float = sorted(k for k, v in tensors.items() if not v.is_floating_point())
    if not_float:  # an integer tensor would be cast silently into the float parameter
        raise UserError(f"'{path / WEIGHTS_FILE}' holds {not_float[0]} as {tensors[not_float[0]].dtype}, not floating "
                        "point weights; export the model again")
    materialize(model, device).load_state_dict(tensors, strict=True)  # copies, upcasting bf16/fp16 to fp32
    if not record.tokenizer:
        record.tokenizer = _export_tokenizer_description(path)
    return LoadedModel(model, args, record.tokenizer, config, path, "export", record)


def _export_tokenizer_description(path: Path) -> dict[str, Any]:
    """The tokenizer of an export whose config.json records none (older ones kept it in tokenizer_config.json)."""
    if (path / TOKENIZER_FILE).is_file():
        d = _read_json(path / TOKENIZER_FILE)
        if isinstance(d.get("name"), str):
            try:
                return d | check_record(d, TOKENIZER_FIELDS, "tokenizer")
            except UserError as e:
                raise UserError(f"'{path / TOKENIZER_FILE}': {e}; export the model again") from None
    tokenizer = tokenizer_from_folder(path)
    return tokenizer.describe() if tokenizer is not None else {}
