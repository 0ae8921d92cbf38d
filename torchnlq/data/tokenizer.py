"""Tokenizers: tiktoken GPT-2 (with offline file support), a byte-level one, and any Hugging Face
``tokenizer.json`` (through the ``tokenizers`` library: :class:`HFTokenizer`, name ``hf``).

``encode`` is always the *ordinary* encoding: ``"<|endoftext|>"`` in a document is plain
text, never the eot id (the paper uses ``encode_ordinary`` and appends the eot id itself).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from torchnlq.errors import UserError
from torchnlq.files import MAX_DOCUMENT_BYTES

# Base (unpadded) vocabulary sizes: a model is sized without loading the tokenizer's files.
BASE_VOCAB_SIZE = {"gpt2": 50257, "byte": 257}
#: Every tokenizer name; ``hf`` (a tokenizer.json) has no fixed size: it is read from its file.
TOKENIZER_NAMES = ("gpt2", "byte", "hf")

# sha256 of tiktoken's r50k_base ranks file (the same ids as tiktoken.get_encoding("gpt2")).
GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# The GPT-2 pre-tokenisation regex (tiktoken's faster equivalent of the original).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
ENDOFTEXT = "<|endoftext|>"
GPT2_EOT_ID = 50256
TIKTOKEN_FILE_ENV = "TORCHNLQ_TIKTOKEN_FILE"
_OFFLINE_HINT = (
    "set data.tiktoken_file (--tiktoken-file) or the TORCHNLQ_TIKTOKEN_FILE environment variable "
    "to a gpt2.tiktoken file (e.g. ../shared/data/gpt2.tiktoken)"
)


class Tokenizer(ABC):
    """Text <-> token ids. ``vocab_size`` is the base (unpadded) size."""

    name: str
    vocab_size: int
    eot_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ordinary encoding: special-token text is treated as plain text."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Ids back to text; the eot id is rendered as its text (``<|endoftext|>`` for gpt2 and byte)."""

    def describe(self) -> dict[str, Any]:
        """Name, vocabulary size and eot id (kept in meta.json and checkpoints)."""
        return {"name": self.name, "vocab_size": self.vocab_size, "eot_id": self.eot_id}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eot_id={self.eot_id})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, end-of-text = 256 (vocabulary 257)."""

    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text``."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes back to text (invalid UTF-8 is replaced, eot shown as text)."""
        parts: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if i == self.eot_id:
                parts.append(buf.decode("utf-8", errors="replace") + ENDOFTEXT)
                buf.clear()
            elif 0 <= i < 256:
                buf.append(i)
            else:
                raise ValueError(f"byte tokenizer: id {i} outside 0..256")
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)


#: Bounds on a BPE someone hands over, so that a crafted one is refused in seconds instead of parsed for hours:
#: tokens (GPT-2 has 50,257, Llama 3 128,256), bytes of one token (GPT-2's longest: 128) and the merge
#: recovery's work, the sum over tokens of their length squared (GPT-2: 2.5 million, 0.4 s).
MAX_BPE_TOKENS = 2**20
MAX_TOKEN_BYTES = 512
MAX_MERGE_WORK = 50_000_000
#: Token ids (BPE ranks, a vocab.json's values, a tokenizer.json's ids) are refused from this one up: the model's
#: embedding has a row per id (Gemma's 262,144 is the largest common vocabulary), tiktoken takes only 32-bit ranks,
#: and a crafted file could otherwise give one token id 4e9 (or 2^70) and ask for a model of that size.
MAX_TOKEN_ID = 2**24


