"""Tokenizers, token files and the pre-drawn batch schedule (torchnlq.data)."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil

import numpy as np
import pytest
import torch

from torchnlq.config.job_config import Data, Training, Validation
from torchnlq.data import token_format as fmt
from torchnlq.data.batches import (BatchSchedule, ValidationSet, build_batch_schedule, build_validation_set,
                                   open_token_files)
from torchnlq.data.token_file import TokenFile, read_batch
from torchnlq.data.tokenizer import ByteTokenizer, build_tokenizer
from torchnlq.errors import UserError

from helpers import REPO_ROOT
from helpers.data import R50K_URL, SHARED_GPT2, isolate_env, needs_gpt2, write_toy_tiktoken, write_token_folder


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    isolate_env(tmp_path, monkeypatch)


# ---------------------------------------------------------------- tokenizers


def test_byte_tokenizer_roundtrip():
    tok = build_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and (tok.vocab_size, tok.eot_id) == (257, 256)
    ids = tok.encode("héllo <|endoftext|>")
    assert max(ids) < 256 and 256 not in ids  # ordinary: special text stays text
    assert tok.decode(ids + [256] + tok.encode("x")) == "héllo <|endoftext|><|endoftext|>x"
    assert tok.describe() == {"name": "byte", "vocab_size": 257, "eot_id": 256}


def test_unknown_tokenizer():
    with pytest.raises(UserError, match="unknown tokenizer 'bpe'"):
        build_tokenizer("bpe")


def test_toy_tiktoken_file(tmp_path):
    path = write_toy_tiktoken(tmp_path / "toy.tiktoken")
    tok = build_tokenizer("gpt2", str(path), expected_hash=None)
    assert tok.encode("the thing") == [257, 32, 256, 260]  # "the" | " " "th" "ing"
    assert tok.encode("<|endoftext|>") != [tok.eot_id]
    assert tok.decode(tok.encode("the thing") + [tok.eot_id]) == "the thing<|endoftext|>"
    assert (tok.vocab_size, tok.eot_id) == (50257, 50256)
    assert tok.describe()["tiktoken_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # Pickles by recipe (small), as datasets' worker processes need.
    clone = pickle.loads(pickle.dumps(tok))
    assert len(pickle.dumps(tok)) < 1000 and clone.encode("the thing") == tok.encode("the thing")
    assert not any((tmp_path / "tiktoken").iterdir())  # no cache copy of the local file


def test_tiktoken_file_from_env(tmp_path, monkeypatch):
    path = write_toy_tiktoken(tmp_path / "toy.tiktoken")
    monkeypatch.setenv("TORCHNLQ_TIKTOKEN_FILE", str(path))
    assert build_tokenizer("gpt2", expected_hash=None).encode("the") == [257]


def test_tiktoken_file_missing_or_bad(tmp_path):
    with pytest.raises(UserError, match="nowhere.tiktoken' does not exist.*TORCHNLQ_TIKTOKEN_FILE"):
        build_tokenizer("gpt2", str(tmp_path / "nowhere.tiktoken"))
    toy = write_toy_tiktoken(tmp_path / "toy.tiktoken")
    with pytest.raises(UserError, match=r"toy.tiktoken' has sha256 .* not the GPT-2"):
        build_tokenizer("gpt2", str(toy))
    garbage = tmp_path / "garbage.tiktoken"
    garbage.write_text("not a ranks file at all\n")
    with pytest.raises(UserError, match="garbage.tiktoken' is corrupt"):
        build_tokenizer("gpt2", str(garbage), expected_hash=None)
    # A user's ranks file goes through the same bounded parser as the ranks a checkpoint carries.
    lines = toy.read_bytes().splitlines(keepends=True)
    for name, text in (("repeated", b"".join(lines) + lines[-1].replace(b" 260", b" 261")),
                       ("no_byte", b"".join(lines[1:]))):
        bad = tmp_path / f"{name}.tiktoken"
        bad.write_bytes(text)
        with pytest.raises(UserError, match=f"{name}.tiktoken' (is corrupt|lacks the single byte 0x00)"):
            build_tokenizer("gpt2", str(bad), expected_hash=None)


def test_gpt2_unavailable_offline(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(UserError, match="tokenizer gpt2 unavailable offline.*gpt2.tiktoken"):
        build_tokenizer("gpt2")


@needs_gpt2
def test_real_gpt2_ids(tmp_path, monkeypatch):
    tok = build_tokenizer("gpt2", str(SHARED_GPT2))
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("First Citizen:\nBefore we") == [5962, 22307, 25, 198, 8421, 356]
    assert tok.encode(" the") == [262] and tok.vocab_size == 50257
    # tiktoken's own r50k_base (same ids as "gpt2"), loaded offline from its cache directory.
    import tiktoken

    cache = tmp_path / "tiktoken"
    shutil.copy(SHARED_GPT2, cache / hashlib.sha1(R50K_URL.encode()).hexdigest())
    ref = tiktoken.get_encoding("r50k_base")
    text = "It's 2024: naïve café—über ñ 'll 've\n\n  spaces\tand <|endoftext|> 12345!"
    assert tok.encode(text) == ref.encode_ordinary(text)


# ---------------------------------------------------------------- schedule


def test_schedule_is_the_papers_table():
    n, steps, seq_len = 1_000_000, 4, 1024
    sched = BatchSchedule(n, seq_len, steps, 480, seed=42)
    # The paper's code, written out independently.
    g = torch.Generator().manual_seed(42)
    ix = torch.randint(n - 1024, (steps, 480), generator=g)
    for s in range(steps):
        for m in range(40):
            got = sched.offsets_for(s, m, rank=0, world_size=1, micro_batch_size=12, grad_accum_steps=40)
            assert got.dtype == torch.int64 and torch.equal(got, ix[s, 12 * m : 12 * m + 12])
    assert int(sched.offsets.max()) + seq_len + 1 <= n


def test_schedule_same_for_every_model_and_pure():
    a = BatchSchedule(50_000, 64, 20, 24, seed=42)  # e.g. built by the baseline run
    b = BatchSchedule(50_000, 64, 20, 24, seed=42)  # ... and by the nonlinear-query run
    assert a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 16
    assert BatchSchedule(50_000, 64, 20, 24, seed=43).fingerprint() != a.fingerprint()
    first = a.offsets_for(7, 2, 1, 2, 4, 3)
    # A run's length is not its data order: a longer run draws the same rows first (branched decays share it);
    # another batch size, sequence length or corpus size draws other rows.
    longer = BatchSchedule(50_000, 64, 35, 24, seed=42)
    assert torch.equal(longer.offsets[:20], a.offsets) and longer.fingerprint() == a.fingerprint()
    for other in (BatchSchedule(50_000, 64, 20, 12, seed=42), BatchSchedule(50_000, 32, 20, 24, seed=42),
                  BatchSchedule(60_000, 64, 20, 24, seed=42)):
        assert other.fingerprint() != a.fingerprint()
    for s, m in [(0, 0), (19, 2), (3, 1)]:  # other calls in between change nothing
        a.offsets_for(s, m, 0, 2, 4, 3)
    assert torch.equal(first, a.offsets_for(7, 2, 1, 2, 4, 3))
    first[:] = -1  # a returned slice is a copy, not a view into the table
    assert torch.equal(b.offsets_for(7, 2, 1, 2, 4, 3), a.offsets_for(7, 2, 1, 2, 4, 3))
    # A longer run sees the same first rows (resume with more steps keeps the data order).
    assert torch.equal(BatchSchedule(50_000, 64, 30, 24, seed=42).offsets[:20], a.offsets)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ranks_cover_the_global_row(world_size):
    sched = BatchSchedule(100_000, 32, 3, 24, seed=42)
    micro = 2
    accum = 24 // (micro * world_size)
    for s in range(3):
        parts = [
            sched.offsets_for(s, m, r, world_size, micro, accum) for r in range(world_size) for m in range(accum)
        ]
        assert torch.equal(torch.cat(parts), sched.offsets[s])


def test_incompatible_layout():
    sched = BatchSchedule(10_000, 16, 2, 480, seed=42)
    with pytest.raises(UserError, match=r"micro_batch_size=12 x grad_accum_steps=40 x world_size=2 = 960.*480"):
        sched.offsets_for(0, 0, 0, 2, 12, 40)
    with pytest.raises(IndexError):
        sched.offsets_for(2, 0, 0, 1, 12, 40)


def test_build_from_config(tmp_path):
    train = np.arange(10_000) % 257
    cfg = Training(steps=5, micro_batch_size=3, grad_accum_steps=2, seq_len=16)
    tf_path = tmp_path / "t.bin"
    tf_path.write_bytes(train.astype(fmt.DTYPE).tobytes())
    sched = build_batch_schedule(TokenFile(tf_path), cfg, Data(seed=7), world_size=2)
    assert (sched.steps, sched.global_batch, sched.seed, sched.seq_len) == (5, 12, 7, 16)
    vs = build_validation_set(TokenFile(tf_path), Validation(sequences=10, seed=1), 16, default_micro_batch_size=4)
    assert vs.micro_batch_size == 4 and len(vs) == 3


def test_read_batch_windows(tmp_path):
    tokens = (np.arange(20_000) * 7 % 50_000).astype(fmt.DTYPE)
    path = tmp_path / "train.bin"
    path.write_bytes(tokens.tobytes())
    tf = TokenFile(path)
    assert len(tf) == 20_000
    offsets = torch.tensor([0, 5, 19_000 - 1, 20_000 - 65])
    x, y = read_batch(tf, offsets, 64)
    assert x.shape == y.shape == (4, 64) and x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(x[:, 1:], y[:, :-1])
    for i, o in enumerate(offsets.tolist()):
        assert x[i].tolist() == tokens[o : o + 64].tolist()
        assert y[i].tolist() == tokens[o + 1 : o + 65].tolist()


def _vm_flags(path) -> set[str]:
    """The kernel's VmFlags of this process's mapping of ``path`` (Linux /proc/self/smaps)."""
    lines, target = open("/proc/self/smaps").read().splitlines(), str(path)
    for i, line in enumerate(lines):
        if line.endswith(target):
            flags = next(m for m in lines[i + 1 :] if m.startswith("VmFlags:"))
            return set(flags.split()[1:])
    raise AssertionError(f"{path} is not mapped")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc/self/smaps")
def test_token_file_is_mapped_for_random_reads(tmp_path):
    """MADV_RANDOM (smaps flag "rr"): a cold random read must not pull the readahead window."""
    import mmap

    path = tmp_path / "train.bin"
    path.write_bytes(np.arange(50_000, dtype=fmt.DTYPE).tobytes())
    tf = TokenFile(path)
    assert "rr" in _vm_flags(path)
    tf.advise(mmap.MADV_NORMAL)
    assert "rr" not in _vm_flags(path)
    assert tf.tokens[12_345] == 12_345 and not tf.tokens.flags.writeable


def test_validation_set_fixed(tmp_path):
    path = tmp_path / "val.bin"
    path.write_bytes((np.arange(3000) % 251).astype(fmt.DTYPE).tobytes())
    val = TokenFile(path)
    a = ValidationSet(val, 32, sequences=10, micro_batch_size=4, seed=2357)
    b = ValidationSet(val, 32, sequences=10, micro_batch_size=4, seed=2357)
    g = torch.Generator().manual_seed(2357)
    assert torch.equal(a.offsets, torch.randint(3000 - 32, (10,), generator=g))
    assert a.fingerprint() == b.fingerprint() != ValidationSet(val, 32, 10, 4, seed=1).fingerprint()
    batches = list(a)
    assert len(a) == len(batches) == 3 and [x.shape[0] for x, _ in batches] == [4, 4, 2]
    again = list(a)  # iterating twice gives the same batches
    for (x1, y1), (x2, y2), (x3, _) in zip(batches, again, b):
        assert torch.equal(x1, x2) and torch.equal(y1, y2) and torch.equal(x1, x3)


# ---------------------------------------------------------------- opening token files


def test_open_token_files_ok(tmp_path):
    folder = write_token_folder(tmp_path / "d", np.arange(1000) % 256, np.arange(100) % 256)
    train, val, meta = open_token_files(Data(path=str(folder), tokenizer="byte"), seq_len=99)
    assert (len(train), len(val), meta["tokenizer"]) == (1000, 100, "byte")


def test_the_missing_corpus_advice_trains_when_followed(tmp_path, monkeypatch):
    """A gpt2 config without its corpus: the synthetic-corpus overrides the error names make it start (issue 24)."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.preflight import check_job_config

    monkeypatch.chdir(tmp_path)
    cfg = load_job_config([str(REPO_ROOT / "train_configs/gpt_small_baseline.toml"), "--data.path=nowhere"])
    with pytest.raises(UserError) as missing:
        open_token_files(cfg.data, cfg.training.seq_len)
    advice = str(missing.value).split("train on the offline synthetic corpus: ", 1)[1]
    cfg = load_job_config([str(REPO_ROOT / "train_configs/gpt_small_baseline.toml"), "--data.path=nowhere", *advice.split()])
    check_job_config(cfg)
    train, val, meta = open_token_files(cfg.data, cfg.training.seq_len)
    assert meta["tokenizer"] == "byte" and len(train) > cfg.training.seq_len and not (tmp_path / "nowhere").exists()


