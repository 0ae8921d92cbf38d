"""Tokenizer files in every export, and the tokenizer travelling with the model (torchnlq/interop/tokenizer_files.py).

The references are independent of torchnlq's writer: the ``tokenizers`` library and
``transformers.AutoTokenizer`` read the written files and must encode a varied text to exactly
torchnlq's ids, for the byte tokenizer, for GPT-2 BPE with the real ranks (when
../shared/data/gpt2.tiktoken is present) and always for a toy BPE this module learns itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import base64
import pickle
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from functools import partial

import pytest
import regex
import torch

from torchnlq.checkpoint.checkpointer import Checkpointer
from torchnlq.interop.export import export_safetensors
from torchnlq.interop.export import export_hf_standard
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.checkpoint.record import RunRecord
from torchnlq.config.job_config import Checkpoint
from torchnlq.interop import tokenizer_files as hft
from torchnlq.data import token_format as fmt
from torchnlq.data.tokenizer import (
    ENDOFTEXT,
    GPT2_PATTERN,
    MAX_TOKEN_BYTES,
    TIKTOKEN_FILE_ENV,
    ByteTokenizer,
    Tokenizer,
    build_tokenizer,
    parse_ranks,
)
from torchnlq.errors import UserError
from torchnlq.inference.sampling import generate_text
from torchnlq.train.run_start import checkpoint_files

import helpers
from helpers.checkpoints import BYTE_TOKENIZER, load_script, tiny_model

SHARED_GPT2 = Path(os.environ.get("TORCHNLQ_SHARED_DATA") or helpers.SHARED_DATA) / "gpt2.tiktoken"
needs_gpt2 = pytest.mark.skipif(not SHARED_GPT2.is_file(), reason="../shared/data/gpt2.tiktoken not present")

# Spaces (runs of them, leading, trailing), newlines and tabs, contractions, digits, punctuation,
# accented and non-Latin letters, emoji (4-byte UTF-8).
TEXT = (
    "Hello world!  It's 2024: the café's naïve façade — Straße, Ελληνικά, русский, 東京 🙂🚀\n\n"
    "  don't  you'll\tthey've we'd I'm  x=y+1; 3.14159 -- ellipses... \"quotes\" (and) [brackets]\n"
    "   indented line\r\nthe thing they're in, isn't it?  \n\n"
)
TOY_CORPUS = (
    "The quick brown fox jumps over the lazy dog. It's the dog's day, isn't it? We'll see: they've "
    "gone there, and I'm sure you'd agree that the thing in the garden is the one they're watching.\n"
    "Numbers like 1234, 2024 and 3.14159 show up in the text; so does punctuation -- ellipses... and quotes.\n"
    "Unicode: café, naïve, façade, Straße, Ελληνικά, русский, 東京, and emoji 😀 🚀 in the middle of things.\n"
    "Another line: the thinking, the singing, the bringing in of things; nothing is interesting in this.\n"
)


# ---------------------------------------------------------------- a toy BPE, learned here


def learn_toy_ranks(text: str, merges: int) -> tuple[dict[bytes, int], list[tuple[bytes, bytes]]]:
    """Byte-level BPE training: the 256 bytes (id = byte value), then the most frequent new pair, ``merges`` times.

    Words are GPT-2's pre-tokenisation pieces. A pair whose concatenation is already a token is not
    counted: a tiktoken rank belongs to one token, so every token must come from one merge.
    """
    words = Counter(tuple(bytes([b]) for b in w.encode()) for w in regex.findall(GPT2_PATTERN, text))
    ranks = {bytes([b]): b for b in range(256)}
    learned: list[tuple[bytes, bytes]] = []
    for _ in range(merges):
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                if a + b not in ranks:
                    pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))  # ties broken by the pair: deterministic
        ranks[a + b] = len(ranks)
        learned.append((a, b))
        merged: Counter[tuple[bytes, ...]] = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return ranks, learned


def write_tiktoken(path: Path, ranks: dict[bytes, int]) -> Path:
    """tiktoken's ``base64 rank`` format, written here (not with torchnlq's ranks_text)."""
    import base64

    lines = [base64.b64encode(t).decode() + f" {r}\n" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    path.write_text("".join(lines))
    return path


@dataclass
class Vocab:
    """One tokenizer under test: its name, description, torchnlq tokenizer and ranks file (gpt2)."""

    kind: str
    desc: dict
    tokenizer: Tokenizer
    ranks_file: Path | None


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[bytes, int], list[tuple[bytes, bytes]]]:
    ranks, merges = learn_toy_ranks(TOY_CORPUS * 4, 400)
    assert len(merges) >= 200  # "a few hundred"
    path = write_tiktoken(tmp_path_factory.mktemp("toy") / "toy.tiktoken", ranks)
    return path, ranks, merges


def make_vocab(kind: str, toy_path: Path) -> Vocab:
    if kind == "byte":
        return Vocab(kind, dict(BYTE_TOKENIZER), ByteTokenizer(), None)
    if kind == "toy":
        tok = build_tokenizer("gpt2", str(toy_path), expected_hash=None)
        return Vocab(kind, tok.describe(), tok, toy_path)
    if not SHARED_GPT2.is_file():
        pytest.skip("../shared/data/gpt2.tiktoken not present")
    tok = build_tokenizer("gpt2", str(SHARED_GPT2))
    return Vocab(kind, tok.describe(), tok, SHARED_GPT2)


@pytest.fixture(params=["byte", "toy", "gpt2"])
def vocab(request: pytest.FixtureRequest, toy, monkeypatch: pytest.MonkeyPatch) -> Vocab:
    """A tokenizer whose ranks (gpt2 kinds) are reachable through $TORCHNLQ_TIKTOKEN_FILE."""
    v = make_vocab(request.param, toy[0])
    if v.ranks_file is not None:
        monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(v.ranks_file))
    else:
        monkeypatch.delenv(TIKTOKEN_FILE_ENV, raising=False)
    return v


def model_for(v: Vocab, **kw):
    """A tiny model whose vocabulary holds the tokenizer's ids (GPT-2's 50257 padded to 50304)."""
    if v.kind == "byte":
        return tiny_model(**kw)
    return tiny_model(n_layers=1, dim=8, n_heads=2, vocab_size=50304, max_seq_len=16, **kw)


def loaded(model, desc, tmp_path: Path) -> LoadedModel:
    return LoadedModel(model, model.args, desc, {}, tmp_path, "test")


# ---------------------------------------------------------------- the files themselves (fast)


def test_byte_level_alphabet_is_printable_and_reversible():
    table = hft.byte_to_char()
    assert len(set(table.values())) == 256 and hft.char_to_byte() == {c: b for b, c in table.items()}
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"  # GPT-2's own


def test_merges_are_recovered_from_the_ranks_alone(toy):
    _, ranks, merges = toy
    assert hft.recover_merges(ranks) == merges  # the very merges, in the order they were learned


@needs_gpt2
def test_gpt2_merges_are_fast_and_complete():
    import time

    ranks = parse_ranks(SHARED_GPT2.read_bytes(), SHARED_GPT2)
    start = time.perf_counter()
    merges = hft.recover_merges(ranks)
    assert time.perf_counter() - start < 10  # about 0.4 s here
    assert len(merges) == 50000  # every token above the 256 bytes is a merge
    assert merges[0] == (b" ", b"t") and merges[1] == (b" ", b"a")  # GPT-2's merges.txt starts "Ġ t", "Ġ a"


def test_tokenizer_json_is_what_the_tokenizers_library_writes(vocab, tmp_path):
    from tokenizers import Tokenizer as FastTokenizer

    hft.write_hf_tokenizer_files(vocab.desc, tmp_path, 1024)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "merges.txt", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.json"
    ]
    fast = FastTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert json.loads(fast.to_str()) == json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    ids = vocab.tokenizer.encode(TEXT)
    assert fast.encode(TEXT).ids == ids
    assert fast.decode(ids) == TEXT == vocab.tokenizer.decode(ids)
    eot = vocab.tokenizer.eot_id
    assert fast.token_to_id(ENDOFTEXT) == eot == json.loads((tmp_path / "vocab.json").read_text())[ENDOFTEXT]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "GPT2Tokenizer" and config["model_max_length"] == 1024
    assert config["eos_token"] == config["bos_token"] == config["unk_token"] == ENDOFTEXT
    assert config["add_prefix_space"] is False and config["added_tokens_decoder"][str(eot)]["special"] is True
    merges = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[0] == "#version: 0.2" and len(merges) - 1 == len(json.loads(fast.to_str())["model"]["merges"])


def test_folder_round_trip_gives_the_same_ids(vocab, tmp_path):
    hft.write_hf_tokenizer_files(vocab.desc, tmp_path, 64)
    for desc in (vocab.desc, None):  # with the model's description, and from the files alone
        back = hft.tokenizer_from_folder(tmp_path, desc)
        assert back is not None and back.name == vocab.tokenizer.name
        assert back.encode(TEXT) == vocab.tokenizer.encode(TEXT)
        assert back.encode(ENDOFTEXT) == vocab.tokenizer.encode(ENDOFTEXT)  # ordinary encoding: plain text
        assert back.decode(vocab.tokenizer.encode(TEXT) + [back.eot_id]) == TEXT + ENDOFTEXT
    if vocab.kind != "byte":  # the rebuilt ranks are byte for byte the recorded file
        assert back.describe() == vocab.desc
        assert pickle.loads(pickle.dumps(back)).encode(TEXT) == vocab.tokenizer.encode(TEXT)


def test_byte_tokenizer_needs_and_reads_no_file(tmp_path):
    (tmp_path / "vocab.json").write_bytes(b"\x80 not json")  # never opened for a byte model
    assert isinstance(hft.tokenizer_from_folder(tmp_path, BYTE_TOKENIZER), ByteTokenizer)
    assert hft.tokenizer_from_folder(tmp_path / "empty", {"name": "gpt2"}) is None  # nothing carried


# ---------------------------------------------------------------- where gpt2 ranks come from


def test_gpt2_ranks_not_found_offline_is_one_line(toy, tmp_path, monkeypatch):
    monkeypatch.delenv(TIKTOKEN_FILE_ENV, raising=False)
    toy_desc = make_vocab("toy", toy[0]).desc
    for desc in ({"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}, toy_desc):
        with pytest.raises(UserError, match=f"not found offline; set {TIKTOKEN_FILE_ENV}") as e:
            hft.write_hf_tokenizer_files(desc, tmp_path, 64)
        assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []
    # A file of other ranks is refused by its sha256, naming where its name came from.
    monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(toy[0]))
    with pytest.raises(UserError, match=f"{TIKTOKEN_FILE_ENV} '.*toy.tiktoken' has sha256 .*not the model's ranks"):
        hft.write_hf_tokenizer_files({"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}, tmp_path, 64)
    with pytest.raises(UserError, match="unknown tokenizer 'sentencepiece'"):
        hft.write_hf_tokenizer_files({"name": "sentencepiece"}, tmp_path, 64)
    hft.write_hf_tokenizer_files({}, tmp_path, 64)  # a model without a tokenizer: nothing to write
    assert list(tmp_path.iterdir()) == []


@needs_gpt2
def test_gpt2_ranks_from_tiktokens_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(TIKTOKEN_FILE_ENV, raising=False)
    cache = Path(os.environ["TIKTOKEN_CACHE_DIR"])  # conftest: a fresh folder per test
    cache.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHARED_GPT2, cache / hashlib.sha1(hft.R50K_URL.encode()).hexdigest())
    hft.write_hf_tokenizer_files({"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}, tmp_path, 1024)
    assert hft.tokenizer_from_folder(tmp_path).encode("Hello world") == [15496, 995]


def test_corrupt_files_are_one_line_errors_naming_them(toy, tmp_path):
    desc = make_vocab("toy", toy[0]).desc
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "vocab.json").write_bytes(pickle.dumps({"planted": 1}))
    cases = [("vocab.json", "is corrupt"), ("tokenizer.tiktoken", r"is corrupt \(sha256")]
    for name, message in cases:
        for f in bad.iterdir():
            f.unlink()
        (bad / name).write_bytes(pickle.dumps({"planted": 1}))
        with pytest.raises(UserError, match=message) as e:
            hft.tokenizer_from_folder(bad, desc)
        assert str(bad / name) in str(e.value) and "\n" not in str(e.value)
    (bad / "tokenizer.tiktoken").unlink()
    (bad / "vocab.json").write_text(json.dumps({"Ā": 0, ENDOFTEXT: 50256}))
    with pytest.raises(UserError, match="lacks the single byte"):
        hft.tokenizer_from_folder(bad, desc)
    with pytest.raises(UserError, match="line 1 is not 'base64 rank'"):
        parse_ranks(b"not-base64!! x\n", "f.tiktoken")


# ---------------------------------------------------------------- exports: transformers.AutoTokenizer


def check_auto_tokenizer(folder: Path, v: Vocab) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder))
    ids = v.tokenizer.encode(TEXT)
    assert hf(TEXT)["input_ids"] == ids
    assert hf.decode(ids) == TEXT
    assert hf.eos_token_id == hf.bos_token_id == v.tokenizer.eot_id
    # The one difference: Hugging Face maps "<|endoftext|>" in the text to the special id; torchnlq's
    # ordinary encoding keeps it plain text.
    assert hf("a" + ENDOFTEXT)["input_ids"] == v.tokenizer.encode("a") + [v.tokenizer.eot_id]
    assert v.tokenizer.eot_id not in v.tokenizer.encode("a" + ENDOFTEXT)


@pytest.mark.integration  # imports transformers
@pytest.mark.parametrize("fmt_name", ["safetensors", "hf-gpt2"])
def test_auto_tokenizer_of_an_export_encodes_to_torchnlqs_ids(vocab, fmt_name, tmp_path, monkeypatch):
    model = model_for(vocab)
    export = export_safetensors if fmt_name == "safetensors" else partial(export_hf_standard, format="hf-gpt2")
    out = export(loaded(model, vocab.desc, tmp_path), tmp_path / "export")
    check_auto_tokenizer(out, vocab)
    # Without tokenizer.json, transformers builds the tokenizer from vocab.json and merges.txt.
    slow = tmp_path / "slow"
    shutil.copytree(out, slow)
    (slow / "tokenizer.json").unlink()
    check_auto_tokenizer(slow, vocab)
    # And torchnlq reads its own export back with the same ids, without the ranks file.
    monkeypatch.delenv(TIKTOKEN_FILE_ENV, raising=False)
    assert hft.tokenizer_from_folder(out, vocab.desc).encode(TEXT) == vocab.tokenizer.encode(TEXT)


# ---------------------------------------------------------------- checkpoints carry the ranks


def save_checkpoint(run: Path, model, desc: dict, step: int = 3, source: Path | None = None,
                    logger: logging.Logger | None = None) -> Path:
    """What the trainer does at a save: Checkpointer.save of the model, its optimizer and the run's record,
    with the tokenizer files the trainer hands it (``run_start.checkpoint_files``)."""
    logger = logger or logging.getLogger("test")
    ckpt = Checkpointer(Checkpoint(interval=1, keep_latest_k=0), run, 0, logger,
                        extra_files=lambda: checkpoint_files(desc, source, None, logger))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if source is not None:  # a resumed run: the checkpoint it loaded is where the ranks can come from
        ckpt.load(source, model, opt, {})
    record = RunRecord(model_args=model.args, tokenizer=dict(desc), seq_len=16, step=step)
    ckpt.save(record, model, opt)
    return run / "checkpoints" / f"step-{step}"


def generate(capsys, *argv: str) -> tuple[int, str, str]:
    script = load_script("generate")
    rc = script.run_cli(script.main, [str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_checkpoint_carries_the_ranks_and_generate_needs_no_flag(toy, tmp_path, monkeypatch, capsys):
    v = make_vocab("toy", toy[0])
    monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(toy[0]))  # how the run found its ranks
    ckpt = save_checkpoint(tmp_path / "run", model_for(v, init_std=0.3), v.desc)
    assert (ckpt / "tokenizer.tiktoken").read_bytes() == toy[0].read_bytes()
    monkeypatch.delenv(TIKTOKEN_FILE_ENV)
    argv = [ckpt, "--prompt", "the thing", "--max-new-tokens", "0"]
    rc, carried, err = generate(capsys, *argv)
    assert rc == 0, err
    rc, flagged, err = generate(capsys, *argv, "--tiktoken-file", toy[0])
    assert rc == 0 and carried == flagged == "the thing\n"
    text, result = generate_text(ckpt, "the thing", 0)
    assert result.prompt_tokens == v.tokenizer.encode("the thing")
    # Exports of it carry the tokenizer too, with no ranks file anywhere.
    for fmt_name in ("safetensors", "hf-gpt2"):
        convert = load_script("convert_checkpoint")
        out = tmp_path / fmt_name
        assert convert.run_cli(convert.main, [str(ckpt), str(out), "--format", fmt_name]) == 0
        assert hft.tokenizer_from_folder(out, v.desc).encode(TEXT) == v.tokenizer.encode(TEXT)
    assert generate_text(tmp_path / "safetensors", "the thing", 0) == (text, result)
    # An export converted again keeps its tokenizer (from its vocab.json).
    assert export_safetensors(tmp_path / "safetensors", tmp_path / "again")
    assert (tmp_path / "again" / "vocab.json").read_bytes() == (tmp_path / "safetensors" / "vocab.json").read_bytes()


def test_a_resumed_run_carries_the_ranks_on(toy, tmp_path, monkeypatch):
    v = make_vocab("toy", toy[0])
    model = model_for(v)
    monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(toy[0]))
    first = save_checkpoint(tmp_path / "run", model, v.desc, step=2)
    monkeypatch.delenv(TIKTOKEN_FILE_ENV)  # resumed on a machine without the file
    second = save_checkpoint(tmp_path / "run", model, v.desc, step=4, source=first)
    assert (second / "tokenizer.tiktoken").read_bytes() == toy[0].read_bytes()
    # A damaged copy in the resumed checkpoint does not hide the file the environment names.
    (second / "tokenizer.tiktoken").write_bytes(b"damaged")
    monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(toy[0]))
    third = save_checkpoint(tmp_path / "run", model, v.desc, step=6, source=second)
    assert (third / "tokenizer.tiktoken").read_bytes() == toy[0].read_bytes()


def test_a_run_without_its_ranks_warns_once_and_saves(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(TIKTOKEN_FILE_ENV, raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))  # no r50k_base another test cached
    import tiktoken.registry

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # nor an encoding another test loaded in this process
    desc = {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    model = tiny_model(n_layers=1, dim=8, n_heads=2, vocab_size=50304, max_seq_len=16)
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    logger = logging.getLogger("test.ranks")
    logger.addHandler(Collect())
    ckpt = save_checkpoint(tmp_path / "run", model, desc, logger=logger)
    assert [w for w in warnings if "will not carry the gpt2 tokenizer" in w] and len(warnings) == 1
    assert (ckpt / "torchnlq.json").is_file() and not (ckpt / "tokenizer.tiktoken").exists()
    # Sampling from it then needs the ranks file; exporting it says how to give them.
    rc, _, err = generate(capsys, ckpt, "--prompt", "x")
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1
    with pytest.raises(UserError, match=f"carries none and they were not found offline; set {TIKTOKEN_FILE_ENV}"):
        export_safetensors(ckpt, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_damaged_carried_files_stop_generate_with_one_line(toy, tmp_path, monkeypatch, capsys):
    v = make_vocab("toy", toy[0])
    monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(toy[0]))
    ckpt = save_checkpoint(tmp_path / "run", model_for(v), v.desc)
    export = export_safetensors(ckpt, tmp_path / "export")
    monkeypatch.delenv(TIKTOKEN_FILE_ENV)
    with open(ckpt / "tokenizer.tiktoken", "ab") as f:
        f.write(b"IA== 999\n")
    (export / "vocab.json").write_bytes(pickle.dumps({"planted": 1}))
    for folder, name in ((ckpt, "tokenizer.tiktoken"), (export, "vocab.json")):
        rc, _, err = generate(capsys, folder, "--prompt", "the", "--max-new-tokens", "0")
        assert rc == 2 and err.count("\n") == 1 and f"{folder / name}' is corrupt" in err, err
        # --tiktoken-file still overrides what the folder carries.
        rc, out, err = generate(capsys, folder, "--prompt", "the", "--max-new-tokens", "0", "--tiktoken-file", toy[0])
        assert rc == 0 and out == "the\n", err


def test_an_old_gpt2_export_needs_the_flag_as_before(toy, tmp_path, monkeypatch, capsys):
    v = make_vocab("toy", toy[0])
    monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(toy[0]))
    out = export_safetensors(loaded(model_for(v), v.desc, tmp_path), tmp_path / "old")
    monkeypatch.delenv(TIKTOKEN_FILE_ENV)
    for name in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer.json"):
        (out / name).unlink()
    (out / "tokenizer_config.json").write_text(json.dumps(v.desc))  # what exports held before
    assert load_model(out).tokenizer == v.desc
    rc, _, err = generate(capsys, out, "--prompt", "the", "--max-new-tokens", "0")
    assert rc == 2 and "--tiktoken-file" in err
    rc, text, err = generate(capsys, out, "--prompt", "the", "--max-new-tokens", "0", "--tiktoken-file", toy[0])
    assert rc == 0 and text == "the\n", err


# ---------------------------------------------------------------- a real training run


def write_gpt2_data(folder: Path, desc: dict, seed: int = 0) -> Path:
    """A data folder of random GPT-2 ids (the trainer never needs text), tokenizer gpt2."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    counts = {}
    for split, n in (("train", 6000), ("val", 2000)):
        tokens = rng.integers(0, 50256, n).astype(fmt.DTYPE)
        tokens[-1] = 50256
        fmt.split_file(folder, split).write_bytes(tokens.tobytes())
        counts[split] = n
    meta = fmt.make_meta(desc, counts, {"train": 1, "val": 1}, {"kind": "test"})
    (folder / fmt.META_NAME).write_text(json.dumps(meta))
    return folder


