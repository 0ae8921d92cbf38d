"""Hugging Face tokenizer files for torchnlq's tokenizers, made offline, and the way back.

:func:`write_hf_tokenizer_files` writes what ``AutoTokenizer.from_pretrained`` reads for a GPT-2-style
byte-level BPE, derived from tiktoken ranks, never from transformers (merges are recovered by rank).
The byte tokenizer gets the same files with ids = byte values and no merges.

A model trained with any Hugging Face ``tokenizer.json`` (tokenizer ``hf``) gets that very file,
byte for byte, and a tokenizer_config.json naming its end-of-text (:func:`find_tokenizer_json`).

A checkpoint carries the ranks themselves (:data:`TOKENIZER_RANKS_FILE`) or the tokenizer.json, an
export its vocab.json or tokenizer.json; :func:`tokenizer_from_folder` rebuilds the tokenizer from
any of them, and reads a Hugging Face model folder's tokenizer.json too. Every file is read as text
or JSON, never unpickled.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from torchnlq.data.tokenizer import (
    ENDOFTEXT,
    GPT2_EOT_ID,
    GPT2_PATTERN,
    GPT2_TIKTOKEN_SHA256,
    TIKTOKEN_FILE_ENV,
    TOKENIZER_JSON,
    ByteTokenizer,
    GPT2Tokenizer,
    HFTokenizer,
    Tokenizer,
    read_tokenizer_json,
)
from torchnlq.errors import UserError
from torchnlq.files import MAX_DOCUMENT_BYTES, read_json

#: The GPT-2 ranks a checkpoint carries (tiktoken's ``base64 rank`` text).
TOKENIZER_RANKS_FILE = "tokenizer.tiktoken"
VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
FAST_TOKENIZER_FILE = TOKENIZER_JSON
# tiktoken caches a download under sha1(its URL) in its cache folder; r50k_base holds the GPT-2 ranks.
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
_FIX = f"set {TIKTOKEN_FILE_ENV} to the model's .tiktoken ranks file (GPT-2's: e.g. ../shared/data/gpt2.tiktoken)"


@cache
def byte_to_char() -> dict[int, str]:
    """GPT-2's byte -> printable character table: printable Latin-1 stands for itself, the rest from U+0100 on."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    others = (b for b in range(256) if b not in table)
    table.update({b: chr(0x100 + i) for i, b in enumerate(others)})
    return table


@cache
def char_to_byte() -> dict[str, int]:
    """The inverse of :func:`byte_to_char`."""
    return {c: b for b, c in byte_to_char().items()}


def token_string(token: bytes) -> str:
    """A token's vocab.json key: its bytes through the byte-level alphabet."""
    table = byte_to_char()
    return "".join(table[b] for b in token)


#: Bounds on a BPE someone hands over, so that a crafted one is refused in seconds instead of parsed for hours:
#: tokens (GPT-2 has 50,257, Llama 3 128,256), bytes of one token (GPT-2's longest: 128) and the merge
#: recovery's work, the sum over tokens of their length squared (GPT-2: 2.5 million, 0.4 s).
MAX_BPE_TOKENS = 2**20
MAX_TOKEN_BYTES = 512
MAX_MERGE_WORK = 50_000_000


def check_bpe_bounds(ranks: Mapping[bytes, int], where: str | Path) -> None:
    """UserError for a vocabulary beyond :data:`MAX_BPE_TOKENS`, :data:`MAX_TOKEN_BYTES` or :data:`MAX_MERGE_WORK`."""
    longest = max(map(len, ranks), default=0)
    work = sum(len(t) ** 2 for t in ranks)
    if len(ranks) > MAX_BPE_TOKENS or longest > MAX_TOKEN_BYTES or work > MAX_MERGE_WORK:
        raise UserError(
            f"'{where}' is not a tokenizer torchnlq reads: {len(ranks):,} tokens, the longest {longest:,} bytes "
            f"(at most {MAX_BPE_TOKENS:,} tokens of {MAX_TOKEN_BYTES} bytes, {MAX_MERGE_WORK:,} in sum of squared "
            f"lengths); {_FIX}"
        )


