"""Any tokenizer (issue 21.4): a Hugging Face tokenizer.json through the tokenizers library, uint32 token files,
and the whole path with a vocabulary above 65,536 ids: prepare, train, export with the tokenizer, generate, evaluate.

The references are independent of torchnlq: the tokenizers library's own encode of the same file (and of a
variant without the special token), numpy reading the token files, transformers' AutoTokenizer on the export.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from torchnlq.config.job_config import Data
from torchnlq.data import token_format as fmt
from torchnlq.data.batches import open_token_files
from torchnlq.data.prepare import prepare_dataset
from torchnlq.data.token_file import TokenFile, read_batch
from torchnlq.data.tokenizer import HFTokenizer, build_tokenizer, padded_vocab_size
from torchnlq.errors import UserError
from torchnlq.interop.tokenizer_files import tokenizer_from_folder

from helpers import REPO_ROOT
from helpers.checkpoints import load_script
from helpers.data import isolate_env, split_docs, write_token_folder
from helpers.train import script_env, tiny_config

WORDS = 70_000  # above 65,536: the ids need uint32 files
EOT = "<|endoftext|>"


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    isolate_env(tmp_path, monkeypatch)


def word_level(path: Path, special: tuple[str, ...] = (EOT,), words: int = WORDS) -> Path:
    """A WordLevel tokenizer.json: ``w0`` .. ``w{words-1}``, ``[UNK]``, then the ``special`` tokens (added, special)."""
    vocab = {f"w{i}": i for i in range(words)} | {"[UNK]": words}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True) for s in special])
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """The 70,002-id WordLevel tokenizer.json (70,000 words, [UNK], <|endoftext|>), built once."""
    return word_level(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def llama_like_bpe(path: Path) -> Path:
    """A small byte-level BPE trained here, with Llama 3's special tokens and a template that prepends BOS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["the thing in the king's house", "nothing is sung in the thing", "ünïcödé"] * 20, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(str(path))
    return path


def random_text(seed: int, documents: int, words: int) -> list[str]:
    """Documents of words drawn from the whole vocabulary (most ids above 65,535)."""
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(WORDS)}" for _ in range(words)) for _ in range(documents)]


# ---------------------------------------------------------------------------- the tokenizer


def test_ids_are_the_tokenizers_librarys_own(big, tmp_path):
    ref = Tokenizer.from_file(str(big))
    tok = build_tokenizer("hf", tokenizer_file=str(big))
    assert isinstance(tok, HFTokenizer)
    assert tok.vocab_size == ref.get_vocab_size(with_added_tokens=True) > 65_536
    assert tok.eot_id == ref.token_to_id(EOT)
    for text in [*random_text(1, 5, 30), "w0 w65535 w65536 w69999", "an unknown word"]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids
    desc = tok.describe()
    assert desc == {"name": "hf", "vocab_size": ref.get_vocab_size(with_added_tokens=True),
                    "eot_id": ref.token_to_id(EOT), "eot_token": EOT,
                    "tokenizer_sha256": hashlib.sha256(big.read_bytes()).hexdigest()}
    # A byte-level BPE whose template adds BOS: the ordinary encoding adds nothing, and round-trips.
    bpe = llama_like_bpe(tmp_path / "bpe.json")
    ref_bpe, tok_bpe = Tokenizer.from_file(str(bpe)), HFTokenizer.from_file(bpe)
    text = "the king's thing, ünïcödé"
    assert ref_bpe.encode(text).ids[0] == ref_bpe.token_to_id("<|begin_of_text|>")  # the template's BOS...
    assert tok_bpe.encode(text) == ref_bpe.encode(text, add_special_tokens=False).ids  # ...is not added
    assert tok_bpe.decode(tok_bpe.encode(text)) == text
    assert (tok_bpe.eot_token, tok_bpe.eot_id) == ("<|end_of_text|>", ref_bpe.token_to_id("<|end_of_text|>"))


def test_special_token_text_in_a_document_is_plain_text(big, tmp_path):
    # The reference: the same vocabulary without the special token, where "<|endoftext|>" can only be a word.
    plain = Tokenizer.from_file(str(word_level(tmp_path / "plain.json", special=())))
    tok = HFTokenizer.from_file(big)
    text = f"w1 {EOT} w2 w70000"
    assert tok.encode(text) == plain.encode(text).ids
    assert tok.eot_id not in tok.encode(text)
    assert Tokenizer.from_file(str(big)).encode(text).ids.count(tok.eot_id) == 1  # the library's default would
    bpe = HFTokenizer.from_file(llama_like_bpe(tmp_path / "bpe.json"))
    text = "in the <|end_of_text|> house <|begin_of_text|>"
    ids = bpe.encode(text)
    assert bpe.eot_id not in ids and bpe.decode(ids) == text


