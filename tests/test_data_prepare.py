"""scripts/prepare_data.py and torchnlq.data.prepare: files -> train.bin, val.bin, meta.json; the report of
what was made; paragraphs separated by whitespace-only lines (WikiText); adopting nanoGPT folders."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from torchnlq.config.job_config import Data
from torchnlq.data import token_format as fmt
from torchnlq.data.batches import open_token_files
from torchnlq.data.prepare import prepare_dataset
from torchnlq.data.tokenizer import build_tokenizer
from torchnlq.errors import UserError

from helpers import REPO_ROOT, SHARED_DATA
from helpers.checkpoints import load_script
from helpers.data import R50K_URL, SHAKESPEARE, SHARED_GPT2, isolate_env, needs_gpt2, split_docs, write_toy_tiktoken
from helpers.train import tiny_config

WIKITEXT = SHARED_DATA / "wikitext2-valid.txt"

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
    written = json.loads((out / "meta.json").read_text())
    assert {k: v for k, v in written.items() if k != "files"} == meta
    for split in ("train", "val"):  # each file's identity, against a hash and a stat taken here
        path = fmt.split_file(out, split)
        assert written["files"][split] == {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                                           "bytes": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
    first = {s: fmt.split_file(out, s).read_bytes() for s in ("train", "val")}

    # Re-run (a previous token folder: needs overwrite): same bytes, no temporary files.
    prepare_dataset(out, **kw, overwrite=True)
    assert {s: fmt.split_file(out, s).read_bytes() for s in ("train", "val")} == first
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    complete = json.loads((out / "meta.json").read_text())

    # Interrupted run: the previous complete files stay, temporaries are removed.
    real_write = fmt.write_tokens

    def interrupted(path, total, chunks, *dtype):
        real_write(path, total, chunks, *dtype)
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
    assert json.loads((out / "meta.json").read_text()) == complete  # the previous complete folder, as it was


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
    # Above 65,536 ids the files are uint32 (tests/test_tokenizer_json.py); only numpy's uint32 range is refused.
    with pytest.raises(UserError, match="does not fit the uint32"):
        fmt.check_vocab_fits(int(np.iinfo(np.uint32).max) + 2)
    fmt.check_vocab_fits(int(np.iinfo(np.uint32).max) + 1)  # ids 0..2**32-1 fit


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
    expected = sorted(ref.encode_ordinary(p) for p in reference_paragraphs(text))
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


# ---------------------------------------------------------------- paragraphs, the report


def reference_paragraphs(text: str) -> list[str]:
    """Paragraphs by an independent rule: cut at every run of lines holding nothing but whitespace.

    ``\\n\\s*\\n`` spans any number of blank or whitespace-only lines (``\\s`` matches newlines too), and
    ``\\A\\s*\\n`` those at the start of the text; a paragraph ends at its last character (a file's final
    line break is not part of it).
    """
    pieces = [p.removesuffix("\n") for p in re.split(r"(?:\A|\n)\s*\n", text)]
    return [p for p in pieces if p.strip()]


# WikiText's raw layout: every line starts with a space, and the blank lines are " \n", not "\n".
WIKI_LIKE = (
    " \n = Valkyria Chronicles = \n \n Senjō no Valkyria is a tactical role @-@ playing game . \n \n"
    " = = Gameplay = = \n \n As with previous games , the player commands a squad . \n"
    " A second line of the same paragraph . \n \n \n"
    " = = Plot = = \n  \t \n The story follows Welkin Gunther . \n \n"
    " = Tower Building of the Little Rock Arsenal = \n \n The building was built in 1840 . \n"
)


def per_split_reference(out: Path, tok, files: dict[str, str]) -> dict[str, dict[str, dict[str, int]]]:
    """{file: {"documents"|"tokens": {split: n}}} computed from the input texts and the tokenizer.

    Which split a document went to is random (seeded); it is read from the token files, matching each
    decoded document to the paragraph it was made from (every paragraph in these inputs is unique).
    """
    origin = {p: name for name, text in files.items() for p in reference_paragraphs(text)}
    assert len(origin) == sum(len(reference_paragraphs(t)) for t in files.values()), "paragraphs must be unique"
    counts = {name: {"documents": {"train": 0, "val": 0}, "tokens": {"train": 0, "val": 0}} for name in files}
    seen = []
    for split in ("train", "val"):
        for doc in split_docs(read_split(out, split), tok.eot_id):
            text = tok.decode(doc)
            counts[origin[text]]["documents"][split] += 1
            counts[origin[text]]["tokens"][split] += len(tok.encode(text)) + 1  # + its eot id
            seen.append(text)
    assert sorted(seen) == sorted(origin)
    return counts


def parse_report(stdout: str) -> dict[str, list[int]]:
    """The report's table: {input: [train documents, train tokens, val documents, val tokens]}."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("input "))
    assert lines[start].split()[1:] == ["train", "documents", "train", "tokens", "val", "documents", "val", "tokens"]
    table = {}
    for line in lines[start + 1:]:
        parts = line.split()
        if len(parts) != 5 or not all(re.fullmatch(r"[\d,]+", p) for p in parts[1:]):
            break
        table[parts[0]] = [int(p.replace(",", "")) for p in parts[1:]]
    return table


