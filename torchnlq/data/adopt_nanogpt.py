"""Adopt a nanoGPT data folder (``train.bin``, ``val.bin``: uint16 ids) as a torchnlq token folder: scan the ids,
write ``meta.json`` beside them, nothing else (``prepare_data.py --adopt``; docs/data.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from torchnlq.data import token_format as fmt
from torchnlq.data.prepare import text_table
from torchnlq.data.tokenizer import BASE_VOCAB_SIZE, GPT2_EOT_ID, ByteTokenizer
from torchnlq.errors import UserError
from torchnlq.paths import protected_folders

# nanoGPT's meta.pkl (character-level datasets): a pickle runs code when loaded, so it is never opened.
NANOGPT_META = "meta.pkl"
# Tokens read per step of the scan (32 MiB): the memmap pages through the file without holding it.
SCAN_TOKENS = 1 << 24


def adoption_tokenizer(name: str) -> dict[str, Any]:
    """The tokenizer entry of an adopted folder's meta.json, without loading the GPT-2 ranks (works offline)."""
    if name == "byte":
        return ByteTokenizer().describe()
    if name == "gpt2":
        return {"name": "gpt2", "vocab_size": BASE_VOCAB_SIZE["gpt2"], "eot_id": GPT2_EOT_ID}
    if name == "hf":  # its vocabulary is its file's; nanoGPT folders hold GPT-2 (or byte) uint16 ids
        raise UserError("--adopt takes nanoGPT folders of gpt2 or byte ids; a tokenizer.json's data is prepared from "
                        "its text: prepare_data.py --out FOLDER --tokenizer hf --tokenizer-file TOKENIZER.json")
    raise UserError(f"unknown tokenizer '{name}'; choose one of: gpt2, byte")


def scan_tokens(path: Path, eot_id: int) -> tuple[int, int, int]:
    """(tokens, largest id, number of eot ids) of a uint16 token file, all of it (training trusts the largest id)."""
    n = path.stat().st_size // fmt.DTYPE.itemsize
    tokens = np.memmap(path, dtype=fmt.DTYPE, mode="r", shape=(n,))
    largest, eots = -1, 0
    # disable=None: a bar only on a terminal, so a refusal stays one line in logs and pipes.
    with tqdm(total=n, unit="tok", unit_scale=True, desc=f"checking {path.name}", disable=None, leave=False) as bar:
        for start in range(0, n, SCAN_TOKENS):
            chunk = tokens[start : start + SCAN_TOKENS]
            largest = max(largest, int(chunk.max()))
            eots += int(np.count_nonzero(chunk == eot_id))
            bar.update(len(chunk))
    return n, largest, eots


def adopt_folder(folder: str | Path, tokenizer: str = "gpt2",
                 overwrite: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Make a nanoGPT data folder (``train.bin``, ``val.bin``: uint16 ids) a torchnlq token folder.

    Writes only ``meta.json`` beside them. Returns (meta, notes): the notes say what could not be checked.
    """
    path = Path(folder).expanduser()
    given = f"--adopt '{folder}'"
    if not path.exists():
        raise UserError(f"{given} does not exist; point it at a nanoGPT data folder holding train.bin and val.bin")
    if not path.is_dir():
        raise UserError(f"{given} is not a folder; point it at the folder holding train.bin and val.bin")
    if path.resolve() in protected_folders():  # the one rule of every writer (torchnlq/paths.py)
        raise UserError(f"{given} is the current directory, the home folder or a parent of one, which torchnlq never "
                        "writes into; run the command from outside it "
                        f"(e.g. --adopt ../{path.resolve().name or 'DATA'})")
    files = {s: fmt.split_file(path, s) for s in fmt.SPLITS}
    missing = [f.name for f in files.values() if not f.is_file()]
    if missing:
        raise UserError(f"{given} has no {' and no '.join(missing)}; a nanoGPT data folder holds train.bin and val.bin "
                        "(uint16 token ids)")
    meta_path = path / fmt.META_NAME
    if meta_path.exists() or meta_path.is_symlink():
        if not overwrite:
            raise UserError(f"{given} already has a {fmt.META_NAME} (prepared or adopted before): "
                            "train on it as it is, "
                            "or pass --overwrite to replace that meta.json")
        if meta_path.is_dir():
            raise UserError(f"{given} holds a folder named {fmt.META_NAME}; move it away first")
    info = adoption_tokenizer(tokenizer)
    vocab, eot = info["vocab_size"], info["eot_id"]
    for f in files.values():  # the cheap checks of both files before the scans
        size = f.stat().st_size
        if size == 0:
            raise UserError(f"'{f}' is empty (0 tokens); both splits need tokens: re-create the folder, or tokenize "
                            "its text with --out")
        if size % fmt.DTYPE.itemsize:
            raise UserError(f"'{f}' has an odd size ({size:,} bytes), not uint16 tokens; it is damaged or not a "
                            "nanoGPT token file")
    tokens, documents, largest = {}, {}, {}
    for split, f in files.items():
        tokens[split], largest[split], documents[split] = scan_tokens(f, eot)
        if largest[split] >= vocab:
            raise UserError(
                f"'{f}' holds token id {largest[split]}, but the {tokenizer} tokenizer has only {vocab} ids "
                f"(0..{vocab - 1}): these are not {tokenizer} tokens; pass the --tokenizer the folder was made with"
            )
    notes = []
    source: dict[str, Any] = {"kind": "nanogpt", "folder": str(path.resolve()),
                              "documents": "eot ids counted in each split"}
    if (path / NANOGPT_META).exists():
        source["ignored"] = [NANOGPT_META]
        notes.append(f"{NANOGPT_META} ignored: never unpickled (loading a pickle runs code). nanoGPT writes one for "
                     f"its character-level data, whose ids are its own characters, not {tokenizer} ids: such a "
                     "folder must be prepared again from its text")
    empty = [s for s, d in documents.items() if not d]
    if empty:
        notes.append(f"no eot id ({eot}) in {', '.join(f'{s}.bin' for s in empty)}: documents are not separated "
                     f"there, or the ids are not {tokenizer} ids")
    meta = fmt.make_meta(info, tokens, documents, source, max_token_id=largest)
    try:
        fmt.commit(path, {}, meta)
    except OSError as e:  # commit removed its temporary meta.json
        raise UserError(f"could not write {meta_path} ({type(e).__name__}: {e}); "
                        "adopt a folder you can write to") from e
    return meta, notes


def format_adoption(meta: dict[str, Any], folder: str | Path, notes: Sequence[str] = ()) -> str:
    """What :func:`adopt_folder` found, as printed by prepare_data.py --adopt: tokens and documents per split."""
    splits = list(meta["tokens"])
    rows = [[s, f"{meta['tokens'][s]:,}", f"{meta['documents'][s]:,}", str(meta["max_token_id"][s])] for s in splits]
    rows.append(["total", f"{sum(meta['tokens'].values()):,}", f"{sum(meta['documents'].values()):,}",
                 str(max(meta["max_token_id"].values()))])
    return "\n".join([
        (f"adopted {folder} (tokenizer {meta['tokenizer']}): wrote {fmt.META_NAME} only; train with "
         f"--data.path {folder} --data.tokenizer {meta['tokenizer']}"),
        *text_table(["split", "tokens", "documents (eot ids)", "largest id"], rows),
        *(f"note: {n}" for n in notes),
    ])