def test_end_of_text_is_named_or_the_first_usual_one(tmp_path):
    both = word_level(tmp_path / "both.json", special=("</s>", "<|end_of_text|>"), words=10)
    assert HFTokenizer.from_file(both).eot_token == "<|end_of_text|>"  # earlier in the list than </s>
    named = HFTokenizer.from_file(both, "</s>")
    assert (named.eot_token, named.eot_id) == ("</s>", Tokenizer.from_file(str(both)).token_to_id("</s>"))
    assert HFTokenizer.from_file(both, "w3").eot_id == 3  # any token of the vocabulary may separate documents
    with pytest.raises(UserError, match="end-of-text token '<eos>' is not in the vocabulary of .*set data.eot_token"):
        HFTokenizer.from_file(both, "<eos>")
    none = word_level(tmp_path / "none.json", special=("<sep>",), words=10)
    with pytest.raises(UserError, match="has none of the end-of-text tokens .*name its document separator"):
        HFTokenizer.from_file(none)


@pytest.mark.parametrize("content,fragment", [
    (b"{oops", "is not a tokenizer.json the tokenizers library reads"),
    (b'{"version": "1.0"}', "is not a tokenizer.json the tokenizers library reads"),
    (b"\xff\xfe not text", "not UTF-8 text"),
    (b"[" * 100_000 + b"]" * 100_000, "is not a tokenizer.json the tokenizers library reads"),  # nesting bounded
])
def test_a_bad_file_is_one_line(tmp_path, content, fragment):
    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(content)
    with pytest.raises(UserError, match=fragment) as e:
        HFTokenizer.from_file(bad)
    assert "\n" not in str(e.value)


def test_missing_folder_and_oversized_files_are_refused_before_parsing(tmp_path, monkeypatch, big):
    with pytest.raises(UserError, match="does not exist; point data.tokenizer_file"):
        HFTokenizer.from_file(tmp_path / "nope.json")
    with pytest.raises(UserError, match="is a folder, not a tokenizer.json; name the file itself"):
        HFTokenizer.from_file(big.parent)
    monkeypatch.setattr("torchnlq.data.tokenizer.MAX_TOKENIZER_JSON_BYTES", big.stat().st_size - 1)
    with pytest.raises(UserError, match="more than a tokenizer.json torchnlq reads"):
        HFTokenizer.from_file(big)
    with pytest.raises(UserError, match="set data.tokenizer_file"):
        build_tokenizer("hf")


def test_ids_with_holes_size_the_vocabulary_by_the_largest_and_huge_ids_are_refused(tmp_path):
    holes = tmp_path / "holes.json"
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1, EOT: 5}, unk_token="[UNK]")).save(str(holes))
    ref = Tokenizer.from_file(str(holes))
    assert ref.get_vocab_size(with_added_tokens=True) == 3  # the library counts the ids it has...
    assert HFTokenizer.from_file(holes).vocab_size == max(ref.get_vocab().values()) + 1  # ...an embedding needs all
    huge = tmp_path / "huge.json"
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1, EOT: 2**24}, unk_token="[UNK]")).save(str(huge))
    with pytest.raises(UserError, match="gives a token id 16,777,216; torchnlq sizes models for ids below 16,777,216"):
        HFTokenizer.from_file(huge)


def test_a_pickled_copy_needs_no_file(tmp_path, big):
    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(big.read_bytes())
    tok = HFTokenizer.from_file(copy)
    data = pickle.dumps(tok)  # what datasets' map(num_proc) sends to its workers
    copy.unlink()
    again = pickle.loads(data)
    text = random_text(2, 1, 20)[0]
    assert again.encode(text) == Tokenizer.from_file(str(big)).encode(text, add_special_tokens=False).ids
    assert again.describe() == tok.describe()


def test_the_model_vocabulary_is_read_from_the_file(big, tmp_path):
    n = Tokenizer.from_file(str(big)).get_vocab_size(with_added_tokens=True)
    for multiple in (1, 64, 128):
        padded = padded_vocab_size("hf", multiple, str(big))
        assert padded % multiple == 0 and n <= padded < n + multiple
    with pytest.raises(UserError, match="set data.tokenizer_file"):
        padded_vocab_size("hf", 64)
    # A changed file (another size) is read again, not answered from the cache.
    small = word_level(tmp_path / "t.json", words=100)
    assert padded_vocab_size("hf", 1, str(small)) == 102
    word_level(small, words=200)
    assert padded_vocab_size("hf", 1, str(small)) == 202