def test_paragraphs_are_separated_by_whitespace_only_lines(tmp_path):
    src = tmp_path / "wiki.txt"
    src.write_text(WIKI_LIKE)
    expected = reference_paragraphs(WIKI_LIKE)
    assert len(expected) == 8 and expected[0] == " = Valkyria Chronicles = "  # the reference itself
    out = tmp_path / "wiki"
    meta = prepare_dataset(out, files=[str(src)], text_split="paragraph", tokenizer="byte", val_fraction=0.25)
    docs = {s: [bytes(d).decode() for d in split_docs(read_split(out, s), 256)] for s in ("train", "val")}
    assert sorted(docs["train"] + docs["val"]) == sorted(expected)
    assert len(docs["train"]) == 6 and len(docs["val"]) == 2  # ceil(0.25 * 8) = 2 validation paragraphs
    assert meta["documents"] == {"train": 6, "val": 2}


def test_a_file_without_blank_lines_stays_one_paragraph(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "b.txt").write_text("\n\n  three\r\n\t\r\nfour")  # \r\n line ends, a whitespace-only line
    out = tmp_path / "o"
    prepare_dataset(out, files=[str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], text_split="paragraph",
                    tokenizer="byte", val_fraction=0.3)
    docs = sorted(bytes(d).decode() for s in ("train", "val") for d in split_docs(read_split(out, s), 256))
    assert docs == ["  three", "four", "one\ntwo"]


