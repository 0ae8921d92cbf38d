"""The seeded offline corpus (torchnlq.data.synthetic)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from torchnlq.config.job_config import Data
from torchnlq.data import token_format as fmt
from torchnlq.data.batches import open_token_files
from torchnlq.data.synthetic import ensure_synthetic_corpus, generate_synthetic_tokens, unigram_entropy
from torchnlq.data.tokenizer import ByteTokenizer
from torchnlq.errors import UserError

from helpers.data import isolate_env, split_docs, write_token_folder

# The corpus of seed 0 as measured when the generator was written (docs/data.md quotes these).
SEED0_TRAIN_TOKENS = 1_506_303
SEED0_VAL_TOKENS = 75_478
SEED0_UNIGRAM_NATS = 2.8038


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    isolate_env(tmp_path, monkeypatch)


def test_deterministic_in_seed():
    a, b, c = generate_synthetic_tokens(0), generate_synthetic_tokens(0), generate_synthetic_tokens(1)
    assert all(np.array_equal(a[s], b[s]) for s in ("train", "val"))
    assert not np.array_equal(a["train"][:10_000], c["train"][:10_000])
    assert (len(a["train"]), len(a["val"])) == (SEED0_TRAIN_TOKENS, SEED0_VAL_TOKENS)


def test_unigram_entropy():
    tokens = np.array([0, 0, 1, 2, 2, 2, 2, 5], dtype=fmt.DTYPE)
    p = np.array([2, 1, 4, 1]) / 8
    assert unigram_entropy(tokens) == pytest.approx(-(p * np.log(p)).sum())
    assert unigram_entropy(np.zeros(10, dtype=fmt.DTYPE)) == 0.0


def test_ensure_synthetic_corpus(tmp_path):
    folder = tmp_path / "synthetic"
    start = time.perf_counter()
    assert ensure_synthetic_corpus(folder) == folder
    assert time.perf_counter() - start < 5.0
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_id"], meta["dtype"]) == ("byte", 257, 256, "uint16")
    assert meta["tokens"] == {"train": SEED0_TRAIN_TOKENS, "val": SEED0_VAL_TOKENS}
    arrays = {s: np.fromfile(fmt.split_file(folder, s), dtype=fmt.DTYPE) for s in ("train", "val")}
    for split, arr in arrays.items():
        assert np.array_equal(arr, generate_synthetic_tokens(0)[split])
        assert meta["source"]["unigram_entropy_nats"][split] == pytest.approx(unigram_entropy(arr), abs=1e-6)
        docs = split_docs(arr, 256)
        assert len(docs) == meta["documents"][split] and min(map(len, docs)) > 20
    assert unigram_entropy(folder / "train.bin") == pytest.approx(SEED0_UNIGRAM_NATS, abs=1e-4)
    text = ByteTokenizer().decode(arrays["train"][:2000])
    assert text.startswith("the ") and "<|endoftext|>" in text and text.isascii()

    # Second call: already complete, nothing is rewritten.
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    ensure_synthetic_corpus(folder)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes
    # Another seed regenerates; no temporary files are left.
    ensure_synthetic_corpus(folder, seed=1)
    assert json.loads((folder / "meta.json").read_text())["source"]["seed"] == 1
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_refuses_to_overwrite_other_data(tmp_path):
    folder = write_token_folder(tmp_path / "owt", np.arange(500) % 256, np.arange(100) % 256)
    with pytest.raises(UserError, match="did not write as its synthetic corpus"):
        ensure_synthetic_corpus(folder)


def test_open_token_files_generates_on_first_use(tmp_path):
    cfg = Data(path=str(tmp_path / "syn"), tokenizer="byte", synthetic=True)
    train, val, meta = open_token_files(cfg, seq_len=256)
    assert (len(train), len(val), meta["source"]["kind"]) == (SEED0_TRAIN_TOKENS, SEED0_VAL_TOKENS, "synthetic")
    with pytest.raises(UserError, match="tokenized with 'byte'"):
        open_token_files(Data(path=cfg.path, tokenizer="gpt2", synthetic=True), seq_len=256)