# ---------------------------------------------------------------------------- uint32 token files


def test_uint32_files_round_trip_and_uint16_folders_still_read(tmp_path):
    ids = np.array([0, 65_535, 65_536, 70_001, 4_000_000_000, 7], dtype=np.int64)
    path = tmp_path / "train.bin"
    assert fmt.write_tokens(path, len(ids), [ids[:3], ids[3:]], "uint32") == 4_000_000_000
    assert np.array_equal(np.fromfile(path, dtype="<u4"), ids)  # numpy's reading of the file
    tf = TokenFile(path, fmt.token_dtype({"dtype": "uint32"}, "meta.json"))
    x, y = read_batch(tf, torch.tensor([0, 2]), 3)
    assert x.tolist() == [ids[0:3].tolist(), ids[2:5].tolist()] and y.tolist() == [ids[1:4].tolist(), ids[3:6].tolist()]
    with pytest.raises(RuntimeError, match="does not fit uint16"):  # never wrapped into another id
        fmt.write_tokens(tmp_path / "u16.bin", 3, [np.array([1, 70_000, 2])], "uint16")
    assert (fmt.dtype_for_vocab(65_536), fmt.dtype_for_vocab(65_537)) == ("uint16", "uint32")
    # A folder from before the dtype was recorded (or a nanoGPT one) holds uint16.
    old = write_token_folder(tmp_path / "old", np.arange(100) % 250, np.arange(50) % 250)
    meta = json.loads((old / "meta.json").read_text())
    meta.pop("dtype")
    (old / "meta.json").write_text(json.dumps(meta))
    train, val, _ = open_token_files(Data(path=str(old), tokenizer="byte"), 8)
    assert train.tokens.dtype == np.dtype("<u2") and train.tokens.tolist() == (np.arange(100) % 250).tolist()
    meta["dtype"] = "float16"
    (old / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="records token dtype 'float16'; torchnlq reads uint16 or uint32"):
        open_token_files(Data(path=str(old), tokenizer="byte"), 8)


def prepare(out: Path, tokenizer_file: Path, documents: list[str], tmp_path: Path, **kw) -> dict:
    text = tmp_path / f"{out.name}.txt"
    text.write_text("\n\n".join(documents) + "\n")
    return prepare_dataset(out, files=[str(text)], text_split="paragraph", tokenizer="hf",
                           tokenizer_file=str(tokenizer_file), val_fraction=0.1, **kw)


def test_prepare_writes_uint32_ids_that_are_the_tokenizers(tmp_path, big):
    documents = random_text(3, 30, 40) + [f"w5 {EOT} w6"]
    out = tmp_path / "data"
    meta = prepare(out, big, documents, tmp_path)
    written = json.loads((out / "meta.json").read_text())
    assert written["dtype"] == meta["dtype"] == "uint32"
    ref = Tokenizer.from_file(str(big))
    eot = ref.token_to_id(EOT)
    assert (written["tokenizer"], written["vocab_size"], written["eot_id"]) == (
        "hf", ref.get_vocab_size(with_added_tokens=True), eot)
    assert written["tokenizer_info"]["tokenizer_sha256"] == hashlib.sha256(big.read_bytes()).hexdigest()
    assert_files_hold_the_tokenizers_ids(out, documents, tmp_path)


def assert_files_hold_the_tokenizers_ids(out: Path, documents: list[str], tmp_path: Path) -> None:
    """numpy's reading of train.bin + val.bin, cut at the eot id, is the library's encode of every document."""
    written = json.loads((out / "meta.json").read_text())
    found = []
    for split in ("train", "val"):
        tokens = np.fromfile(out / f"{split}.bin", dtype="<u4")
        assert len(tokens) == written["tokens"][split] and int(tokens.max()) == written["max_token_id"][split]
        found += split_docs(tokens, written["eot_id"])
    plain = Tokenizer.from_file(str(word_level(tmp_path / "plain.json", special=())))  # eot text as plain text
    assert sorted(found) == sorted(plain.encode(d).ids for d in documents)
    assert max(map(max, found)) > 65_535


