"""Export a model to a safetensors folder (``model.safetensors`` + ``config.json`` + Hugging Face tokenizer files).

Written atomically (:func:`atomic_folder`) into the output folders :func:`check_export_folder` allows.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from torchnlq.checkpoint.metadata import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    FORMAT_KEYS,
    FORMAT_VERSION,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
)
from torchnlq.errors import UserError
from torchnlq.files import no_folder_left_on_failure, writing
from torchnlq.interop.load import LoadedModel, as_loaded
from torchnlq.interop.tokenizer_files import carried_bos_id, write_hf_tokenizer_files
from torchnlq.models.args import ModelArgs
from torchnlq.models.family import FAMILIES
from torchnlq.paths import is_within, protected_folders

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: config.json's ``torch_dtype`` for each stored dtype.
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# The torchnlq-specific file of a Hugging Face export: it marks the folder as ours.
HF_EXPORT_FILE = "torchnlq_export.json"
# The Hugging Face tokenizer files every export carries (torchnlq.interop.tokenizer_files).
HF_TOKENIZER_FILES = frozenset({"vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer.json"})
# The transformers model code of a --format hf export (torchnlq/interop/ship_code.py).
HF_MODELING_FILE = "modeling_torchnlq.py"
# Every file an export writes; a folder holding anything else is not replaced by ``overwrite``.
EXPORT_FILES = frozenset({WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE, HF_EXPORT_FILE, HF_MODELING_FILE,
                          "generation_config.json", *HF_TOKENIZER_FILES})


def is_previous_export(folder: Path) -> bool:
    """True for a folder torchnlq wrote as an export: only export files (and the code files a Hugging Face
    export's readable marker lists), marked as a torchnlq export."""
    marked: frozenset[str] = frozenset()
    if (folder / HF_EXPORT_FILE).is_file():
        try:
            marker = json.loads((folder / HF_EXPORT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        files = marker.get("code_files", []) if isinstance(marker, dict) else None
        if not isinstance(files, list) or not all(isinstance(f, str) and f == Path(f).name for f in files):
            return False
        marked = frozenset(files)
    entries = list(folder.iterdir())
    if any(e.name not in EXPORT_FILES | marked or e.is_symlink() or not e.is_file() for e in entries):
        return False
    if (folder / HF_EXPORT_FILE).is_file():
        return True
    try:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("format") == EXPORT_FORMAT


def check_export_folder(out_dir: str | Path, source: str | Path | None = None, overwrite: bool = False) -> Path:
    """Refuse an output folder whose writing could delete or change what the user did not name; return it resolved.

    Refused: the working directory, home or their ancestors; the source, a folder inside or around it
    (or around/inside a checkpoint's run's ``checkpoints``). An existing ``out_dir`` needs
    ``overwrite`` and must be empty or a previous export (:func:`is_previous_export`).
    """
    given = Path(out_dir).expanduser()
    final = given.resolve()
    fix = "choose a new output folder such as exports/NAME"
    if final in protected_folders():
        raise UserError(f"output folder '{out_dir}' is the current directory, the home folder or a parent of one; "
                        f"{fix}")
    if source is not None:
        src = Path(source).expanduser().resolve()
        if final == src:
            raise UserError(f"output folder '{out_dir}' is the source '{source}' itself; {fix}")
        guarded = [(src, f"the source '{source}'", fix)]
        if src.parent.name == "checkpoints":
            guarded.append((src.parent, f"the run's checkpoints folder '{src.parent}'", f"{fix} (or <run>/export)"))
        for folder, what, hint in guarded:  # final == folder only for the checkpoints folder: "lies inside" it
            if is_within(final, folder):
                raise UserError(f"output folder '{out_dir}' lies inside {what}; {hint}")
            if is_within(folder, final):
                raise UserError(f"output folder '{out_dir}' contains {what}; {hint}")
    if given.is_symlink() or final.exists():
        if not overwrite:
            raise UserError(
                f"'{out_dir}' already exists; choose another output folder, or pass --overwrite (overwrite=True) "
                "to replace a previous export"
            )
        if given.is_symlink():
            raise UserError(f"'{out_dir}' is a symbolic link; remove the link or {fix}")
        if not final.is_dir():
            raise UserError(f"'{out_dir}' exists and is not a folder; {fix}")
        held = sorted(p.name for p in final.iterdir())
        if held and not is_previous_export(final):
            other = [n for n in held if n not in EXPORT_FILES]
            raise UserError(
                f"'{out_dir}' is not a torchnlq export (it holds {(other or held)[0]!r}) and --overwrite replaces only "
                f"a previous export; {fix}, or empty that folder yourself"
            )
    return final


def normal_permissions(folder: Path) -> None:
    """Give ``folder`` and its files (an export is flat) the modes a new file gets: mkdtemp and safetensors make
    private ones."""
    mask = None
    with contextlib.suppress(OSError, ValueError):  # read without changing it: other threads may be creating files
        mask = next((int(line.split()[1], 8) for line in Path("/proc/self/status").read_text().splitlines()
                     if line.startswith("Umask:")), None)
    if mask is None:
        mask = os.umask(0o022)
        os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)
    for file in folder.iterdir():
        os.chmod(file, 0o666 & ~mask)


def export_source(loaded: LoadedModel) -> Path | None:
    """The folder a loaded model was read from (a checkpoint or an export); None for a model made in Python."""
    return loaded.path if loaded.kind in ("checkpoint", "export") else None


@contextlib.contextmanager
def atomic_folder(out_dir: str | Path, overwrite: bool = False, source: str | Path | None = None) -> Iterator[Path]:
    """Yield a temporary folder beside ``out_dir``, renamed to ``out_dir`` when the block succeeds: a reader never
    sees a half-written export, and a failure leaves nothing behind. A full disk or read-only folder, whichever
    writer meets it (safetensors, tokenizers, json), is one OSError naming ``out_dir``."""
    final = check_export_folder(out_dir, source, overwrite)
    with no_folder_left_on_failure(out_dir):  # a refusal inside the block leaves no empty parents of out_dir
        with writing(out_dir):
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            with writing(out_dir):  # inside the clean-up: the disk is seen as the failed write left it
                yield tmp
            normal_permissions(tmp)
            if final.exists() or final.is_symlink():
                check_export_folder(out_dir, source, overwrite)  # still a previous export
                old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
                old.rmdir()
                final.rename(old)
                try:
                    tmp.rename(final)
                except BaseException:
                    old.rename(final)
                    raise
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Pretty, key-sorted JSON with a final newline (diff-friendly)."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def cast_weights(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors in ``dtype`` on the CPU; a weight beyond ``dtype``'s range (fp16: 65,504) is refused, not
    written as inf."""
    limit = torch.finfo(dtype).max
    for name, value in state.items():
        if value.is_floating_point() and value.detach().abs().max().item() > limit:
            largest, name_of_dtype = value.detach().abs().max().item(), str(dtype).removeprefix("torch.")
            raise UserError(
                f"weight {name} reaches {largest:.4g}, beyond {name_of_dtype}'s range ({limit:.4g}): it would be "
                "written as inf; export with --dtype bf16 or fp32"
            )
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}


def run_metadata(loaded: LoadedModel) -> dict[str, Any]:
    """The run's metadata every export carries (the source file's own format keys left out)."""
    from torchnlq.version import __version__

    return {
        **{k: v for k, v in loaded.meta.items() if k not in ("model_args", *FORMAT_KEYS)},
        "torchnlq_version": __version__,
        "source": str(loaded.path),
        "model_args": loaded.args.to_dict(),
        "tokenizer": loaded.tokenizer,
    }


def end_of_text_id(args: ModelArgs, tokenizer: dict[str, Any]) -> int | None:
    """The tokenizer's end-of-text id when it lies within the model's vocabulary, else None (transformers warns
    about, and generate() mishandles, a special id outside the vocabulary)."""
    eot = tokenizer.get("eot_id")
    return eot if isinstance(eot, int) and 0 <= eot < args.vocab_size else None


def hf_config_base(args: ModelArgs, tokenizer: dict[str, Any], dtype: torch.dtype, architecture: str,
                   model_type: str) -> dict[str, Any]:
    """The config.json keys every Hugging Face export shares (architecture, dtype, special ids)."""
    eot = end_of_text_id(args, tokenizer)
    return {"architectures": [architecture], "model_type": model_type, "torch_dtype": DTYPE_NAMES[dtype],
            "bos_token_id": eot, "eos_token_id": eot, "use_cache": True}


def prepare_export(source: str | Path | LoadedModel, dtype: str) -> tuple[LoadedModel, torch.dtype]:
    """The model to export and the torch dtype to store (``fp32`` / ``bf16`` / ``fp16``); UserError otherwise.

    A model whose tokenizer's ids reach past its embedding (e.g. an upcycled model given another model's
    tokenizer) is refused when it is exported, not when someone samples from it.
    """
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype '{dtype}'; choose one of: {', '.join(DTYPES)}")
    loaded = as_loaded(source)
    tokens = loaded.tokenizer.get("vocab_size")
    # End-of-text may lie outside the vocabulary (a model trained without it; the export then leaves it out).
    ordinary = tokens - 1 if isinstance(tokens, int) and loaded.tokenizer.get("eot_id") == tokens - 1 else tokens
    if isinstance(tokens, int) and ordinary > loaded.args.vocab_size:
        raise UserError(
            f"the model's tokenizer ({loaded.tokenizer.get('name')}) has {tokens:,} ids but the model only "
            f"{loaded.args.vocab_size:,} embedding rows; its tokenizer metadata is wrong: fix or re-create the model"
        )
    return loaded, DTYPES[dtype]


@contextlib.contextmanager
def export_folder(loaded: LoadedModel, out_dir: str | Path, overwrite: bool) -> Iterator[Path]:
    """:func:`atomic_folder` for an export of ``loaded``, holding its Hugging Face tokenizer files (written first:
    a gpt2 model whose ranks cannot be found fails before the weights are converted)."""
    with atomic_folder(out_dir, overwrite, export_source(loaded)) as tmp:
        write_hf_tokenizer_files(loaded.tokenizer, tmp, loaded.args.max_seq_len, export_source(loaded),
                                 loaded.tiktoken_file)
        yield tmp


def export_safetensors(
    source: str | Path | LoadedModel, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write ``out_dir`` with model.safetensors, config.json (with the run's metadata) and the tokenizer files."""
    from safetensors.torch import save_file

    loaded, target = prepare_export(source, dtype)
    config = {
        **run_metadata(loaded),
        "format": EXPORT_FORMAT,
        "format_version": FORMAT_VERSION,
        # The torch name (float32, bfloat16, float16): transformers reads config.json's "dtype" as one, and
        # AutoTokenizer.from_pretrained(export) loads config.json before the tokenizer files.
        "dtype": DTYPE_NAMES[target],
    }
    with export_folder(loaded, out_dir, overwrite) as tmp:
        state = cast_weights(loaded.model.state_dict(), target)
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "torchnlq_format": EXPORT_FORMAT})
        write_json(tmp / CONFIG_FILE, config)  # last: is_export() keys on it
    return Path(out_dir).expanduser()


