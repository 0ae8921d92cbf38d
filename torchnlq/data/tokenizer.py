"""Tokenizers: tiktoken GPT-2 (with offline file support) and a byte-level one.

``encode`` is always the *ordinary* encoding: ``"<|endoftext|>"`` in a document is plain
text, never the eot id (the paper uses ``encode_ordinary`` and appends the eot id itself).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from torchnlq.errors import UserError

# Base (unpadded) vocabulary sizes: a model is sized without loading the tokenizer's files.
BASE_VOCAB_SIZE = {"gpt2": 50257, "byte": 257}

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
        """Ids back to text; the eot id is rendered as ``<|endoftext|>``."""

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


@contextlib.contextmanager
def _tiktoken_cache_disabled() -> Iterator[None]:
    # load_tiktoken_bpe copies even a local file into its cache, keyed by the *path*: a stale copy
    # would be served after the file changed. An empty TIKTOKEN_CACHE_DIR turns the cache off.
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def _load_ranks(path: str, expected_hash: str | None) -> tuple[dict[bytes, int], str]:
    """Read a ``.tiktoken`` ranks file; returns (ranks, sha256 of the file)."""
    from tiktoken.load import load_tiktoken_bpe

    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"tiktoken file '{path}' does not exist; {_OFFLINE_HINT}")
    digest = hashlib.sha256(p.read_bytes()).hexdigest()
    if expected_hash is not None and digest != expected_hash:
        raise UserError(
            f"tiktoken file '{path}' has sha256 {digest[:16]}..., not the GPT-2 (r50k_base) ranks "
            f"{expected_hash[:16]}...; {_OFFLINE_HINT}"
        )
    try:
        with _tiktoken_cache_disabled():
            ranks = load_tiktoken_bpe(str(p), expected_hash=expected_hash)
    except ValueError as e:
        raise UserError(f"tiktoken file '{path}' is not a valid .tiktoken ranks file ({e}); {_OFFLINE_HINT}") from e
    return ranks, digest


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
                self._enc = tiktoken.Encoding(
                    name="gpt2",
                    pat_str=GPT2_PATTERN,
                    mergeable_ranks=ranks,
                    special_tokens={ENDOFTEXT: GPT2_EOT_ID},
                    explicit_n_vocab=BASE_VOCAB_SIZE["gpt2"] if expected_hash else None,
                )
            except (ValueError, AssertionError) as e:
                raise UserError(f"tiktoken file '{self.path}' does not give the GPT-2 vocabulary ({e}); {_OFFLINE_HINT}") from e
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
        d = super().describe()
        if self.file_sha256 is not None:
            d["tiktoken_sha256"] = self.file_sha256
        return d

    # Pickle by recipe, not by the rank table (datasets' map(num_proc) and cache fingerprint pickle
    # the tokenizer); the file's sha256 in the state makes changed contents change the fingerprint.
    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "expected_hash": self.expected_hash, "file_sha256": self.file_sha256}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["expected_hash"])  # type: ignore[misc]
        if state["file_sha256"] != self.file_sha256:
            raise RuntimeError(f"tiktoken file '{self.path}' changed while in use")


def build_tokenizer(
    name: str, tiktoken_file: str | None = None, *, expected_hash: str | None = GPT2_TIKTOKEN_SHA256
) -> Tokenizer:
    """The tokenizer called ``name`` ("gpt2" or "byte"); ``expected_hash=None`` accepts any ranks file."""
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer(tiktoken_file, expected_hash)
    raise UserError(f"unknown tokenizer '{name}'; choose one of: {', '.join(sorted(BASE_VOCAB_SIZE))}")


def padded_vocab_size(tokenizer_name: str, multiple: int) -> int:
    """The embedding rows a model needs for ``tokenizer_name``: its base vocabulary rounded up to ``multiple``."""
    if tokenizer_name not in BASE_VOCAB_SIZE:
        raise UserError(f"unknown tokenizer '{tokenizer_name}'; choose one of: {', '.join(sorted(BASE_VOCAB_SIZE))}")
    return -(-BASE_VOCAB_SIZE[tokenizer_name] // multiple) * multiple
