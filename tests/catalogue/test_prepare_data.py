"""The catalogue's rows of ``python scripts/prepare_data.py`` (also ``--adopt``).

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from catalogue.rows import BYTES_300, Inputs, Mistake, both, folders, row, token_folder, tokenizer_json, write
from catalogue.runner import Launches, check_in_process, check_in_subprocess

#: Two text documents for prepare_data.py, enough for a train and a validation split.
DOCS = {"src/a.txt": "the first document", "src/b.txt": "the second document"}
NANO = {"nano/train.bin": bytes(100), "nano/val.bin": bytes(100)}
#: prepare_data.py into a new folder with the byte tokenizer (no download, no tiktoken file).
PREPARE = ("--out", "{tmp}/tokens", "--tokenizer", "byte")

IN_PROCESS = [
    row("prepare_data.py", "adopt-folder-missing", ["--adopt", "{tmp}/nowhere"], "--adopt '{tmp}/nowhere' does not exist"),
    row("prepare_data.py", "adopt-not-a-folder", ["--adopt", "{tmp}/src/a.txt"], "is not a folder", setup=write(DOCS)),
    row("prepare_data.py", "adopt-without-val-bin", ["--adopt", "{tmp}/nano"], "--adopt '{tmp}/nano' has no val.bin",
        setup=write({"nano/train.bin": bytes(100)})),
    row("prepare_data.py", "adopt-folder-with-meta-json", ["--adopt", "{tmp}/tokens", "--tokenizer", "byte"],
        "already has a meta.json", setup=token_folder("tokens")),
    row("prepare_data.py", "adopt-meta-json-is-a-folder", ["--adopt", "{tmp}/nano", "--overwrite"],
        "holds a folder named meta.json", setup=both(write(NANO), folders("nano/meta.json"))),
    row("prepare_data.py", "adopt-odd-size", ["--adopt", "{tmp}/odd"], "has an odd size (3 bytes)",
        setup=write({"odd/train.bin": b"\0\0\0", "odd/val.bin": b"\0\0"})),
    row("prepare_data.py", "adopt-empty-split", ["--adopt", "{tmp}/empty"], "val.bin' is empty (0 tokens)",
        setup=write({"empty/train.bin": b"\0\0", "empty/val.bin": b""})),
    row("prepare_data.py", "adopt-ids-above-the-vocabulary", ["--adopt", "{tmp}/big", "--tokenizer", "byte"],
        "holds token id 300, but the byte tokenizer has only 257 ids",
        setup=write({"big/train.bin": BYTES_300.tobytes(), "big/val.bin": BYTES_300.tobytes()})),
    row("prepare_data.py", "adopt-the-working-directory", ["--adopt", "."],
        "--adopt '.' is the current directory, the home folder or a parent of one"),
    row("prepare_data.py", "adopt-and-out", ["--adopt", "{tmp}/nano", "--out", "{tmp}/tokens"],
        "--adopt and --out exclude each other", setup=write(NANO)),
    row("prepare_data.py", "adopt-with-files", ["--adopt", "{tmp}/nano", "--files", "{tmp}/src/a.txt"],
        "--files does not apply to --adopt", setup=write({**NANO, **DOCS})),
    row("prepare_data.py", "adopt-with-text-split", ["--adopt", "{tmp}/nano", "--text-split", "line"],
        "--text-split does not apply to --adopt", setup=write(NANO)),
    row("prepare_data.py", "adopt-unknown-tokenizer", ["--adopt", "{tmp}/nano", "--tokenizer", "bpe"],
        "invalid choice: 'bpe'", setup=write(NANO)),
    row("prepare_data.py", "adopt-without-a-folder", ["--adopt"], "argument --adopt: expected one argument"),
    row("prepare_data.py", "out-not-given", ["--files", "{tmp}/src/a.txt", "--tokenizer", "byte"], "--out",
        setup=write(DOCS)),
    row("prepare_data.py", "unknown-tokenizer", ["--out", "{tmp}/tokens", "--tokenizer", "bpe"], "bpe"),
    row("prepare_data.py", "input-file-missing", [*PREPARE, "--files", "{tmp}/src/missing.txt"],
        "input file(s) not found: {tmp}/src/missing.txt", setup=write(DOCS)),
    row("prepare_data.py", "input-is-a-folder", [*PREPARE, "--files", "{tmp}/src"], "--files names a folder: {tmp}/src",
        setup=write(DOCS)),
    row("prepare_data.py", "input-file-twice", [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/./a.txt"],
        "input file(s) given more than once: {tmp}/src/a.txt", setup=write(DOCS)),
    row("prepare_data.py", "json-and-text-mixed", [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/r.jsonl"],
        "--files mixes JSON/JSONL and plain text files", setup=write({**DOCS, "src/r.jsonl": '{"text": "x"}\n'})),
    row("prepare_data.py", "text-field-for-text-files", [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt",
                                                        "--text-field", "body"],
        "--text-field 'body' applies to JSON/JSONL records", setup=write(DOCS)),
    row("prepare_data.py", "jsonl-without-the-text-field", [*PREPARE, "--files", "{tmp}/src/r.jsonl"],
        "the input has no 'text' field (fields: body); set --text-field",
        setup=write({"src/r.jsonl": '{"body": "a"}\n{"body": "b"}\n'})),
    row("prepare_data.py", "jsonl-malformed", [*PREPARE, "--files", "{tmp}/src/bad.jsonl"], "could not read the json file(s)",
        setup=write({"src/bad.jsonl": '{"text": "a"\n'})),
    row("prepare_data.py", "one-document", [*PREPARE, "--files", "{tmp}/src/a.txt"],
        "the input has 1 document(s); at least 2 are needed", setup=write(DOCS)),
    row("prepare_data.py", "blank-lines-only", [*PREPARE, "--files", "{tmp}/src/blank.txt", "--text-split", "line"],
        "the input has 0 document(s)", setup=write({"src/blank.txt": "\n\n  \n"})),
    row("prepare_data.py", "val-fraction-zero", [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt",
                                                "--val-fraction", "0"],
        "--val-fraction 0.0 must lie strictly between 0 and 1", setup=write(DOCS)),
    row("prepare_data.py", "val-fraction-above-one", [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt",
                                                     "--val-fraction", "1.5"],
        "--val-fraction 1.5 must lie strictly between 0 and 1", setup=write(DOCS)),
    row("prepare_data.py", "val-fraction-nan", [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt",
                                               "--val-fraction", "nan"],
        "--val-fraction nan must lie strictly between 0 and 1", setup=write(DOCS)),
    row("prepare_data.py", "val-fraction-leaving-no-training-document",
        [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt", "--val-fraction", "0.9"],
        "--val-fraction 0.9 of 2 documents leaves no training document", setup=write(DOCS)),
    row("prepare_data.py", "negative-split-seed", [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt",
                                                  "--split-seed", "-1"],
        "--split-seed -1 must be a non-negative integer", setup=write(DOCS)),
    row("prepare_data.py", "tiktoken-file-missing", ["--out", "{tmp}/tokens", "--tokenizer", "gpt2", "--files",
                                                    "{tmp}/src/a.txt", "{tmp}/src/b.txt",
                                                    "--tiktoken-file", "{tmp}/gpt2.tiktoken"],
        "tiktoken file '{tmp}/gpt2.tiktoken' does not exist", setup=write(DOCS)),
    row("prepare_data.py", "tiktoken-file-of-another-vocabulary", ["--out", "{tmp}/tokens", "--tokenizer", "gpt2",
                                                                  "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt",
                                                                  "--tiktoken-file", "{tmp}/src/a.txt"],
        "not the GPT-2 (r50k_base) ranks", setup=write(DOCS)),
    row("prepare_data.py", "out-is-the-working-directory", ["--out", ".", "--tokenizer", "byte", "--files",
                                                           "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "--out '.' is the current directory, the home folder or a parent of one", setup=write(DOCS)),
    row("prepare_data.py", "out-is-a-parent-of-the-working-directory",
        ["--out", "..", "--overwrite", "--tokenizer", "byte", "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "--out '..' is the current directory, the home folder or a parent of one", setup=write(DOCS)),
    row("prepare_data.py", "out-is-the-home-folder", ["--out", "~", "--tokenizer", "byte", "--files",
                                                     "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "--out '~' is the current directory, the home folder", setup=both(write(DOCS), folders("home")),
        env={"HOME": "{tmp}/home"}),
    row("prepare_data.py", "out-not-empty", ["--out", "{tmp}/mine", "--tokenizer", "byte", "--files",
                                            "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "is not empty (it holds 'notes.txt')", setup=write({**DOCS, "mine/notes.txt": "mine"})),
    row("prepare_data.py", "overwrite-a-folder-of-other-files",
        ["--out", "{tmp}/mine", "--overwrite", "--tokenizer", "byte", "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "is not a token folder", setup=write({**DOCS, "mine/notes.txt": "mine"})),
    row("prepare_data.py", "out-is-a-file", ["--out", "{tmp}/src/b.txt", "--tokenizer", "byte", "--files",
                                            "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "--out '{tmp}/src/b.txt' exists and is not a folder", setup=write(DOCS)),
    row("prepare_data.py", "out-inside-a-file", ["--out", "{tmp}/src/b.txt/tokens", "--tokenizer", "byte", "--files",
                                                "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "cannot be created: '{tmp}/src/b.txt' is a file", setup=write(DOCS)),
    row("prepare_data.py", "cache-dir-is-a-file", [*PREPARE, "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt",
                                                  "--cache-dir", "{tmp}/src/b.txt"],
        "--cache-dir '{tmp}/src/b.txt' exists and is not a folder", setup=write(DOCS)),
    row("prepare_data.py", "hf-tokenizer-without-its-file", ["--out", "{tmp}/tokens", "--tokenizer", "hf", "--files",
                                                            "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        'tokenizer "hf" reads a Hugging Face tokenizer.json', setup=write(DOCS)),
    row("prepare_data.py", "tokenizer-file-missing",
        ["--out", "{tmp}/tokens", "--tokenizer", "hf", "--tokenizer-file", "{tmp}/nope.json", "--files",
         "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "tokenizer file '{tmp}/nope.json' does not exist", setup=write(DOCS)),
    row("prepare_data.py", "tokenizer-file-corrupt", ["--out", "{tmp}/tokens", "--tokenizer", "hf", "--tokenizer-file",
                                                     "{tmp}/src/b.txt", "--files", "{tmp}/src/a.txt"],
        "is not a tokenizer.json the tokenizers library reads", setup=write(DOCS)),
    row("prepare_data.py", "eot-token-not-in-the-vocabulary",
        ["--out", "{tmp}/tokens", "--tokenizer", "hf", "--tokenizer-file", "{tmp}/t.json", "--eot-token", "</s>",
         "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "end-of-text token '</s>' is not in the vocabulary", setup=both(write(DOCS), tokenizer_json("t.json"))),
    row("prepare_data.py", "tiktoken-file-for-the-byte-tokenizer",
        [*PREPARE, "--tiktoken-file", "{tmp}/src/a.txt", "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "--tiktoken-file gives the GPT-2 ranks of --tokenizer gpt2, not --tokenizer byte", setup=write(DOCS)),
    row("prepare_data.py", "tokenizer-file-for-the-byte-tokenizer",
        [*PREPARE, "--tokenizer-file", "{tmp}/t.json", "--files", "{tmp}/src/a.txt", "{tmp}/src/b.txt"],
        "--tokenizer-file applies to --tokenizer hf", setup=both(write(DOCS), tokenizer_json("t.json"))),
    row("prepare_data.py", "adopt-with-an-hf-tokenizer", ["--adopt", "{tmp}/nano", "--tokenizer", "hf"],
        "--adopt takes nanoGPT folders of gpt2 or byte ids", setup=write(NANO)),
]

SUBPROCESS = [
    row("prepare_data.py", "hub-dataset-offline", ["--out", "{tmp}/owt", "--tokenizer", "byte"],
        "could not load dataset 'openwebtext'", env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}),
]


@pytest.mark.parametrize("mistake", IN_PROCESS)
def test_mistake(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    check_in_process(mistake, inputs, tmp_path, clean_env, capsys)


@pytest.mark.integration
@pytest.mark.parametrize("mistake", SUBPROCESS)
def test_mistake_in_a_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
    check_in_subprocess(mistake, request, launched)