def parse_ranks(text: bytes, where: str | Path) -> dict[bytes, int]:
    """tiktoken ``base64 rank`` lines -> {token bytes: rank}; anything else is a UserError naming ``where``."""
    ranks: dict[bytes, int] = {}
    if len(text) > MAX_DOCUMENT_BYTES:
        raise UserError(f"'{where}' is {len(text):,} bytes, more than a tokenizer's ranks can be; {_FIX}")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            b64, rank_text = line.split()
            token, rank = base64.b64decode(b64, validate=True), int(rank_text)
        except (ValueError, binascii.Error):
            raise UserError(f"'{where}' is corrupt (line {n} is not 'base64 rank'); {_FIX}") from None
        if not token or rank < 0 or token in ranks:
            raise UserError(f"'{where}' is corrupt (line {n}: an empty, negative or repeated token); {_FIX}")
        ranks[token] = rank
    if len(set(ranks.values())) != len(ranks):
        raise UserError(f"'{where}' is corrupt (two tokens share a rank); {_FIX}")
    check_bpe_bounds(ranks, where)
    return ranks


def ranks_text(ranks: Mapping[bytes, int]) -> bytes:
    """The ``.tiktoken`` text of ``ranks``, in rank order (the layout of tiktoken's own files)."""
    return b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))


def _bpe_parts(token: bytes, below: int, ranks: Mapping[bytes, int]) -> list[bytes]:
    """Byte-pair encode ``token`` using only the ranks below ``below`` (tiktoken's merge rule)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, best_rank = -1, below
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], below)
            if rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def recover_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merges of a byte-level BPE, in rank order, from its ranks alone.

    A multi-byte token is the merge of the two parts its own bytes reach under the lower ranks
    (one that does not come out as two parts is never produced, so gets no merge).
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            parts = _bpe_parts(token, rank, ranks)
            if len(parts) == 2:
                merges.append((parts[0], parts[1]))
    return merges


def _check_byte_level(ranks: Mapping[bytes, int], where: str | Path) -> None:
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise UserError(
            f"'{where}' lacks the single byte {missing[0]:#04x}: not a byte-level BPE (every byte must be a token); "
            f"{_FIX}"
        )
    if GPT2_EOT_ID in ranks.values():
        raise UserError(f"'{where}' gives id {GPT2_EOT_ID} to a token; GPT-2 keeps it for {ENDOFTEXT}; {_FIX}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_sha256(tokenizer_description: Mapping[str, Any]) -> str:
    """The sha256 the model's ranks file must have: the recorded one, else GPT-2's (r50k_base)."""
    return tokenizer_description.get("tiktoken_sha256") or GPT2_TIKTOKEN_SHA256


def _read_checked(path: Path, expected: str, what: str) -> bytes:
    """A ranks file whose sha256 must be ``expected``; ``what`` says where its name came from."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"{what} '{path}' is unreadable ({e.strerror or e}); {_FIX}") from None
    digest = _sha256(data)
    if digest != expected:
        raise UserError(
            f"{what} '{path}' has sha256 {digest[:16]}..., not the model's ranks {expected[:16]}...; {_FIX}"
        )
    return data


def _tiktoken_cache_file() -> Path | None:
    """Where tiktoken keeps a downloaded r50k_base (None when its cache is turned off)."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR")
    if folder is None:
        folder = os.environ.get("DATA_GYM_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not folder:  # an empty TIKTOKEN_CACHE_DIR turns tiktoken's cache off
        return None
    return Path(folder, hashlib.sha1(R50K_URL.encode()).hexdigest())


def _carried_file(folder: Path) -> Path:
    """Which file of ``folder`` :func:`carried_ranks` read: the checkpoint's ranks file, else vocab.json."""
    ranks = folder / TOKENIZER_RANKS_FILE
    return ranks if ranks.is_file() else folder / VOCAB_FILE