@pytest.mark.integration  # trains (seconds)
@pytest.mark.parametrize("kind", ["byte", "gpt2"])
def test_generate_from_a_trained_checkpoint_needs_no_ranks_file(kind, toy, tmp_path, monkeypatch, capsys):
    from helpers.train import tiny_config
    from torchnlq.train.trainer import Trainer

    v = make_vocab(kind, toy[0])
    extra: dict = dict(steps=4, checkpoint__interval=4, validation__interval=4, checkpoint__export_at_end=True)
    if kind == "gpt2":
        monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(SHARED_GPT2))  # the run finds the ranks here
        data = write_gpt2_data(tmp_path / "gpt2-data", v.desc)
        extra.update(data__path=data, data__tokenizer="gpt2", data__synthetic=False)
    Trainer(tiny_config(tmp_path, "run", **extra)).train()
    capsys.readouterr()  # the run's log
    ckpt = tmp_path / "outputs" / "run" / "checkpoints" / "step-4"
    if kind == "gpt2":
        assert (ckpt / "tokenizer.tiktoken").read_bytes() == SHARED_GPT2.read_bytes()
    monkeypatch.delenv(TIKTOKEN_FILE_ENV, raising=False)
    argv = [ckpt, "--prompt", "It's the thing", "--max-new-tokens", "6", "--temperature", "0.8", "--seed", "3"]
    rc, carried, err = generate(capsys, *argv)
    assert rc == 0 and carried.startswith("It's the thing"), err
    rc, flagged, err = generate(capsys, *argv, "--tiktoken-file", SHARED_GPT2 if kind == "gpt2" else "unused")
    if kind == "gpt2":
        assert rc == 0 and flagged == carried, err
    else:  # a flag that would do nothing is one error line, not a silent no-op
        assert rc == 2 and "--tiktoken-file gives GPT-2 ranks, but this model's tokenizer is 'byte'" in err
    export = tmp_path / "outputs" / "run" / "export"  # checkpoint.export_at_end
    rc, exported, err = generate(capsys, export, *argv[1:])
    assert rc == 0 and exported == carried, err