@pytest.mark.integration  # scripts/prepare_data.py in a subprocess (datasets, two files)
def test_cli_reports_documents_and_tokens_per_file_and_split(tmp_path):
    files = {
        "wiki.txt": WIKI_LIKE,
        "notes.txt": "".join(f"note {i}: {'many words ' * i}end\n\n" for i in range(1, 12)),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "tokens"
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"), "--out", str(out), "--files", *files,
         "--text-split", "paragraph", "--tokenizer", "byte", "--val-fraction", "0.2"],
        check=False, capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(f"wrote {out}: train.bin, val.bin, meta.json (tokenizer byte)")
    tok = build_tokenizer("byte")
    want = per_split_reference(out, tok, files)
    table = parse_report(r.stdout)
    assert list(table) == ["wiki.txt", "notes.txt", "total"]
    for name in files:
        c = want[name]
        assert table[name] == [c["documents"]["train"], c["tokens"]["train"], c["documents"]["val"], c["tokens"]["val"]]
        assert c["documents"]["train"] and c["documents"]["val"] or name == "wiki.txt"
    totals = [sum(table[n][i] for n in files) for i in range(4)]
    assert table["total"] == totals
    all_tokens = sum(len(tok.encode(p)) + 1 for t in files.values() for p in reference_paragraphs(t))
    assert totals[1] + totals[3] == all_tokens == sum(os.path.getsize(fmt.split_file(out, s)) // 2 for s in ("train", "val"))
    n_docs = sum(len(reference_paragraphs(t)) for t in files.values())
    assert f"{n_docs:,} documents, {all_tokens:,} tokens in all" in r.stdout
    # The same counts in meta.json, per file (resolved paths); the folder still opens for training.
    per_file = json.loads((out / "meta.json").read_text())["source"]["per_file"]
    assert [(Path(f["file"]).name, f["documents"], f["tokens"]) for f in per_file] == [
        (n, want[n]["documents"], want[n]["tokens"]) for n in files]
    open_token_files(Data(path=str(out), tokenizer="byte"), seq_len=8)


def test_report_of_jsonl_files_counts_each_file(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"body": f"alpha {i}"}) + "\n" for i in range(6)))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"body": f"beta record {i}"}) + "\n" for i in range(4))
                                      + json.dumps({"body": "  "}) + "\n")  # dropped: no text
    (tmp_path / "empty.jsonl").write_text("")  # first: datasets infers the columns from the first file with data
    from torchnlq.data.prepare import format_report

    out = tmp_path / "j"
    meta = prepare_dataset(out, files=[str(tmp_path / n) for n in ("empty.jsonl", "a.jsonl", "b.jsonl")],
                           text_field="body", tokenizer="byte", val_fraction=0.2)
    docs = {s: [bytes(d).decode() for d in split_docs(read_split(out, s), 256)] for s in ("train", "val")}
    empty, *others = meta["source"]["per_file"]
    assert empty["documents"] == empty["tokens"] == {"train": 0, "val": 0}
    for entry, prefix in zip(others, ("alpha", "beta")):
        for split in ("train", "val"):
            mine = [d for d in docs[split] if d.startswith(prefix)]
            assert entry["documents"][split] == len(mine)
            assert entry["tokens"][split] == sum(len(d.encode()) + 1 for d in mine)
    assert sum(e["documents"]["train"] + e["documents"]["val"] for e in meta["source"]["per_file"]) == 10
    table = parse_report(format_report(meta, out))
    # The first column is the path relative to the working directory or absolute, whichever is shorter:
    # resolve it from the working directory to find the row of each file.
    rows = {str((Path.cwd() / name).resolve()): counts for name, counts in table.items() if name != "total"}
    assert rows[str((tmp_path / "empty.jsonl").resolve())] == [0, 0, 0, 0]
    assert table["total"] == [meta["documents"]["train"], meta["tokens"]["train"], meta["documents"]["val"],
                              meta["tokens"]["val"]]