def carried_ranks(folder: str | Path, tokenizer_description: Mapping[str, Any]) -> bytes | None:
    """The GPT-2 ranks text a checkpoint (checked against the recorded sha256) or export folder carries, or None."""
    folder = Path(folder)
    path = folder / TOKENIZER_RANKS_FILE
    if path.is_file():
        expected = expected_sha256(tokenizer_description)
        data = path.read_bytes()
        if _sha256(data) != expected:
            raise UserError(
                f"'{path}' is corrupt (sha256 {_sha256(data)[:16]}..., the model recorded {expected[:16]}...); "
                f"pass the model's .tiktoken file with --tiktoken-file (generate.py), or delete it and {_FIX}"
            )
        return data
    if (folder / VOCAB_FILE).is_file():
        return ranks_text(ranks_from_vocab(folder / VOCAB_FILE, tokenizer_description))
    return None


def find_gpt2_ranks(
    tokenizer_description: Mapping[str, Any], source: str | Path | None = None, tiktoken_file: str | None = None
) -> bytes:
    """The ``.tiktoken`` text of a gpt2 model's ranks, found offline; UserError saying how to fix it otherwise.

    In order: ``tiktoken_file``, the ``source`` folder, $TORCHNLQ_TIKTOKEN_FILE, tiktoken's cache;
    a file named by the user or the environment must have the recorded sha256.
    """
    return _locate_gpt2_ranks(tokenizer_description, source, tiktoken_file)[0]


def _locate_gpt2_ranks(
    tokenizer_description: Mapping[str, Any], source: str | Path | None, tiktoken_file: str | None
) -> tuple[bytes, Path]:
    """:func:`find_gpt2_ranks`, and the file the ranks were read from (for error messages)."""
    expected = expected_sha256(tokenizer_description)
    if tiktoken_file:
        path = Path(tiktoken_file).expanduser()
        return _read_checked(path, expected, "tiktoken file"), path
    if source is not None:
        found = carried_ranks(source, tokenizer_description)
        if found is not None:
            return found, _carried_file(Path(source))
    env = os.environ.get(TIKTOKEN_FILE_ENV)
    if env:
        path = Path(env).expanduser()
        return _read_checked(path, expected, TIKTOKEN_FILE_ENV), path
    cached = _tiktoken_cache_file()
    if cached is not None and cached.is_file() and expected == GPT2_TIKTOKEN_SHA256:
        data = cached.read_bytes()
        if _sha256(data) == expected:  # a damaged cache entry is tiktoken's to replace, not an error here
            return data, cached
    where = f"'{source}' carries none and they" if source is not None else "they"
    which = "" if expected == GPT2_TIKTOKEN_SHA256 else f" (a .tiktoken file of sha256 {expected[:16]}...)"
    raise UserError(f"the gpt2 tokenizer needs its BPE ranks{which}: {where} were not found offline; {_FIX}")


def _byte_vocab() -> tuple[dict[str, int], list[tuple[str, str]], int]:
    vocab = {c: b for b, c in sorted(byte_to_char().items())}
    return vocab, [], ByteTokenizer.eot_id


def _bpe_vocab(ranks: Mapping[bytes, int], where: str | Path) -> tuple[dict[str, int], list[tuple[str, str]], int]:
    _check_byte_level(ranks, where)
    vocab = {token_string(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])}
    merges = [(token_string(a), token_string(b)) for a, b in recover_merges(ranks)]
    return vocab, merges, GPT2_EOT_ID