def test_open_token_files_errors(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(UserError, match=r"data.path '.*nope' does not exist; prepare it with: \S*python scripts/prepare_data.py --out"):
        open_token_files(Data(path=str(missing), tokenizer="byte"), 8)
    folder = write_token_folder(tmp_path / "d", np.arange(1000) % 256, np.arange(100) % 256)
    with pytest.raises(UserError, match=r"val.bin has 100 tokens, fewer than one sequence of seq_len\+1=101"):
        open_token_files(Data(path=str(folder), tokenizer="byte"), 100)
    with pytest.raises(UserError, match="tokenized with 'byte' .* data.tokenizer is 'gpt2'"):
        open_token_files(Data(path=str(folder), tokenizer="gpt2"), 8)
    fmt.split_file(folder, "val").write_bytes(b"\0\0" * 50)
    with pytest.raises(UserError, match="val.bin has 50 tokens but meta.json says 100"):
        open_token_files(Data(path=str(folder), tokenizer="byte"), 8)
    (folder / "meta.json").unlink()
    with pytest.raises(UserError, match="lacks meta.json .*prepare_data.py"):
        open_token_files(Data(path=str(folder), tokenizer="byte"), 8)


def test_schedule_too_short():
    with pytest.raises(UserError, match="fewer than one sequence"):
        BatchSchedule(64, 64, 1, 1, seed=0)
