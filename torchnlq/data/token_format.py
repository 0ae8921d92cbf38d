"""The on-disk token format (docs/data.md): ``train.bin``, ``val.bin`` (raw little-endian uint16, or uint32 when the
vocabulary needs it, as meta.json's ``"dtype"`` records) and ``meta.json``.

Files are written under temporary names and renamed at the end; ``meta.json`` is renamed
last and removed first, so a folder with a ``meta.json`` is always complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from torchnlq.errors import UserError
from torchnlq.files import read_json
from torchnlq.models.recorded import Field, check_record, integer

DTYPE = np.dtype("<u2")  # uint16: GPT-2's 50257 ids fit, at 2 bytes per token (the default and legacy format)
DTYPE_NAME = "uint16"
#: The token dtypes meta.json may record, little-endian whatever the machine.
DTYPES = {"uint16": DTYPE, "uint32": np.dtype("<u4")}
SPLITS = ("train", "val")
META_NAME = "meta.json"
FORMAT_VERSION = 1


def split_file(folder: str | Path, split: str) -> Path:
    """Path of a split's token file (``train.bin`` / ``val.bin``)."""
    return Path(folder) / f"{split}.bin"


def temp_name(final: Path) -> Path:
    """A per-process temporary name beside ``final`` (concurrent ranks never share a half-written file)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def dtype_for_vocab(vocab_size: int) -> str:
    """The dtype name of token files for a vocabulary of ``vocab_size`` ids: uint16 when its largest id fits."""
    return "uint16" if vocab_size - 1 <= np.iinfo(DTYPES["uint16"]).max else "uint32"


def check_vocab_fits(vocab_size: int) -> None:
    """Error when the tokenizer's ids do not fit even the uint32 files."""
    if vocab_size - 1 > np.iinfo(DTYPES["uint32"]).max:
        raise UserError(
            f"vocabulary of {vocab_size:,} tokens does not fit the uint32 token files (largest id 4,294,967,295); "
            "use a tokenizer with fewer tokens"
        )


def token_dtype(meta: dict[str, Any], where: str | Path) -> np.dtype:
    """The dtype meta.json records (absent: uint16, the format before uint32); any other value is one UserError."""
    name = meta.get("dtype", DTYPE_NAME)
    if not isinstance(name, str) or name not in DTYPES:
        raise UserError(
            f"'{where}' records token dtype {name!r}; torchnlq reads {' or '.join(DTYPES)} token files: prepare the "
            "data folder again"
        )
    return DTYPES[name]