def _special_token(eot: int) -> dict[str, Any]:
    # normalized/lstrip/rstrip as GPT-2's own files have them; "special" keeps it out of decode(skip_special_tokens).
    return {"id": eot, "content": ENDOFTEXT, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": True, "special": True}


def _fast_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]], eot: int) -> dict[str, Any]:
    """tokenizer.json as the tokenizers library serialises a GPT-2 byte-level BPE."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_special_token(eot)],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        # GPT-2's post-processor only trims offsets: no BOS/EOS is added to an encoding.
        "post_processor": {**byte_level, "add_prefix_space": True, "trim_offsets": False},
        "decoder": {**byte_level, "add_prefix_space": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {**vocab, ENDOFTEXT: eot},
            "merges": [list(m) for m in merges],
        },
    }


def _tokenizer_config(eot: int, model_max_length: int) -> dict[str, Any]:
    special = {k: v for k, v in _special_token(eot).items() if k != "id"}
    return {
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": int(model_max_length),
        "add_prefix_space": False,
        "add_bos_token": False,
        # Off, so that decode gives back exactly the text (the cleanup rewrites " n't" and " ,").
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "bos_token": ENDOFTEXT,
        "eos_token": ENDOFTEXT,
        "unk_token": ENDOFTEXT,
        "added_tokens_decoder": {str(eot): special},
    }


def _write_json(path: Path, obj: Any, compact: bool = False) -> None:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")) if compact else json.dumps(
        obj, ensure_ascii=False, indent=2)
    path.write_text(text + "\n", encoding="utf-8")


def find_tokenizer_json(
    tokenizer_description: Mapping[str, Any], source: str | Path | None = None, tokenizer_file: str | Path | None = None
) -> bytes:
    """The tokenizer.json an ``hf`` model was trained with: ``tokenizer_file``, else the one ``source`` carries.

    Either must have the sha256 the model recorded (a file edited since gives other ids under the same
    name); none found is a UserError saying which file to put where.
    """
    recorded = tokenizer_description.get("tokenizer_sha256")
    candidates = [(Path(tokenizer_file).expanduser(), "data.tokenizer_file")] if tokenizer_file else []
    if source is not None:
        candidates.append((Path(source) / TOKENIZER_JSON, "the tokenizer file"))
    mismatch = None
    for path, what in candidates:
        if not path.is_file():
            continue
        data = read_tokenizer_json(path, what)
        digest = _sha256(data)
        if recorded is None or digest == recorded:
            return data
        mismatch = f"'{path}' has sha256 {digest[:16]}..., not the model's {str(recorded)[:16]}... (it changed)"
    want = f"the tokenizer.json of sha256 {str(recorded)[:16]}..." if recorded else "a tokenizer.json"
    found = mismatch or (f"'{source}' carries none" if source is not None else "none was given")
    into = f"'{source}'" if source is not None else "the model folder"
    raise UserError(f"the model was trained with {want}, but {found}; copy that file into {into} as {TOKENIZER_JSON}")


def _write_hf_json_tokenizer(tokenizer_description: Mapping[str, Any], folder: Path, model_max_length: int,
                             source: Path | None) -> None:
    """An ``hf`` model's tokenizer: its tokenizer.json as it was, and the configs naming its end-of-text."""
    data = find_tokenizer_json(tokenizer_description, source)  # or the line saying which file is missing or changed
    # Rebuilt from the file and checked against the record: the end-of-text written below is the model's.
    tokenizer = _checked_hf(data, Path(source or ".") / TOKENIZER_JSON, tokenizer_description, None)
    (folder / TOKENIZER_JSON).write_bytes(data)
    _write_json(folder / HF_TOKENIZER_CONFIG_FILE, {
        # transformers' class for "the tokenizer is its tokenizer.json": AutoTokenizer gives the same ids.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(model_max_length),
        "eos_token": tokenizer.eot_token,
        # Off, so that decode gives back the text the file's decoder makes.
        "clean_up_tokenization_spaces": False,
    })
    _write_json(folder / SPECIAL_TOKENS_FILE, {"eos_token": tokenizer.eot_token})