def check_bpe_bounds(ranks: Mapping[bytes, int], where: str | Path, fix: str = _OFFLINE_HINT) -> dict[bytes, int]:
    """``ranks`` if they are a byte-level BPE (every byte a token, no token at GPT-2's end-of-text id, no id twice)
    within :data:`MAX_BPE_TOKENS`, :data:`MAX_TOKEN_BYTES` and :data:`MAX_MERGE_WORK`; else a UserError ending
    in ``fix``."""
    if len(set(ranks.values())) != len(ranks):
        raise UserError(f"'{where}' is corrupt (two tokens share an id); {fix}")
    largest = max(ranks.values(), default=0)
    if largest >= MAX_TOKEN_ID or min(ranks.values(), default=0) < 0:
        wrong = largest if largest >= MAX_TOKEN_ID else min(ranks.values())
        raise UserError(f"'{where}' gives a token the id {wrong:,}; torchnlq reads token ids 0 to {MAX_TOKEN_ID - 1:,} "
                        f"(a model has an embedding row per id); {fix}")
    longest = max(map(len, ranks), default=0)
    if len(ranks) > MAX_BPE_TOKENS or longest > MAX_TOKEN_BYTES or sum(len(t) ** 2 for t in ranks) > MAX_MERGE_WORK:
        raise UserError(
            f"'{where}' is not a tokenizer torchnlq reads: {len(ranks):,} tokens, the longest {longest:,} bytes "
            f"(at most {MAX_BPE_TOKENS:,} tokens of {MAX_TOKEN_BYTES} bytes, {MAX_MERGE_WORK:,} in sum of squared "
            f"lengths); {fix}"
        )
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise UserError(f"'{where}' lacks the single byte {missing[0]:#04x}: not a byte-level BPE (every byte must "
                        f"be a token); {fix}")
    if GPT2_EOT_ID in ranks.values():
        raise UserError(f"'{where}' gives id {GPT2_EOT_ID} to a token; GPT-2 keeps it for {ENDOFTEXT}; {fix}")
    return dict(ranks)


def parse_ranks(text: bytes, where: str | Path, fix: str = _OFFLINE_HINT) -> dict[bytes, int]:
    """tiktoken ``base64 rank`` lines -> {token bytes: rank}, bounded (:func:`check_bpe_bounds`); anything
    else is a UserError naming ``where`` and ending in ``fix``."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise UserError(f"'{where}' is {len(text):,} bytes, more than a tokenizer's ranks can be; {fix}")
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            b64, rank_text = line.split()
            token, rank = base64.b64decode(b64, validate=True), int(rank_text)
        except (ValueError, binascii.Error):
            raise UserError(f"'{where}' is corrupt (line {n} is not 'base64 rank'); {fix}") from None
        if not token or rank < 0 or token in ranks:
            raise UserError(f"'{where}' is corrupt (line {n}: an empty, negative or repeated token); {fix}")
        ranks[token] = rank
    return check_bpe_bounds(ranks, where, fix)


def _load_ranks(path: str, expected_hash: str | None) -> tuple[dict[bytes, int], str]:
    """Read a ``.tiktoken`` ranks file; returns (ranks, sha256 of the file).

    Parsed from the very bytes hashed: tiktoken's own loader reads the file again and copies it into a
    cache keyed by the path, which would serve a stale copy after the file changed.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        inside = sorted(p.glob("*.tiktoken"))[:1]
        hint = f"name the file itself, e.g. '{inside[0]}'" if inside else _OFFLINE_HINT
        raise UserError(f"tiktoken file '{path}' is a folder; {hint}")
    if not p.is_file():
        raise UserError(f"tiktoken file '{path}' does not exist; {_OFFLINE_HINT}")
    if p.stat().st_size > MAX_DOCUMENT_BYTES:  # before reading it: parse_ranks would refuse it anyway
        raise UserError(f"tiktoken file '{path}' is {p.stat().st_size:,} bytes, more than a tokenizer's ranks can be; "
                        f"{_OFFLINE_HINT}")
    data = p.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if expected_hash is not None and digest != expected_hash:
        raise UserError(
            f"tiktoken file '{path}' has sha256 {digest[:16]}..., not the GPT-2 (r50k_base) ranks "
            f"{expected_hash[:16]}...; {_OFFLINE_HINT}"
        )
    return parse_ranks(data, path), digest