def export_hf_standard(
    source: str | Path | LoadedModel, out_dir: str | Path, format: str, dtype: str = "fp32", overwrite: bool = False
) -> Path:
    """Write a folder of the standard transformers architecture ``format`` names (``hf-gpt2``, ``hf-llama``, ...:
    no remote code; the families' :class:`~torchnlq.models.hf_mapping.HFArchitecture` s); return its path.

    Refused in one line when the architecture cannot compute the model exactly. The run's metadata goes to
    ``torchnlq_export.json``; config.json's ``bos_token_id`` is the carried tokenizer's own BOS (Llama's
    ``<|begin_of_text|>``) where its tokenizer config names one, ``eos_token_id`` the model's end-of-text.
    """
    from safetensors.torch import save_file

    from torchnlq.interop.hf_folder import standard_architectures

    architectures = standard_architectures()
    if format not in architectures:
        raise UserError(f"unknown export format {format!r}; choose one of: {', '.join(architectures)}")
    arch = architectures[format]
    loaded, target = prepare_export(source, dtype)
    owner = next(family for family in FAMILIES.values() if arch in family.hf_architectures)
    if loaded.args.family != owner.name:
        raise UserError(f"model.family={loaded.args.family!r}: --format {format} ({arch.architecture}) holds models "
                        f"of the {owner.name} family; export with --format hf (it carries the family's code) or "
                        "--format safetensors")
    reason = arch.incompatibility(loaded.args)
    if reason:
        raise UserError(reason)
    with export_folder(loaded, out_dir, overwrite) as tmp:
        save_file(cast_weights(arch.state_dict(loaded.model), target), str(tmp / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        write_json(tmp / HF_EXPORT_FILE, run_metadata(loaded))
        config = {**hf_config_base(loaded.args, loaded.tokenizer, target, arch.architecture, arch.model_type),
                  **arch.config(loaded.args)}
        bos = carried_bos_id(loaded.tokenizer, export_source(loaded), loaded.args.vocab_size)  # its files are written
        write_json(tmp / CONFIG_FILE, config | ({"bos_token_id": bos} if bos is not None else {}))
    return Path(out_dir).expanduser()