def write_hf_tokenizer_files(
    tokenizer_description: dict, folder: Path, model_max_length: int, source: Path | None = None
) -> None:
    """Write the Hugging Face tokenizer files of the described tokenizer into ``folder``.

    gpt2 and byte: GPT-2-style files made from the ranks; hf: the model's tokenizer.json, copied from
    ``source`` (the checkpoint or export the model came from) after checking its recorded sha256.
    """
    name = tokenizer_description.get("name")
    if not name:
        return  # a model made in Python without a tokenizer: nothing to describe
    folder = Path(folder)
    if name == "hf":
        _write_hf_json_tokenizer(tokenizer_description, folder, model_max_length,
                                 Path(source) if source is not None else None)
        return
    if name == "byte":
        vocab, merges, eot = _byte_vocab()
    elif name == "gpt2":
        text, where = _locate_gpt2_ranks(tokenizer_description, source, None)
        vocab, merges, eot = _bpe_vocab(parse_ranks(text, where), where)
    else:
        raise UserError(f"unknown tokenizer '{name}' in the model's metadata; torchnlq knows gpt2, byte and hf")
    _write_json(folder / VOCAB_FILE, {**vocab, ENDOFTEXT: eot}, compact=True)
    (folder / MERGES_FILE).write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8"
    )
    _write_json(folder / HF_TOKENIZER_CONFIG_FILE, _tokenizer_config(eot, model_max_length))
    _write_json(folder / SPECIAL_TOKENS_FILE, {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT})
    _write_json(folder / FAST_TOKENIZER_FILE, _fast_tokenizer(vocab, merges, eot), compact=True)


def _read_vocab(path: Path) -> dict[str, int]:
    vocab = read_json(path, "a vocab.json", "export the model again")  # JSON, never unpickled
    if not isinstance(vocab, dict) or not all(type(v) is int and v >= 0 for v in vocab.values()):
        raise UserError(f"'{path}' is corrupt (not a JSON object of token ids); export the model again")
    return vocab


def ranks_from_vocab(path: Path, tokenizer_description: Mapping[str, Any] | None = None) -> dict[bytes, int]:
    """A GPT-2-style vocab.json -> tiktoken ranks (end-of-text left out: tiktoken adds it as special)."""
    vocab = _read_vocab(path)
    table = char_to_byte()
    ranks: dict[bytes, int] = {}
    for text, rank in vocab.items():
        if text == ENDOFTEXT:
            if rank != GPT2_EOT_ID:
                raise UserError(f"'{path}' gives {ENDOFTEXT} id {rank}, not {GPT2_EOT_ID}; export the model again")
            continue
        if not text or any(c not in table for c in text):
            raise UserError(f"'{path}' is corrupt (token {text[:20]!r} is not byte-level BPE); export the model again")
        ranks[bytes(table[c] for c in text)] = rank
    if len(set(ranks.values())) != len(ranks):
        raise UserError(f"'{path}' is corrupt (two tokens share an id); export the model again")
    check_bpe_bounds(ranks, path)
    _check_byte_level(ranks, path)
    recorded = (tokenizer_description or {}).get("vocab_size")
    size = max(max(ranks.values()), GPT2_EOT_ID) + 1
    if isinstance(recorded, int) and recorded != size:
        raise UserError(
            f"'{path}' holds {size} ids but the model records vocab_size {recorded}; export the model again"
        )
    return ranks


class CarriedGPT2Tokenizer(GPT2Tokenizer):
    """GPT-2 BPE from ranks a model folder carries (no ranks file of the user's needed)."""

    def __init__(self, text: bytes, where: str | Path) -> None:
        # Not GPT2Tokenizer.__init__: there is no file of the user's to open or check.
        import tiktoken

        self.path = str(where)
        self.expected_hash = None
        self.file_sha256 = _sha256(text)
        self._text = text
        ranks = parse_ranks(text, where)
        _check_byte_level(ranks, where)
        self._enc = tiktoken.Encoding(
            name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: GPT2_EOT_ID}
        )
        self.vocab_size = self._enc.n_vocab

    # The ranks travel with a pickled copy: the folder may be gone when it is unpickled.
    def __getstate__(self) -> dict[str, Any]:
        return {"text": self._text, "where": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["text"], state["where"])  # type: ignore[misc]