class GPT2Tokenizer(Tokenizer):
    """GPT-2 BPE through tiktoken, ids identical to ``tiktoken.get_encoding("gpt2")``.

    Ranks from ``tiktoken_file``, else TORCHNLQ_TIKTOKEN_FILE, else tiktoken's own loader.
    """

    name = "gpt2"
    eot_id = GPT2_EOT_ID

    def __init__(self, tiktoken_file: str | None = None, expected_hash: str | None = GPT2_TIKTOKEN_SHA256):
        import tiktoken

        self.path = tiktoken_file or os.environ.get(TIKTOKEN_FILE_ENV) or None
        self.expected_hash = expected_hash
        self.file_sha256: str | None = None
        if self.path is not None:
            ranks, self.file_sha256 = _load_ranks(self.path, expected_hash)
            try:
                self._enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                              special_tokens={ENDOFTEXT: GPT2_EOT_ID},
                                              explicit_n_vocab=BASE_VOCAB_SIZE["gpt2"] if expected_hash else None)
            except (ValueError, AssertionError) as e:
                raise UserError(f"tiktoken file '{self.path}' does not give the GPT-2 vocabulary ({e}); "
                                f"{_OFFLINE_HINT}") from e
        else:
            self._enc = self._load_from_tiktoken()
        self.vocab_size = self._enc.n_vocab

    @staticmethod
    def _load_from_tiktoken() -> Any:
        import tiktoken

        # "gpt2" needs vocab.bpe + encoder.json; "r50k_base" (identical ids)
        # needs one .tiktoken file, which is what people put in TIKTOKEN_CACHE_DIR.
        errors = []
        for encoding in ("gpt2", "r50k_base"):
            try:
                return tiktoken.get_encoding(encoding)
            except Exception as e:  # network errors come in many types
                errors.append(f"{encoding}: {type(e).__name__}")
        raise UserError(f"tokenizer gpt2 unavailable offline ({', '.join(errors)}); {_OFFLINE_HINT}")

    def encode(self, text: str) -> list[int]:
        """GPT-2 ids of ``text``; ``<|endoftext|>`` in the text stays plain text."""
        return self._enc.encode_ordinary(text)

    def decode(self, ids: Iterable[int]) -> str:
        """GPT-2 ids back to text (eot decodes to ``<|endoftext|>``)."""
        return self._enc.decode([int(i) for i in ids])

    def describe(self) -> dict[str, Any]:
        """Name, vocabulary size, eot id and the sha256 of the ranks file used (if any)."""
        return super().describe() | ({"tiktoken_sha256": self.file_sha256} if self.file_sha256 is not None else {})

    # Pickle by recipe, not by the rank table (datasets' map(num_proc) and cache fingerprint pickle
    # the tokenizer); the file's sha256 in the state makes changed contents change the fingerprint.
    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "expected_hash": self.expected_hash, "file_sha256": self.file_sha256}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["expected_hash"])  # type: ignore[misc]
        if state["file_sha256"] != self.file_sha256:
            raise RuntimeError(f"tiktoken file '{self.path}' changed while in use")


# ---------------------------------------------------------------------------- any tokenizer.json

#: The file a Hugging Face fast tokenizer is saved as (and what exports and checkpoints carry).
TOKENIZER_JSON = "tokenizer.json"
#: A tokenizer.json is refused above this size before it is parsed (Llama 3's is 9 MB, Gemma 3's about 33 MB):
#: parsing costs time and memory in proportion, and the file comes from anyone.
MAX_TOKENIZER_JSON_BYTES = 64 * 2**20
#: End-of-text when data.eot_token is unset: the first of these the vocabulary holds (GPT-2/NeoX/Qwen,
#: Llama 3, Llama 2/Mistral/T5, Gemma).
DEFAULT_EOT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
_TOKENIZER_JSON_FIX = "point data.tokenizer_file (prepare_data.py --tokenizer-file) at a Hugging Face tokenizer.json"