def test_report_of_a_hub_dataset_is_one_row():
    from torchnlq.data.prepare import format_report

    tok = {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    meta = fmt.make_meta(tok, {"train": 9_035_582_489, "val": 4_434_606}, {"train": 8_009_762, "val": 4_007},
                         {"kind": "huggingface", "dataset": "openwebtext", "config": None})
    lines = format_report(meta, "data/openwebtext").splitlines()
    assert lines[0] == "wrote data/openwebtext: train.bin, val.bin, meta.json (tokenizer gpt2)"
    assert parse_report("\n".join(lines)) == {
        "openwebtext": [8_009_762, 9_035_582_489, 4_007, 4_434_606],
        "total": [8_009_762, 9_035_582_489, 4_007, 4_434_606],
    }
    assert lines[-1] == "8,013,769 documents, 9,040,017,095 tokens in all (each document's tokens include the eot id after it)"


@pytest.mark.integration  # the real WikiText-2 file and GPT-2 ranks, end to end
@needs_gpt2
@pytest.mark.skipif(not WIKITEXT.is_file(), reason="../shared/data/wikitext2-valid.txt not present")
def test_real_wikitext_becomes_many_documents_in_both_splits(tmp_path):
    import tiktoken

    out = tmp_path / "wikitext"
    meta = prepare_dataset(out, files=[str(WIKITEXT)], text_split="paragraph", tiktoken_file=str(SHARED_GPT2),
                           val_fraction=0.05)
    shutil.copy(SHARED_GPT2, tmp_path / "tiktoken" / hashlib.sha1(R50K_URL.encode()).hexdigest())
    ref = tiktoken.get_encoding("r50k_base")
    text = WIKITEXT.read_text()
    expected = sorted(ref.encode_ordinary(p) for p in reference_paragraphs(text))
    assert len(expected) > 1000  # headings and paragraphs, not one document for the whole file
    got = {s: split_docs(read_split(out, s), 50256) for s in ("train", "val")}
    assert len(got["train"]) > 1000 and len(got["val"]) == -(-len(expected) * 5 // 100)
    assert sorted(got["train"] + got["val"]) == expected
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == sum(len(d) + 1 for d in expected)


# ---------------------------------------------------------------- adopting a nanoGPT folder

prepare_script = load_script("prepare_data")


def write_nanogpt_folder(folder: Path, docs: dict[str, int], seed: int = 0, eot: int = 50256,
                         vocab: int = 50257) -> dict[str, np.ndarray]:
    """A folder as nanoGPT's prepare.py leaves it: uint16 ids via np.memmap, each document followed by eot.

    ``docs``: documents per split. Also a meta.pkl whose unpickling would create ``PICKLE_RAN``
    beside it: adoption must never load it.
    """
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in docs.items():
        ids = np.concatenate([np.r_[rng.integers(0, eot, rng.integers(5, 60)), eot] for _ in range(n)])
        arr = np.memmap(folder / f"{split}.bin", dtype=np.uint16, mode="w+", shape=ids.shape)
        arr[:] = ids
        arr.flush()
        arrays[split] = ids
    (folder / "meta.pkl").write_bytes(pickle.dumps(_TouchWhenUnpickled(folder / "PICKLE_RAN")))
    return arrays


class _TouchWhenUnpickled:
    """Unpickling this creates a file: proof that a meta.pkl was (or was not) loaded."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def adopt_cli(*argv: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """prepare_data.py's main in-process, through run_cli (one ``error:`` line and exit 2 on a mistake)."""
    from torchnlq.cli import run_cli as entry

    code = entry(prepare_script.main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.integration  # the whole trainer, two steps on the adopted folder
def test_adopt_a_nanogpt_folder_then_train_two_steps(tmp_path, capsys):
    folder = tmp_path / "owt"
    arrays = write_nanogpt_folder(folder, {"train": 40, "val": 12})
    bins = {s: fmt.split_file(folder, s).read_bytes() for s in ("train", "val")}
    code, out, err = adopt_cli("--adopt", str(folder), capsys=capsys)
    assert code == 0, err
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "meta.pkl", "train.bin", "val.bin"]
    assert {s: fmt.split_file(folder, s).read_bytes() for s in ("train", "val")} == bins  # used as they are

    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_id"], meta["dtype"]) == ("gpt2", 50257, 50256, "uint16")
    assert meta["tokens"] == {"train": len(arrays["train"]), "val": len(arrays["val"])}
    assert meta["documents"] == {"train": 40, "val": 12}
    assert meta["max_token_id"] == {s: int(a.max()) for s, a in arrays.items()}
    assert meta["source"]["kind"] == "nanogpt" and meta["source"]["ignored"] == ["meta.pkl"]
    # The report: tokens and documents per split and in total, and the note about meta.pkl.
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[2:5]}
    assert rows == {"train": [f"{len(arrays['train']):,}", "40"], "val": [f"{len(arrays['val']):,}", "12"],
                    "total": [f"{len(arrays['train']) + len(arrays['val']):,}", "52"]}
    assert "note: meta.pkl ignored: never unpickled" in out
    assert not (folder / "PICKLE_RAN").exists()

    cfg = tiny_config(tmp_path, "adopted", steps=2, data__path=folder, data__tokenizer="gpt2", data__synthetic=False,
                      validation__interval=2, lr_schedule__warmup_steps=1, checkpoint__enabled=False)
    from torchnlq.train.trainer import Trainer

    Trainer(cfg).train()
    info = json.loads((tmp_path / "outputs" / "adopted" / "run_info.json").read_text())
    assert info["step"] == 2 and info["finished"] and np.isfinite(info["last_val_loss"])
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "meta.pkl", "train.bin", "val.bin"]


