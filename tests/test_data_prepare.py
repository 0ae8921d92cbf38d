"""scripts/prepare_data.py and torchnlq.data.prepare: files -> train.bin, val.bin, meta.json."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from torchnlq.config.job_config import Data
from torchnlq.data import build_tokenizer, open_token_files, prepare_dataset
from torchnlq.data import token_format as fmt
from torchnlq.errors import UserError

from helpers import REPO_ROOT
from helpers.data import R50K_URL, SHAKESPEARE, SHARED_GPT2, isolate_env, needs_gpt2, split_docs, write_toy_tiktoken

DOCS = [
    "the thing in the king's house",
    "Nothing is sung in the thing.\nSecond line of doc two.",
    "ünïcödé text — and <|endoftext|> written literally",
    "a fourth document",
    "the end",
]


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    isolate_env(tmp_path, monkeypatch)


def read_split(out: Path, split: str) -> np.ndarray:
    return np.fromfile(fmt.split_file(out, split), dtype=fmt.DTYPE)


@pytest.mark.integration  # num_proc=2: a datasets worker pool
def test_prepare_text_files_toy_gpt2(tmp_path):
    files = []
    for i, doc in enumerate(DOCS):
        files.append(tmp_path / f"doc{i}.txt")
        files[-1].write_text(doc)
    toy = write_toy_tiktoken(tmp_path / "toy.tiktoken")
    out = tmp_path / "out"
    kw = dict(files=[str(f) for f in files], tiktoken_file=str(toy), expected_hash=None, val_fraction=0.2, num_proc=2)
    meta = prepare_dataset(out, **kw)
    tok = build_tokenizer("gpt2", str(toy), expected_hash=None)
    decoded = {}
    for split in ("train", "val"):
        tokens = read_split(out, split)
        assert meta["tokens"][split] == len(tokens) == os.path.getsize(fmt.split_file(out, split)) // 2
        decoded[split] = [tok.decode(d) for d in split_docs(tokens, tok.eot_id)]
        assert meta["documents"][split] == len(decoded[split])
    assert len(decoded["val"]) == 1  # ceil(0.2 * 5)
    assert sorted(decoded["train"] + decoded["val"]) == sorted(DOCS)
    assert tok.encode("the thing") == [257, 32, 256, 260]  # the toy merges really were used
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_id"], meta["dtype"]) == ("gpt2", 50257, 50256, "uint16")
    assert meta["source"]["split"] == {"method": "train_test_split", "val_fraction": 0.2, "seed": 2357}
    assert json.loads((out / "meta.json").read_text()) == meta
    first = {s: fmt.split_file(out, s).read_bytes() for s in ("train", "val")}

    # Re-run (a previous token folder: needs overwrite): same bytes, no temporary files.
    prepare_dataset(out, **kw, overwrite=True)
    assert {s: fmt.split_file(out, s).read_bytes() for s in ("train", "val")} == first
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]

    # Interrupted run: the previous complete files stay, temporaries are removed.
    real_write = fmt.write_tokens

    def interrupted(path, total, chunks):
        real_write(path, total, chunks)
        if path.name.startswith(".val"):
            raise KeyboardInterrupt

    fmt.write_tokens = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            prepare_dataset(out, **{**kw, "val_fraction": 0.4}, overwrite=True)
    finally:
        fmt.write_tokens = real_write
    assert {s: fmt.split_file(out, s).read_bytes() for s in ("train", "val")} == first
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    assert json.loads((out / "meta.json").read_text()) == meta


def test_tiny_input_still_gets_a_val_document(tmp_path):
    (tmp_path / "a.txt").write_text("first document")
    (tmp_path / "b.txt").write_text("second document")
    meta = prepare_dataset(tmp_path / "out", files=[str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], tokenizer="byte")
    assert meta["documents"] == {"train": 1, "val": 1}
    texts = sorted(bytes(d).decode() for s in ("train", "val") for d in split_docs(read_split(tmp_path / "out", s), 256))
    assert texts == ["first document", "second document"]


def test_prepare_jsonl_and_lines(tmp_path):
    rows = [{"body": f"record {i} text", "id": i} for i in range(20)] + [{"body": "", "id": 99}]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "json"
    meta = prepare_dataset(out, files=[str(path)], text_field="body", tokenizer="byte", val_fraction=0.1)
    docs = [bytes(d).decode() for s in ("train", "val") for d in split_docs(read_split(out, s), 256)]
    assert sorted(docs) == sorted(r["body"] for r in rows[:20])  # the empty record is dropped
    assert meta["documents"] == {"train": 18, "val": 2} and meta["source"]["format"] == "json"
    with pytest.raises(UserError, match="no 'text' field \\(fields: body, id\\)"):
        prepare_dataset(tmp_path / "bad", files=[str(path)], tokenizer="byte")

    lines = tmp_path / "lines.txt"
    lines.write_text("one\n\ntwo\nthree\n")
    meta = prepare_dataset(tmp_path / "lines", files=[str(lines)], text_split="line", tokenizer="byte", val_fraction=0.3)
    assert meta["documents"]["train"] + meta["documents"]["val"] == 3


def test_prepare_errors(tmp_path):
    one = tmp_path / "one.txt"
    one.write_text("only one document")
    with pytest.raises(UserError, match="1 document\\(s\\); at least 2 .*--text-split paragraph"):
        prepare_dataset(tmp_path / "o", files=[str(one)], tokenizer="byte")
    with pytest.raises(UserError, match="input file\\(s\\) not found: .*missing.txt"):
        prepare_dataset(tmp_path / "o", files=[str(tmp_path / "missing.txt")], tokenizer="byte")
    with pytest.raises(UserError, match="gpt2.tiktoken' does not exist"):
        prepare_dataset(tmp_path / "o", files=[str(one)], tiktoken_file=str(tmp_path / "gpt2.tiktoken"))
    with pytest.raises(UserError, match="does not fit the uint16"):
        fmt.check_vocab_fits(65537)
    fmt.check_vocab_fits(65536)  # ids 0..65535 fit


@pytest.mark.integration  # the real corpus and tokenizer, end to end
@needs_gpt2
@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="../shared/data/tinyshakespeare.txt not present")
def test_prepare_real_gpt2_shakespeare(tmp_path):
    import tiktoken

    text = SHAKESPEARE.read_text()[:20_000]
    src = tmp_path / "shakespeare.txt"
    src.write_text(text)
    out = tmp_path / "shakespeare"
    meta = prepare_dataset(
        out, files=[str(src)], text_split="paragraph", tiktoken_file=str(SHARED_GPT2), val_fraction=0.1, num_proc=2
    )
    # Reference ids: tiktoken's own r50k_base (= gpt2 ids), loaded offline from its cache dir.
    shutil.copy(SHARED_GPT2, tmp_path / "tiktoken" / hashlib.sha1(R50K_URL.encode()).hexdigest())
    ref = tiktoken.get_encoding("r50k_base")
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    expected = sorted(ref.encode_ordinary(p) for p in paragraphs)
    got = sorted(d for s in ("train", "val") for d in split_docs(read_split(out, s), 50256))
    assert got == expected
    assert [5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11] in [d[:10] for d in got]  # "First Citizen:\nBefore we proceed any further,"
    assert meta["tokenizer_info"]["tiktoken_sha256"].startswith("306cd27f")
    train, val, _ = open_token_files(Data(path=str(out), tokenizer="gpt2"), seq_len=64)
    assert len(train) + len(val) == sum(len(d) + 1 for d in expected)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"), *args],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120,
    )


@pytest.mark.integration  # scripts/prepare_data.py in a subprocess
def test_cli_help_and_errors(tmp_path):
    r = run_cli("--help")
    assert r.returncode == 0 and "--text-split" in r.stdout and "--tiktoken-file" in r.stdout
    r = run_cli("--out", str(tmp_path / "o"), "--files", str(tmp_path / "missing.txt"), "--tokenizer", "byte")
    assert r.returncode == 2 and r.stderr.startswith("error: input file(s) not found") and "Traceback" not in r.stderr
    r = run_cli("--out", str(tmp_path / "owt"), "--tokenizer", "byte", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "error: could not load dataset 'openwebtext'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()[-1]) > 20


@pytest.mark.integration  # scripts/prepare_data.py in a subprocess
def test_cli_end_to_end(tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text(f"document number {i}")
    out = tmp_path / "cli"
    r = run_cli("--out", str(out), "--files", *(str(tmp_path / f"{i}.txt") for i in range(3)), "--tokenizer", "byte")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and fmt.is_complete(out) and (out / "hf_cache").is_dir()