def _is_byte_vocab(vocab: dict[str, int]) -> bool:
    return vocab == {**{c: b for b, c in byte_to_char().items()}, ENDOFTEXT: ByteTokenizer.eot_id}


def _folder_eos_token(folder: Path) -> str | None:
    """The eos_token of a Hugging Face folder's tokenizer_config.json (a string or {"content": ...}), or None."""
    path = folder / HF_TOKENIZER_CONFIG_FILE
    if not path.is_file():
        return None
    config = read_json(path, "a tokenizer_config.json", "repair or remove it")
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def _checked_hf(data: bytes, path: Path, desc: Mapping[str, Any], eot_token: str | None) -> HFTokenizer:
    """The tokenizer of a tokenizer.json's ``data`` with the end-of-text the model records (else the folder's own
    eos_token, else the usual names), whose vocabulary size and eot id must be those ``desc`` records."""
    eot = eot_token or desc.get("eot_token")
    if eot is None:  # a Hugging Face model folder: its own end-of-sequence, if the vocabulary holds it
        eos = _folder_eos_token(path.parent)
        try:
            tokenizer = HFTokenizer(data, path, eos)
        except UserError:
            if eos is None:
                raise
            tokenizer = HFTokenizer(data, path)  # an eos_token outside the vocabulary: the usual names instead
    else:
        tokenizer = HFTokenizer(data, path, eot)
    for key in ("vocab_size", "eot_id"):
        if isinstance(desc.get(key), int) and desc[key] != getattr(tokenizer, key):
            raise UserError(f"'{path}' gives {key} {getattr(tokenizer, key)} but the model records {desc[key]}; "
                            f"put the model's own tokenizer.json back in {path.parent}")
    return tokenizer


def _hf_from_folder(folder: Path, desc: Mapping[str, Any], eot_token: str | None) -> HFTokenizer | None:
    """The tokenizer.json tokenizer of ``folder`` (None without one), checked against the model's record."""
    path = folder / TOKENIZER_JSON
    if not path.is_file():
        return None
    data = read_tokenizer_json(path, "the tokenizer file")
    recorded = desc.get("tokenizer_sha256")
    if isinstance(recorded, str) and _sha256(data) != recorded:
        raise UserError(
            f"'{path}' has sha256 {_sha256(data)[:16]}..., not the tokenizer.json the model was trained with "
            f"({recorded[:16]}...); put that file back in {folder}"
        )
    return _checked_hf(data, path, desc, eot_token)


def tokenizer_from_folder(
    folder: str | Path, tokenizer_description: Mapping[str, Any] | None = None, *, eot_token: str | None = None
) -> Tokenizer | None:
    """The torchnlq tokenizer a checkpoint, export or Hugging Face model folder carries (same ids), or None.

    Without a description the folder's files decide: the carried GPT-2 ranks (tokenizer.tiktoken), a
    GPT-2-style vocab.json (+ merges.txt: gpt2, or the byte tokenizer's), else a tokenizer.json (hf,
    e.g. a Llama folder's), whose end-of-text is ``eot_token``, else its tokenizer_config.json's
    eos_token, else the first of :data:`~torchnlq.data.tokenizer.DEFAULT_EOT_TOKENS` it holds.
    """
    folder = Path(folder)
    desc = dict(tokenizer_description or {})
    name = desc.get("name")
    if name is None:
        if (folder / TOKENIZER_RANKS_FILE).is_file():
            name = "gpt2"
        elif (folder / VOCAB_FILE).is_file():
            name = "byte" if _is_byte_vocab(_read_vocab(folder / VOCAB_FILE)) else "gpt2"
        elif (folder / TOKENIZER_JSON).is_file():
            name = "hf"
    if name == "byte":
        return ByteTokenizer()
    if name == "hf":
        return _hf_from_folder(folder, desc, eot_token)
    if name != "gpt2":
        return None
    text = carried_ranks(folder, desc)
    if text is None:
        return None
    return CarriedGPT2Tokenizer(text, _carried_file(folder))