def write_tokens(path: Path, total: int, chunks: Iterable[np.ndarray], dtype: np.dtype | str = DTYPE) -> int:
    """Write ``chunks`` (``total`` tokens) to ``path`` as ``dtype``; the largest id (one beyond ``dtype``: refused)."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else np.dtype(dtype)
    if total <= 0:
        raise UserError(f"no tokens to write to {path.name}; the input has no documents for that split")
    # Written in order through a file, not a memory map: a full disk is then an OSError (ENOSPC) on a write, where
    # a memory-mapped page the disk cannot hold kills the process with SIGBUS.
    limit = int(np.iinfo(dtype).max)
    pos, largest = 0, -1
    with open(path, "wb") as f:
        for chunk in chunks:
            n = len(chunk)
            if n:
                largest = max(largest, int(np.max(chunk)))
                if largest > limit:  # numpy would wrap it silently into another id
                    raise RuntimeError(f"{path.name}: token id {largest} does not fit {dtype.name}")
            if pos + n > total:
                raise RuntimeError(f"{path.name}: more tokens than the {total} counted")
            np.ascontiguousarray(chunk, dtype=dtype).tofile(f)
            pos += n
    if pos != total:
        raise RuntimeError(f"{path.name}: wrote {pos} tokens, expected {total}")
    return largest


def file_identity(path: Path, digest: str | None = None) -> dict[str, Any]:
    """What meta.json records of a token file: its sha256 (read in full unless given), size and mtime."""
    if digest is None:
        sha = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 24):
                sha.update(chunk)
        digest = sha.hexdigest()
    stat = path.stat()
    return {"sha256": digest, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def verify_files(folder: Path, meta: dict[str, Any], full: bool = False) -> None:
    """The token files are those meta.json recorded: same size and mtime (cheap), else (or with ``full``) the
    same sha256; a changed file is one UserError. Folders prepared before the record are not checked."""
    for split, recorded in (meta.get("files") or {}).items():
        path = split_file(folder, split)
        stat = path.stat()
        if not full and (stat.st_size, stat.st_mtime_ns) == (recorded.get("bytes"), recorded.get("mtime_ns")):
            continue
        if file_identity(path)["sha256"] != recorded.get("sha256"):
            raise UserError(
                f"{path} is not the file meta.json records (its content changed since it was prepared); "
                "prepare the data folder again"
            )


def commit(folder: Path, temps: dict[str, Path], meta: dict[str, Any]) -> None:
    """Move the temporary split files (``temps``: split -> file) into place; meta.json goes first out, last in,
    recording each split's sha256, size and mtime (``files``: checked when a run opens the folder, and part
    of its resume fingerprint).

    The files it replaces are kept aside until the new meta.json is in place: interrupted anywhere (a
    signal, a full disk), the folder is put back as it was, never half old and half new.
    """
    meta_path = folder / META_NAME
    meta_tmp = temp_name(meta_path)
    digests = {split: file_identity(tmp)["sha256"] for split, tmp in temps.items()}
    replaced = [meta_path, *(split_file(folder, split) for split in temps)]
    kept: dict[Path, Path] = {}  # a file being replaced -> where its previous version waits
    placed: list[Path] = []
    try:
        for path in replaced:
            if path.exists():
                kept[path] = path.with_name(f".{path.name}.previous-{os.getpid()}")
                os.replace(path, kept[path])
        for split, tmp in temps.items():
            os.replace(tmp, split_file(folder, split))
            placed.append(split_file(folder, split))
        files = {split: file_identity(split_file(folder, split), digests.get(split)) for split in SPLITS}
        meta_tmp.write_text(json.dumps({**meta, "files": files}, indent=2) + "\n")
        os.replace(meta_tmp, meta_path)
    except BaseException:
        meta_tmp.unlink(missing_ok=True)
        for path in placed:
            path.unlink(missing_ok=True)
        for path, previous in kept.items():
            os.replace(previous, path)
        raise
    for previous in kept.values():
        previous.unlink(missing_ok=True)


def remove_temps(temps: Iterable[Path]) -> None:
    """Delete leftover temporary files (after a failure)."""
    for tmp in temps:
        tmp.unlink(missing_ok=True)


_COUNTS = Field(dict, values=integer(0, 2**63 - 1))  # split -> a count
#: What a data folder's meta.json may hold: the keys its readers use, each of its exact type and range (others,
#: such as "source", are ignored). vocab_size and eot_id are read as integers by every consumer (ids are checked
#: against them); the dtype's value is :func:`token_dtype`'s to check.
META_FIELDS: dict[str, Field] = {
    "tokenizer": Field(str), "vocab_size": integer(1, 2**32, required=True), "eot_id": integer(0, 2**32 - 1),
    "dtype": Field(str), "format_version": integer(0, 2**31), "tokens": _COUNTS, "documents": _COUNTS,
    "bytes": _COUNTS, "max_token_id": Field(dict, values=integer(-1, 2**32 - 1)), "tokenizer_info": Field(dict),
    "files": Field(dict, values=Field(dict, fields={
        "sha256": Field(str), "bytes": integer(0, 2**63 - 1), "mtime_ns": integer(-(2**63), 2**63 - 1)})),
}


def text_bytes(meta: dict[str, Any], split: str) -> int | None:
    """The UTF-8 bytes of a split's text: meta.json's ``bytes`` (prepare_data.py records them), or for the byte
    tokenizer its tokens less its eot ids (one byte a token); None when unknown (an adopted GPT-2 folder)."""
    recorded = (meta.get("bytes") or {}).get(split)
    if isinstance(recorded, int):
        return recorded
    tokens, documents = (meta.get("tokens") or {}).get(split), (meta.get("documents") or {}).get(split)
    if meta.get("tokenizer") == "byte" and isinstance(tokens, int) and isinstance(documents, int):
        return tokens - documents  # every document of a byte folder ends in the eot id (adopted: each eot counted)
    return None


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The folder's meta.json checked against :data:`META_FIELDS`, or a UserError saying it is missing, unreadable
    or which entry is wrong."""
    path = Path(folder) / META_NAME
    if not path.is_file():
        raise UserError(f"'{path}' is missing; the data folder is incomplete, prepare it again")
    meta = read_json(path, "a data folder's meta.json", "prepare the data folder again")
    if not isinstance(meta, dict) or "tokenizer" not in meta:
        raise UserError(f"'{path}' has no 'tokenizer' entry; prepare the data folder again")
    try:
        meta = meta | check_record(meta, META_FIELDS, "")
    except UserError as e:
        raise UserError(f"'{path}': {e}; prepare the data folder again") from None
    token_dtype(meta, path)  # an unknown dtype is refused here, before any reader maps a file with it
    return meta


def is_complete(folder: str | Path) -> bool:
    """Whether meta.json and every split file exist."""
    folder = Path(folder)
    return (folder / META_NAME).is_file() and all(split_file(folder, s).is_file() for s in SPLITS)


def make_meta(
    tokenizer: dict[str, Any], tokens: dict[str, int], documents: dict[str, int], source: dict[str, Any],
    max_token_id: dict[str, int] | None = None, dtype: str = DTYPE_NAME, text_bytes: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The meta.json content: tokenizer fields, counts, the largest id per split, the token dtype, and source;
    ``text_bytes``: the UTF-8 bytes of each split's documents (without the eot ids), where the text was seen."""
    extra = {"max_token_id": max_token_id} if max_token_id is not None else {}
    extra |= {"bytes": text_bytes} if text_bytes is not None else {}
    return extra | {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer["name"],
        "vocab_size": tokenizer["vocab_size"],
        "eot_id": tokenizer["eot_id"],
        "tokenizer_info": tokenizer,
        "dtype": dtype,
        "tokens": tokens,
        "documents": documents,
        "source": source,
    }
