"""The on-disk token format: ``train.bin``, ``val.bin`` (raw little-endian uint16) and ``meta.json``.

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

DTYPE = np.dtype("<u2")  # uint16: GPT-2's 50257 ids fit, at 2 bytes per token
DTYPE_NAME = "uint16"
SPLITS = ("train", "val")
META_NAME = "meta.json"
FORMAT_VERSION = 1


def split_file(folder: str | Path, split: str) -> Path:
    """Path of a split's token file (``train.bin`` / ``val.bin``)."""
    return Path(folder) / f"{split}.bin"


def temp_name(final: Path) -> Path:
    """A per-process temporary name beside ``final`` (concurrent ranks never share a half-written file)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def check_vocab_fits(vocab_size: int) -> None:
    """Error when the tokenizer's ids do not fit the uint16 files."""
    if vocab_size - 1 > np.iinfo(DTYPE).max:
        raise UserError(
            f"vocabulary of {vocab_size} tokens does not fit the uint16 token files (largest id 65535); "
            "use a tokenizer with at most 65536 tokens"
        )


def write_tokens(path: Path, total: int, chunks: Iterable[np.ndarray]) -> int:
    """Write ``chunks`` (concatenated, ``total`` tokens) to ``path`` as uint16 through a memmap; return the largest id."""
    if total <= 0:
        raise UserError(f"no tokens to write to {path.name}; the input has no documents for that split")
    arr = np.memmap(path, dtype=DTYPE, mode="w+", shape=(total,))
    pos, largest = 0, -1
    for chunk in chunks:
        n = len(chunk)
        if n:
            largest = max(largest, int(np.max(chunk)))
        if pos + n > total:
            raise RuntimeError(f"{path.name}: more tokens than the {total} counted")
        arr[pos : pos + n] = chunk
        pos += n
    if pos != total:
        raise RuntimeError(f"{path.name}: wrote {pos} tokens, expected {total}")
    arr.flush()
    del arr
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
    """Move the temporary split files (``temps``: split -> file) into place; meta.json goes first out, last in.

    meta.json records each split's sha256, size and mtime (``files``): a run checks them when it opens the
    folder, and its resume fingerprint holds the hashes, so an edit anywhere in the corpus is noticed.
    """
    meta_path = folder / META_NAME
    meta_tmp = temp_name(meta_path)
    digests = {split: file_identity(tmp)["sha256"] for split, tmp in temps.items()}
    meta_path.unlink(missing_ok=True)
    for split, tmp in temps.items():
        os.replace(tmp, split_file(folder, split))
    files = {split: file_identity(split_file(folder, split), digests.get(split)) for split in SPLITS}
    meta_tmp.write_text(json.dumps({**meta, "files": files}, indent=2) + "\n")
    os.replace(meta_tmp, meta_path)


def remove_temps(temps: Iterable[Path]) -> None:
    """Delete leftover temporary files (after a failure)."""
    for tmp in temps:
        tmp.unlink(missing_ok=True)


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The folder's meta.json, or a UserError saying it is missing or unreadable."""
    path = Path(folder) / META_NAME
    if not path.is_file():
        raise UserError(f"'{path}' is missing; the data folder is incomplete, prepare it again")
    meta = read_json(path, "a data folder's meta.json", "prepare the data folder again")
    if not isinstance(meta, dict) or "tokenizer" not in meta:
        raise UserError(f"'{path}' has no 'tokenizer' entry; prepare the data folder again")
    for key in ("vocab_size", "eot_id"):  # read as integers by every consumer (ids are checked against them)
        if key in meta and (not isinstance(meta[key], int) or isinstance(meta[key], bool) or meta[key] < 0):
            raise UserError(f"'{path}' has {key}={meta[key]!r}, not a token count; prepare the data folder again")
    if "vocab_size" not in meta:
        raise UserError(f"'{path}' has no 'vocab_size' entry; prepare the data folder again")
    return meta


def is_complete(folder: str | Path) -> bool:
    """Whether meta.json and every split file exist."""
    folder = Path(folder)
    return (folder / META_NAME).is_file() and all(split_file(folder, s).is_file() for s in SPLITS)


def make_meta(
    tokenizer: dict[str, Any], tokens: dict[str, int], documents: dict[str, int], source: dict[str, Any],
    max_token_id: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The meta.json content: tokenizer fields, counts, the largest id per split, and source."""
    extra = {"max_token_id": max_token_id} if max_token_id is not None else {}
    return extra | {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer["name"],
        "vocab_size": tokenizer["vocab_size"],
        "eot_id": tokenizer["eot_id"],
        "tokenizer_info": tokenizer,
        "dtype": DTYPE_NAME,
        "tokens": tokens,
        "documents": documents,
        "source": source,
    }