def test_adopt_with_overwrite_replaces_only_meta_json(tmp_path, capsys):
    folder = tmp_path / "bytes"
    folder.mkdir()
    train, val = list(b"hello world"), list(b"bye")
    np.r_[train, 256, train, 256].astype(np.uint16).tofile(folder / "train.bin")
    np.r_[val, 256].astype(np.uint16).tofile(folder / "val.bin")
    (folder / "meta.json").write_text("{}")
    code, out, _ = adopt_cli("--adopt", str(folder), "--tokenizer", "byte", "--overwrite", capsys=capsys)
    assert code == 0 and "note:" not in out
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["tokenizer"], meta["tokens"], meta["documents"]) == ("byte", {"train": 24, "val": 4},
                                                                      {"train": 2, "val": 1})
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]
    train_f, val_f, _ = open_token_files(Data(path=str(folder), tokenizer="byte"), seq_len=3)
    assert len(train_f) == 24 and len(val_f) == 4


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its sha256, every folder by name: what a refusal must leave unchanged."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _ok_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "nano"
    write_nanogpt_folder(folder, {"train": 3, "val": 2})
    return folder


ADOPT_MISTAKES = [
    # (name, set-up on the good folder, extra argv, fragment of the error line)
    ("missing-val-bin", lambda f: (f / "val.bin").unlink(), [], "has no val.bin"),
    ("missing-both", lambda f: [(f / n).unlink() for n in ("train.bin", "val.bin")], [], "has no train.bin and no val.bin"),
    ("has-meta-json", lambda f: (f / "meta.json").write_text("{}"), [], "already has a meta.json"),
    ("odd-size", lambda f: (f / "train.bin").write_bytes(b"\0\0\0"), [], "has an odd size (3 bytes)"),
    ("empty-split", lambda f: (f / "val.bin").write_bytes(b""), [], "val.bin' is empty (0 tokens)"),
    ("ids-above-byte-vocabulary", lambda f: None, ["--tokenizer", "byte"], "but the byte tokenizer has only 257 ids"),
    ("ids-above-gpt2-vocabulary", lambda f: (f / "val.bin").write_bytes(np.array([7, 60000], np.uint16).tobytes()),
     [], "holds token id 60000, but the gpt2 tokenizer has only 50257 ids"),
    ("with-out", lambda f: None, ["--out", "elsewhere"], "--adopt and --out exclude each other"),
    ("with-files", lambda f: None, ["--files", "a.txt"], "--files does not apply to --adopt"),
    ("with-val-fraction", lambda f: None, ["--val-fraction", "0.1"], "--val-fraction does not apply to --adopt"),
]


@pytest.mark.parametrize("name, setup, extra, fragment", ADOPT_MISTAKES, ids=[m[0] for m in ADOPT_MISTAKES])
def test_adopt_refusals_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, name, setup, extra, fragment):
    folder = _ok_folder(tmp_path)
    setup(folder)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = adopt_cli("--adopt", str(folder), *extra, capsys=capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
    assert snapshot(tmp_path) == before


def test_adopt_refuses_what_is_not_a_folder_and_needs_out_or_adopt(tmp_path, capsys, monkeypatch):
    (tmp_path / "file.bin").write_bytes(b"\0\0")
    folder = _ok_folder(tmp_path)
    monkeypatch.chdir(folder)  # a nanoGPT folder, but the working directory: never written into
    before = snapshot(tmp_path)
    for argv, fragment in (
        (["--adopt", str(tmp_path / "nowhere")], "does not exist"),
        (["--adopt", str(tmp_path / "file.bin")], "is not a folder"),
        (["--tokenizer", "byte"], "one of --out (tokenize into a new folder) or --adopt"),
        (["--adopt", "."], "--adopt '.' is the current directory, the home folder or a parent of one"),
        (["--adopt", ".."], "--adopt '..' is the current directory"),
    ):
        code, _, err = adopt_cli(*argv, capsys=capsys)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert snapshot(tmp_path) == before