def read_tokenizer_json(path: str | Path, what: str = "tokenizer file") -> bytes:
    """The bytes of a tokenizer.json someone handed over: missing, a folder or above the size bound is one UserError."""
    p = Path(path).expanduser()
    if p.is_dir():
        inside = p / TOKENIZER_JSON
        hint = f"name the file itself: '{inside}'" if inside.is_file() else _TOKENIZER_JSON_FIX
        raise UserError(f"{what} '{path}' is a folder, not a tokenizer.json; {hint}")
    if not p.is_file():
        raise UserError(f"{what} '{path}' does not exist; {_TOKENIZER_JSON_FIX}")
    try:
        with p.open("rb") as f:
            data = f.read(MAX_TOKENIZER_JSON_BYTES + 1)  # never more than the bound, whatever the file claims
    except OSError as e:
        raise UserError(f"{what} '{path}' is unreadable ({e.strerror or e}); {_TOKENIZER_JSON_FIX}") from None
    if len(data) > MAX_TOKENIZER_JSON_BYTES:
        raise UserError(
            f"{what} '{path}' is larger than {MAX_TOKENIZER_JSON_BYTES // 2**20} MiB, more than a tokenizer.json "
            f"torchnlq reads; {_TOKENIZER_JSON_FIX}"
        )
    return data


def _parse_tokenizer_json(data: bytes, where: str) -> Any:
    """A ``tokenizers.Tokenizer`` from the file's bytes; anything the library refuses is one UserError line."""
    from tokenizers import Tokenizer as RustTokenizer

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"'{where}' is not a tokenizer.json (not UTF-8 text: {e.reason}); {_TOKENIZER_JSON_FIX}"
        ) from None
    try:
        # The library's own parser (serde, in Rust): JSON only, nesting bounded, nothing executed.
        return RustTokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for every parse error
        first = (str(e).strip().splitlines() or ["unreadable"])[0][:200]
        raise UserError(f"'{where}' is not a tokenizer.json the tokenizers library reads ({first}); "
                        f"{_TOKENIZER_JSON_FIX}") from None