def test_data_of_another_tokenizer_json_or_end_of_text_is_refused(tmp_path, big):
    out = tmp_path / "data"
    prepare(out, big, random_text(4, 20, 10), tmp_path)
    ok = Data(path=str(out), tokenizer="hf", tokenizer_file=str(big))
    assert open_token_files(ok, 8)[0].tokens.dtype == np.dtype("<u4")
    edited = tmp_path / "edited.json"
    word_level(edited, words=WORDS - 1)
    with pytest.raises(UserError, match="tokenized with a tokenizer.json of sha256 .* but data.tokenizer_file"):
        open_token_files(Data(path=str(out), tokenizer="hf", tokenizer_file=str(edited)), 8)
    with pytest.raises(UserError, match="separates documents with '<\\|endoftext\\|>' .* but data.eot_token is 'w1'"):
        open_token_files(Data(path=str(out), tokenizer="hf", tokenizer_file=str(big), eot_token="w1"), 8)


def test_a_hugging_face_folder_gives_its_tokenizer(tmp_path, big):
    folder = tmp_path / "llama"
    folder.mkdir()
    word_level(folder / "tokenizer.json", special=("<|end_of_text|>", "<|eot_id|>"), words=50)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot_id|>"}))
    tok = tokenizer_from_folder(folder)
    ref = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert isinstance(tok, HFTokenizer) and tok.eot_id == ref.token_to_id("<|eot_id|>")  # the folder's own eos
    assert tok.encode("w1 w49 w50") == ref.encode("w1 w49 w50", add_special_tokens=False).ids
    (folder / "tokenizer_config.json").unlink()
    assert tokenizer_from_folder(folder).eot_token == "<|end_of_text|>"
    recorded = HFTokenizer.from_file(big).describe()  # a model trained with another file
    with pytest.raises(UserError, match="not the tokenizer.json the model was trained with"):
        tokenizer_from_folder(folder, recorded)


# ---------------------------------------------------------------------------- end to end


@pytest.mark.integration  # a training run, an export, generate.py in a process
def test_prepare_train_export_generate_evaluate(tmp_path, big, capsys):
    from transformers import AutoTokenizer

    from torchnlq.inference.evaluation import evaluate_source
    from torchnlq.inference.sampling import generate_text
    from torchnlq.interop.load import load_model
    from torchnlq.train.trainer import Trainer

    data = tmp_path / "data"
    documents = random_text(5, 60, 50)
    prepare(data, big, documents, tmp_path, num_proc=2)  # the tokenizer pickled into datasets' worker processes
    assert_files_hold_the_tokenizers_ids(data, documents, tmp_path)
    cfg = tiny_config(tmp_path, "hf", steps=4, data__path=data, data__synthetic=False, data__tokenizer="hf",
                      data__tokenizer_file=big, validation__interval=2, checkpoint__interval=2)
    trainer = Trainer(cfg)
    trainer.train()
    ckpt = tmp_path / "outputs" / "hf" / "checkpoints" / "step-4"
    ref = Tokenizer.from_file(str(big))
    n_ids = ref.get_vocab_size(with_added_tokens=True)
    assert (ckpt / "tokenizer.json").read_bytes() == big.read_bytes()  # the checkpoint carries the file
    loaded = load_model(ckpt)
    assert loaded.args.vocab_size == padded_vocab_size("hf", cfg.model.vocab_multiple, str(big)) >= n_ids

    export = tmp_path / "export"
    assert load_script("convert_checkpoint").main([str(ckpt), str(export), "--format", "safetensors"]) == 0
    assert (export / "tokenizer.json").read_bytes() == big.read_bytes()
    auto = AutoTokenizer.from_pretrained(str(export))
    text = random_text(6, 1, 25)[0]
    assert auto.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False).ids
    assert auto.eos_token_id == ref.token_to_id(EOT)

    # Evaluation of the export: the run's own last validation loss (same windows, same weights).
    result = evaluate_source(export, data)
    assert result.val_loss == pytest.approx(trainer.last_val_loss, rel=1e-5)

    # Sampling from the checkpoint: the new ids are the vocabulary's words, joined as the file's decoder does.
    text, gen = generate_text(ckpt, "w1 w70000", max_new_tokens=6, temperature=1.0, seed=3)
    assert 0 < len(gen.new_tokens) and all(0 <= i < n_ids for i in gen.new_tokens)
    assert text == " ".join(["w1", "w70000"] + [ref.id_to_token(i) for i in gen.new_tokens])
    # generate.py in a process, on the export: greedy, so the same text as in this process.
    greedy, _ = generate_text(export, "w1 w2", max_new_tokens=4, temperature=0)
    r = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "generate.py"), str(export), "--prompt", "w1 w2",
                        "--max-new-tokens", "4", "--temperature", "0"],
                       capture_output=True, text=True, env=script_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == greedy

    # A checkpoint that lost its tokenizer.json says so, in one line.
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(UserError, match="tokenizer.json .* does not carry; copy the file the model was trained with"):
        generate_text(ckpt, "w1", max_new_tokens=1)
