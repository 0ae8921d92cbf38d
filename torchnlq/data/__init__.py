"""Data: tokenizers, token-file preparation, the pre-drawn batch schedule, the synthetic corpus.

``prepare_dataset`` is imported lazily: it pulls in Hugging Face ``datasets``.
"""

from __future__ import annotations

from typing import Any

from torchnlq.data.batches import (
    BatchSchedule,
    PaperValidationRows,
    ValidationSet,
    build_batch_schedule,
    build_validation_set,
    open_token_files,
)
from torchnlq.data.loader import RunData, TrainLoader, build_data
from torchnlq.data.synthetic import (
    ensure_synthetic_corpus,
    generate_synthetic_tokens,
    unigram_entropy,
)
from torchnlq.data.token_file import TokenFile, read_batch
from torchnlq.data.token_format import read_meta
from torchnlq.data.tokenizer import (
    BASE_VOCAB_SIZE,
    ByteTokenizer,
    GPT2Tokenizer,
    HFTokenizer,
    Tokenizer,
    build_tokenizer,
    padded_vocab_size,
)

__all__ = [
    "BASE_VOCAB_SIZE",
    "BatchSchedule",
    "ByteTokenizer",
    "RunData",
    "TrainLoader",
    "GPT2Tokenizer",
    "HFTokenizer",
    "TokenFile",
    "Tokenizer",
    "PaperValidationRows",
    "ValidationSet",
    "build_batch_schedule",
    "build_data",
    "build_tokenizer",
    "build_validation_set",
    "ensure_synthetic_corpus",
    "generate_synthetic_tokens",
    "open_token_files",
    "padded_vocab_size",
    "prepare_dataset",
    "read_batch",
    "read_meta",
    "unigram_entropy",
]


def __getattr__(name: str) -> Any:
    if name == "prepare_dataset":
        from torchnlq.data.prepare import prepare_dataset

        return prepare_dataset
    raise AttributeError(f"module 'torchnlq.data' has no attribute {name!r}")
