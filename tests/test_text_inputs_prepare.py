"""prepare_data.py's text inputs (issue 31.4), and the catalogue rows of issue 31's new mistakes.

A file that is not UTF-8 text (UTF-16 with or without a byte-order mark, Latin-1, binary) is one line naming
the file and the byte offset of its first bad byte, checked against Python's own one-shot decoder; a JSON/JSONL
text field that is not a string (a number, an array, an object) is one line naming the file, line and field,
where datasets turned it into text or dropped it silently. The rows at the end run each entry point's
``main`` through ``run_cli``: exit 2, one ``error:`` line holding the fragment, no file changed or created.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchnlq.cli import run_cli
from torchnlq.data import prepare
from torchnlq.errors import UserError

from helpers.checkpoints import load_script, tiny_model, write_checkpoint
from helpers.data import isolate_env
from helpers.train import tiny_args


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_env(tmp_path, monkeypatch)


# ------------------------------------------------------------------ the encoding check against Python's decoder


def first_bad_byte(data: bytes) -> int | None:
    """The reference: where Python's one-shot UTF-8 decoder fails, or the first NUL before that."""
    try:
        data.decode("utf-8")
        bad = None
    except UnicodeDecodeError as e:
        bad = e.start
    nul = data.find(b"\0")
    return min((i for i in (bad, nul) if i is not None and i >= 0), default=None)


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)
NOISE = st.binary(min_size=1, max_size=3)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(before=TEXT, noise=st.none() | NOISE, after=TEXT, block=st.integers(1, 9))
def test_the_offset_named_is_where_pythons_decoder_fails(tmp_path_factory: pytest.TempPathFactory, before: str,
                                                         noise: bytes | None, after: str, block: int) -> None:
    """Drawn text (multi-byte characters cut by blocks of 1 to 9 bytes) with drawn bytes inside."""
    data = before.encode() + (noise or b"") + after.encode()
    path = tmp_path_factory.mktemp("utf8") / "input.txt"
    path.write_bytes(data)
    expected = first_bad_byte(data)
    with mock.patch.object(prepare, "READ_BLOCK", block):
        if expected is None:
            prepare.check_utf8([path])
            return
        with pytest.raises(UserError) as caught:
            prepare.check_utf8([path])
    assert f"'{path}' is not UTF-8 text: byte offset {expected:,} holds 0x{data[expected]:02x}" in str(caught.value)


def test_valid_text_across_many_blocks_passes_and_a_late_bad_byte_is_found(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare, "READ_BLOCK", 4096)
    good = ("naïve café — 漢字 🙂\n" * 3000).encode()
    path = tmp_path / "t.txt"
    path.write_bytes(good)
    prepare.check_utf8([path])
    path.write_bytes(good + b"\xc3(" + good)
    with pytest.raises(UserError, match=f"byte offset {len(good):,} holds 0xc3 \\(invalid continuation byte\\)"):
        prepare.check_utf8([path])


# ------------------------------------------------------------------ JSON text fields


def prepare_jsonl(tmp_path: Path, lines: list[str], suffix: str = ".jsonl") -> dict:
    path = tmp_path / f"docs{suffix}"
    path.write_text("\n".join(lines) + "\n")
    return prepare.prepare_dataset(tmp_path / "out", files=[str(path)], tokenizer="byte", val_fraction=0.3)


def test_string_and_null_text_fields_prepare(tmp_path: Path) -> None:
    """Null, like an empty string, is no document; every string is one (the byte tokenizer: its UTF-8 bytes)."""
    docs = ["first document", "second", "ünïcödé third"]
    meta = prepare_jsonl(tmp_path, [json.dumps({"text": d}) for d in docs] + ['{"text": null}', '{"text": ""}'])
    assert sum(meta["documents"].values()) == 3
    assert sum(meta["tokens"].values()) == sum(len(d.encode()) + 1 for d in docs)  # + the eot id of each


@pytest.mark.parametrize("value, kind", [("42", "a number"), ("[1, 2]", "an array"), ('{"a": "b"}', "an object"),
                                         ("true", "a boolean"), ("1.5", "a number")])
def test_a_text_field_that_is_not_a_string_names_the_file_line_and_field(tmp_path: Path, value: str,
                                                                         kind: str) -> None:
    lines = ['{"text": "a document"}', '{"text": "another"}', f'{{"text": {value}, "id": 3}}', '{"text": "x"}']
    with pytest.raises(UserError) as caught:
        prepare_jsonl(tmp_path, lines)
    assert f"docs.jsonl' line 3: field 'text' holds {kind} ({value})" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_a_json_array_file_names_the_record(tmp_path: Path) -> None:
    records = [{"text": "one"}, {"text": "two"}, {"text": 7}]
    (tmp_path / "docs.json").write_text(json.dumps(records, indent=1))
    with pytest.raises(UserError, match="docs.json' record 3: field 'text' holds a number \\(7\\)"):
        prepare.prepare_dataset(tmp_path / "out", files=[str(tmp_path / "docs.json")], tokenizer="byte")