def _choose_eot(vocab: Mapping[str, int], eot_token: str | None, where: str) -> tuple[str, int]:
    """(text, id) of end-of-text: ``eot_token`` when given, else the first of :data:`DEFAULT_EOT_TOKENS` present."""
    if eot_token is not None and eot_token not in vocab:
        raise UserError(
            f"end-of-text token {eot_token!r} is not in the vocabulary of '{where}'; set data.eot_token "
            "(prepare_data.py --eot-token) to a token of that tokenizer, e.g. the eos_token of its "
            "tokenizer_config.json"
        )
    eot_token = eot_token if eot_token is not None else next((t for t in DEFAULT_EOT_TOKENS if t in vocab), None)
    if eot_token is None:
        raise UserError(
            f"'{where}' has none of the end-of-text tokens {', '.join(DEFAULT_EOT_TOKENS)}; name its document "
            "separator with data.eot_token (prepare_data.py --eot-token), e.g. the eos_token of its "
            "tokenizer_config.json"
        )
    return eot_token, vocab[eot_token]


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` through the ``tokenizers`` library: ids identical to its own encode.

    Ordinary encoding (no template tokens, special-token text stays plain text), the end-of-text token and the
    vocabulary size are as docs/data.md, "Any tokenizer (tokenizer.json)", describes.
    """

    name = "hf"

    def __init__(self, data: bytes, where: str | Path, eot_token: str | None = None):
        self.where = str(where)
        self._data = data  # kept for pickling: the file may be gone or changed by then
        self.file_sha256 = hashlib.sha256(data).hexdigest()
        tok = _parse_tokenizer_json(data, self.where)
        tok.encode_special_tokens = True
        vocab = tok.get_vocab(with_added_tokens=True)
        if not vocab:
            raise UserError(f"'{where}' has an empty vocabulary; {_TOKENIZER_JSON_FIX}")
        largest = max(vocab.values())
        if largest >= MAX_TOKEN_ID:
            raise UserError(f"'{where}' gives a token id {largest:,}; torchnlq sizes models for ids below "
                            f"{MAX_TOKEN_ID:,}; {_TOKENIZER_JSON_FIX}")
        self._tok = tok
        self.vocab_size = max(tok.get_vocab_size(with_added_tokens=True), largest + 1)
        self.eot_token, self.eot_id = _choose_eot(vocab, eot_token, self.where)

    @classmethod
    def from_file(cls, path: str | Path, eot_token: str | None = None) -> HFTokenizer:
        """Read ``path`` (a tokenizer.json, bounded in size) and build the tokenizer."""
        return cls(read_tokenizer_json(path), path, eot_token)

    def encode(self, text: str) -> list[int]:
        """The file's ids of ``text``, without template tokens; special-token text stays plain text."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """Ids back to text through the file's decoder; special tokens (eot too) are rendered as their text."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def describe(self) -> dict[str, Any]:
        """Name, vocabulary size, eot id and text, and the sha256 of the tokenizer.json (a changed file is noticed)."""
        return super().describe() | {"eot_token": self.eot_token, "tokenizer_sha256": self.file_sha256}

    # Pickled with the file's bytes (datasets' map(num_proc) and cache fingerprint pickle the tokenizer):
    # the copy encodes with the very file this one read, whatever happened to the path since.
    def __getstate__(self) -> dict[str, Any]:
        return {"data": self._data, "where": self.where, "eot_token": self.eot_token}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["data"], state["where"], state["eot_token"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"HFTokenizer('{self.where}', vocab_size={self.vocab_size}, eot={self.eot_token!r})"


@functools.lru_cache(maxsize=2)  # a parsed 128k-token BPE holds ~100 MB: a process keeps at most two
def _cached_hf(given: str, resolved: str, size: int, mtime_ns: int, eot_token: str | None) -> HFTokenizer:
    # Keyed by the file's resolved path, size and mtime (a changed file is read again); ``given`` keeps the
    # path the user wrote in the tokenizer's messages and repr.
    return HFTokenizer.from_file(given, eot_token)


def load_hf_tokenizer(path: str | Path, eot_token: str | None = None) -> HFTokenizer:
    """:meth:`HFTokenizer.from_file`, parsed once per file version: config resolution, the preflight and the
    trainer all ask for the same file (Llama 3's takes a few hundred milliseconds to parse)."""
    p = Path(path).expanduser()
    if not p.is_file():
        return HFTokenizer.from_file(path, eot_token)  # the missing file's (or folder's) error line
    st = p.stat()
    return _cached_hf(str(path), str(p.resolve()), st.st_size, st.st_mtime_ns, eot_token)


def build_tokenizer(
    name: str, tiktoken_file: str | None = None, *, expected_hash: str | None = GPT2_TIKTOKEN_SHA256,
    tokenizer_file: str | None = None, eot_token: str | None = None,
) -> Tokenizer:
    """The tokenizer called ``name`` ("gpt2", "byte" or "hf"); ``expected_hash=None`` accepts any ranks file.

    ``tokenizer_file`` and ``eot_token`` are the tokenizer.json and end-of-text token of ``hf``.
    """
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer(tiktoken_file, expected_hash)
    if name == "hf":
        if not tokenizer_file:
            raise UserError(f'tokenizer "{name}" reads a Hugging Face tokenizer.json: set data.tokenizer_file '
                            "(prepare_data.py --tokenizer-file) to its path")
        return load_hf_tokenizer(tokenizer_file, eot_token)
    raise UserError(f"unknown tokenizer '{name}'; choose one of: {', '.join(TOKENIZER_NAMES)}")


def padded_vocab_size(
    tokenizer_name: str, multiple: int, tokenizer_file: str | None = None, eot_token: str | None = None
) -> int:
    """The embedding rows a model needs for ``tokenizer_name``: its base vocabulary rounded up to ``multiple``.

    ``hf`` reads its ``tokenizer_file`` (and checks ``eot_token`` is in it); gpt2 and byte read nothing.
    """
    base = BASE_VOCAB_SIZE.get(tokenizer_name) or build_tokenizer(
        tokenizer_name, tokenizer_file=tokenizer_file, eot_token=eot_token).vocab_size
    return -(-base // multiple) * multiple