def test_a_crafted_bpe_is_refused_in_seconds(tmp_path):
    """Ranks a stranger's checkpoint could carry: too long tokens, or too much merge work, are one line, fast."""
    import time

    singles = b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256))
    long_token = base64.b64encode(b"a" * (MAX_TOKEN_BYTES + 1)) + b" 300\n"
    with pytest.raises(UserError, match="is not a tokenizer torchnlq reads"):
        parse_ranks(singles + long_token, "crafted.tiktoken")
    # Many tokens just under the length limit: their merge recovery would take hours.
    many = b"".join(base64.b64encode(bytes([97 + i % 26]) * 200 + str(i).encode()) + b" %d\n" % (300 + i)
                    for i in range(2000))
    start = time.perf_counter()
    with pytest.raises(UserError, match="in sum of squared lengths"):
        parse_ranks(singles + many, "crafted.tiktoken")
    assert time.perf_counter() - start < 5


# ---------------------------------------------------------------- AutoTokenizer where torchnlq cannot be imported


def hf_json_vocab(folder: Path) -> Vocab:
    """An hf model's tokenizer: a byte-level BPE of 300 ids trained here by the tokenizers library (Llama 3's kind)."""
    from tokenizers import Tokenizer as FastTokenizer, decoders, models, pre_tokenizers, trainers

    from torchnlq.data.tokenizer import HFTokenizer

    tok = FastTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[ENDOFTEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TOY_CORPUS] * 4, trainer)
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    hf = HFTokenizer.from_file(folder / "tokenizer.json")
    return Vocab("hf", hf.describe(), hf, None)