# ------------------------------------------------------------------ catalogue rows (issue 31's new mistakes)


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root``, with a sha256 of each file."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
            for p in sorted(root.rglob("*")) if "hf_home" not in p.parts}


@dataclass(frozen=True)
class Row:
    name: str
    main: Callable[[], Callable[[list[str]], int | None]]  # the entry point's main, imported when the row runs
    argv: list[str]  # "{tmp}" is the row's folder
    fragment: str
    setup: Callable[[Path], None] = lambda tmp: None


def prepare_main() -> Callable[[list[str]], int | None]:
    return load_script("prepare_data").main


def train_main() -> Callable[[list[str]], int | None]:
    from torchnlq.train.__main__ import main

    return main


def files(**contents: bytes) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        for name, data in contents.items():
            (tmp / name.replace("_", ".")).write_bytes(data)
    return write


def a_run_with_its_own_checkpoints(tmp: Path) -> None:
    """A finished run started without an initial load, and another model's checkpoint beside it."""
    assert run_cli(train_main(), tiny_args(tmp, steps=2, checkpoint__interval=2)) == 0
    write_checkpoint(tmp / "other" / "step-7", tiny_model())


PREPARE = ["--out", "{tmp}/out", "--tokenizer", "byte", "--num-proc", "1", "--files"]
ROWS = [
    Row("text-file-in-utf-16", prepare_main, [*PREPARE, "{tmp}/doc.txt"],
        "doc.txt' is not UTF-8 text: byte offset 0 holds 0xff (invalid start byte)",
        files(doc_txt="some text\n\nmore".encode("utf-16"))),
    Row("text-file-in-utf-16-without-a-byte-order-mark", prepare_main, [*PREPARE, "{tmp}/doc.txt"],
        "doc.txt' is not UTF-8 text: byte offset 1 holds 0x00 (a NUL byte: a binary file, or UTF-16 or UTF-32 text)",
        files(doc_txt="some text".encode("utf-16-le"))),
    Row("text-file-in-latin-1", prepare_main, [*PREPARE, "{tmp}/ok.txt", "{tmp}/doc.txt"],
        "doc.txt' is not UTF-8 text: byte offset 3 holds 0xe9 (invalid continuation byte)",
        files(ok_txt=b"fine text", doc_txt="caf\u00e9 au lait".encode("latin-1"))),
    Row("binary-file", prepare_main, [*PREPARE, "{tmp}/image.txt"],
        "image.txt' is not UTF-8 text: byte offset 0 holds 0x89 (invalid start byte)",
        files(image_txt=b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")),
    Row("jsonl-text-field-holds-a-number", prepare_main, [*PREPARE, "{tmp}/docs.jsonl"],
        "docs.jsonl' line 2: field 'text' holds a number (42), not a string",
        files(docs_jsonl=b'{"text": "a"}\n{"text": 42}\n{"text": "b"}\n')),
    Row("jsonl-text-field-holds-a-list", prepare_main, [*PREPARE, "{tmp}/docs.jsonl", "--text-field", "body"],
        "docs.jsonl' line 1: field 'body' holds an array ([\"a\", \"b\"]), not a string",
        files(docs_jsonl=b'{"body": ["a", "b"]}\n{"body": "c"}\n')),
    Row("initial-load-of-other-weights-into-a-run-with-checkpoints", train_main,
        [*tiny_args(Path("{tmp}"), steps=4, checkpoint__interval=2),
         "--checkpoint.initial_load_path={tmp}/other/step-7"],
        "checkpoint.initial_load_path {tmp}/other/step-7 would not be loaded: {tmp}/outputs/run resumes its own "
        "checkpoint step-2, and that run started without checkpoint.initial_load_path; drop the option to resume it, "
        "or use a new --job.name", a_run_with_its_own_checkpoints),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name, marks=[pytest.mark.integration] if r.main is train_main
                                              else []) for r in ROWS])
def test_catalogue_row(row: Row, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tmp = tmp_path / "row"
    tmp.mkdir()
    row.setup(tmp)
    before = snapshot(tmp)
    main = row.main()
    capsys.readouterr()
    code = run_cli(main, [arg.replace("{tmp}", str(tmp)) for arg in row.argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    assert row.fragment.replace("{tmp}", str(tmp)) in lines[0], lines[0]
    assert snapshot(tmp) == before