@pytest.mark.integration  # transformers in a fresh process
def test_auto_tokenizer_loads_every_kind_without_torchnlq_or_remote_code(toy, tmp_path, monkeypatch):
    """Each tokenizer kind, exported as safetensors and as --format hf: AutoTokenizer.from_pretrained in a process
    where torchnlq cannot be imported, without remote code, encodes and decodes as torchnlq's tokenizer does."""
    import subprocess
    import sys

    from torchnlq.interop.hf_export import export_hf
    from helpers import WITHOUT_TORCHNLQ

    kinds = [make_vocab("byte", toy[0]), make_vocab("toy", toy[0]), hf_json_vocab(tmp_path / "hf-source")]
    if SHARED_GPT2.is_file():
        kinds.append(make_vocab("gpt2", toy[0]))
    folders: dict[str, Vocab] = {}
    for v in kinds:
        monkeypatch.setenv(TIKTOKEN_FILE_ENV, str(v.ranks_file or ""))
        model = tiny_model() if v.kind in ("byte", "hf") else model_for(v)
        kind = "export" if v.kind == "hf" else "test"  # an hf model's tokenizer.json comes from its source folder
        source = LoadedModel(model, model.args, v.desc, {}, tmp_path / "hf-source", kind)
        for fmt_name, export in (("safetensors", export_safetensors), ("hf", export_hf)):
            folders[str(export(source, tmp_path / f"{v.kind}-{fmt_name}"))] = v
    code = WITHOUT_TORCHNLQ + """
import json
from transformers import AutoTokenizer
text, out = sys.argv[1], {}
for folder in sys.argv[2:]:
    # --format hf's config.json names remote code for the model: False says no to it (AutoTokenizer asks otherwise).
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    ids = tok(text)["input_ids"]
    out[folder] = [ids, tok.decode(ids)]
assert not any(m.split(".")[0] == "torchnlq" for m in sys.modules), "torchnlq was imported"
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", TIKTOKEN_FILE_ENV)}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    # Beyond TEXT: long digit runs, whitespace runs before a newline and at the end, combining marks, full-width
    # letters, a ligature, zero-width and right-to-left characters.
    text = TEXT + "12345678901234 1,000,000.5e-3    \n\t\t  x a\u0301e\u0300 ＡＢＣ ﬁne \u200bא\u05d1 ، "
    text += "'S 'LL   "
    result = subprocess.run([sys.executable, "-c", code, text, *folders], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "custom code" not in result.stdout + result.stderr  # no question asked
    found = json.loads(result.stdout.strip().splitlines()[-1])
    for folder, v in folders.items():
        ids = v.tokenizer.encode(text)
        assert found[folder] == [ids, v.tokenizer.decode(ids)], folder
        assert v.tokenizer.decode(ids) == text
    assert len({v.kind for v in folders.values()}) == len(kinds)
