"""Hugging Face datasets or local files -> uint16 (uint32 above 65,536 ids) token files + meta.json (docs/data.md).

The paper's recipe (nanoGPT's openwebtext/prepare.py): split 0.0005 of the documents off as validation
(seed 2357) unless the dataset has a validation split, encode each document ordinarily and append the eot id.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import itertools
import json
import math
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from torchnlq.data import token_format as fmt
from torchnlq.data.tokenizer import GPT2_TIKTOKEN_SHA256, Tokenizer, build_tokenizer
from torchnlq.errors import UserError
from torchnlq.files import environment_fault, writing
from torchnlq.paths import protected_folders

JSON_SUFFIXES = (".json", ".jsonl")
TEXT_SPLITS = ("file", "paragraph", "line")  # how a text file becomes documents (_text_documents)
# Each document's input file (per-file counts); a name no dataset's own column is likely to shadow.
FILE_COLUMN = "__torchnlq_input_file__"
# Bumped when _text_documents changes, so datasets' cache of an earlier reading is not reused.
TEXT_READER_VERSION = 2

# Bytes read at a time by the encoding check of the input files.
READ_BLOCK = 1 << 24

TOKEN_FILES = (fmt.META_NAME, *(fmt.split_file("", s).name for s in fmt.SPLITS))
CACHE_NAME = "hf_cache"


def check_out_folder(out: str | Path, overwrite: bool = False) -> Path:
    """Refuse an output folder prepare could spoil; return it (user-expanded).

    A non-empty folder (``hf_cache/`` and temporaries aside) needs ``overwrite`` and must be
    a previous token folder, whose three files alone are replaced.
    """
    path = Path(out).expanduser()
    fix = "choose a new folder such as data/NAME"
    if path.resolve() in protected_folders():
        raise UserError(f"--out '{out}' is the current directory, the home folder or a parent of one; {fix}")
    if not path.exists():
        _first_missing("--out", out, path)
        return path
    if not path.is_dir():
        raise UserError(f"--out '{out}' exists and is not a folder; {fix}")
    # Ours: the default cache folder, and the temporary files of an interrupted prepare (``.train.bin.tmp-<pid>``).
    names = sorted(p.name for p in path.iterdir()
                   if p.name != CACHE_NAME and not any(p.name.startswith(f".{f}.tmp-") for f in TOKEN_FILES))
    if not names:
        return path
    if not overwrite:
        raise UserError(
            f"--out '{out}' is not empty (it holds {names[0]!r}); {fix}, or pass --overwrite to replace a previous "
            f"token folder's {', '.join(TOKEN_FILES)}"
        )
    if not any(n in TOKEN_FILES for n in names):
        raise UserError(
            f"--out '{out}' is not a token folder (no {', '.join(TOKEN_FILES)}) "
            "and --overwrite replaces only a previous "
            f"one; {fix}"
        )
    return path


def _first_missing(option: str, given: str | Path, path: Path) -> Path | None:
    """The outermost folder on the way to ``path`` that does not exist yet (what creating ``path`` adds), or None;
    a UserError when the folder cannot be created because one of its parents is a file."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            if missing is not None and not p.is_dir():
                raise UserError(f"{option} '{given}' cannot be created: '{p}' is a file, not a folder; "
                                "choose a path inside a folder")
            return missing
        missing = p
    return missing


def check_options(
    files: Sequence[str] | None, text_field: str, text_split: str, val_fraction: float, split_seed: int,
    cache_dir: str | Path | None,
) -> list[Path] | None:
    """Every check of prepare's options that needs no dataset (run before anything is created); the input files."""
    if not (math.isfinite(val_fraction) and 0.0 < val_fraction < 1.0):
        raise UserError(f"--val-fraction {val_fraction} must lie strictly between 0 and 1 (the paper uses 0.0005)")
    if split_seed < 0:
        raise UserError(f"--split-seed {split_seed} must be a non-negative integer")
    if cache_dir is not None:
        cache = Path(cache_dir).expanduser()
        if cache.exists() and not cache.is_dir():
            raise UserError(f"--cache-dir '{cache_dir}' exists and is not a folder; choose a folder for the cache")
        _first_missing("--cache-dir", cache_dir, cache)
    if not files:
        return None
    paths = [Path(f).expanduser().resolve() for f in files]
    folders = [str(p) for p in paths if p.is_dir()]
    if folders:
        raise UserError(f"--files names a folder: {', '.join(folders)}; pass the files inside it (e.g. DIR/*.txt)")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"input file(s) not found: {', '.join(missing)}; check the --files paths")
    twice = sorted({str(p) for p in paths if paths.count(p) > 1})
    if twice:
        raise UserError(f"input file(s) given more than once: {', '.join(twice)}; name each file once")
    is_json = [p.suffix.lower() in JSON_SUFFIXES for p in paths]
    if any(is_json) and not all(is_json):
        raise UserError("--files mixes JSON/JSONL and plain text files; prepare them in separate runs")
    if not any(is_json):
        if text_split not in TEXT_SPLITS:
            raise UserError(f"unknown text split '{text_split}'; choose one of: {', '.join(TEXT_SPLITS)}")
        if text_field != "text":
            raise UserError(
                f"--text-field {text_field!r} applies to JSON/JSONL records; a plain text file's documents are its "
                "text (drop --text-field)"
            )
    return paths


def check_utf8(paths: Sequence[Path]) -> None:
    """One UserError naming the file and the byte offset of the first byte that is not UTF-8 text: an invalid
    sequence (another encoding, a UTF-16 byte-order mark, binary data) or a NUL byte (UTF-16/32 text, binary)."""
    for path in paths:
        decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
        with path.open("rb") as f:
            while True:
                block = f.read(READ_BLOCK)
                nul = block.find(b"\0")
                pending = len(decoder.getstate()[0])  # bytes of a character cut at the previous block's end
                try:
                    decoder.decode(block[:nul] if nul >= 0 else block, final=not block or nul >= 0)
                except UnicodeDecodeError as e:
                    _not_utf8(path, offset - pending + e.start, e.object[e.start], e.reason)
                if nul >= 0:
                    _not_utf8(path, offset + nul, 0, "a NUL byte: a binary file, or UTF-16 or UTF-32 text")
                if not block:
                    break
                offset += len(block)


def _not_utf8(path: Path, offset: int, byte: int, why: str) -> None:
    raise UserError(
        f"'{path}' is not UTF-8 text: byte offset {offset:,} holds 0x{byte:02x} ({why}); prepare_data.py reads "
        "UTF-8: convert the file (e.g. iconv -f UTF-16 -t UTF-8) or leave it out of --files"
    )


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars or warnings from datasets: a mistake in local files must be the only line shown."""
    import datasets
    from datasets.utils import logging as ds_logging

    bars, level = datasets.is_progress_bar_enabled(), ds_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity(ds_logging.CRITICAL)  # its errors too: the UserError below names the cause
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()
        ds_logging.set_verbosity(level)


def _one_line(e: BaseException) -> str:
    """``Type: first line`` of the exception's root cause (datasets wraps the parse error that says what is wrong)."""
    while e.__cause__ is not None:
        e = e.__cause__
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:300]}"


def _paragraphs(lines: Iterable[str]) -> Iterator[str]:
    """Paragraphs of a text: runs of lines separated by blank lines, each without its final line break.

    Whitespace-only lines count as blank (WikiText separates paragraphs with ``" \\n"``);
    whitespace inside a paragraph is kept, as GPT-2 tokenizes it.
    """
    for is_text, block in itertools.groupby(lines, key=lambda line: bool(line.strip())):
        if is_text:
            yield "".join(block).removesuffix("\n")


def _text_documents(files: list[tuple[str, int, int, int]], text_split: str) -> Iterator[dict[str, Any]]:
    """The documents of text files, each with the index of its file (the generator of ``from_generator``).

    ``files`` holds (path, index in --files, size, mtime_ns): size and mtime only key datasets' cache.
    Text mode turns ``\\r\\n`` and ``\\r`` into ``\\n``, as datasets' "text" builder does.
    """
    for path, index, _size, _mtime in files:
        with open(path, encoding="utf-8") as f:
            if text_split == "file":
                yield {"text": f.read(), FILE_COLUMN: index}
            elif text_split == "line":
                for line in f:
                    yield {"text": line.rstrip("\n"), FILE_COLUMN: index}
            else:
                for paragraph in _paragraphs(f):
                    yield {"text": paragraph, FILE_COLUMN: index}


def _load_text_files(paths: Sequence[Path], text_split: str, cache_dir: Path, num_proc: int | None) -> Any:
    """Local text files as one Dataset of (text, file index), read by :func:`_text_documents`."""
    import datasets

    files = [(str(p), i, p.stat().st_size, p.stat().st_mtime_ns) for i, p in enumerate(paths)]
    # An explicit cache key: hashing the generator would not see a file's contents change.
    key = hashlib.sha256(repr((TEXT_READER_VERSION, text_split, files)).encode()).hexdigest()[:32]
    features = datasets.Features({"text": datasets.Value("string"), FILE_COLUMN: datasets.Value("int32")})
    return datasets.Dataset.from_generator(
        _text_documents, features=features, cache_dir=str(cache_dir), fingerprint=key,
        gen_kwargs={"files": files, "text_split": text_split},
        # datasets shards the file list over the workers; more workers than files would idle.
        num_proc=min(num_proc, len(files)) if num_proc and len(files) > 1 else None,
    )


def _load_json_files(paths: Sequence[Path], text_field: str, cache_dir: Path, num_proc: int | None) -> Any:
    """Local JSON/JSONL files as one Dataset of (text_field, file index), in --files order.

    One datasets split per file, so each record's file is known. Empty files and splits are left
    out: datasets infers the columns from the first split's records, and refuses an empty split.
    """
    import datasets

    names = {i: f"file{i}" for i, p in enumerate(paths) if p.stat().st_size > 0}
    parts = []
    if names:
        builder = datasets.load_dataset_builder(
            "json", data_files={n: [str(paths[i])] for i, n in names.items()}, cache_dir=str(cache_dir)
        )
        builder.download_and_prepare(num_proc=num_proc)
        for i, name in names.items():
            if name not in builder.info.splits or not builder.info.splits[name].num_examples:
                continue
            ds = builder.as_dataset(split=name)
            if text_field not in ds.column_names:
                where = f" in {paths[i]}" if len(paths) > 1 else ""
                raise UserError(f"the input has no '{text_field}' field (fields: {', '.join(ds.column_names)}){where}; "
                                "set --text-field")
            ds = ds.select_columns([text_field])
            _check_strings(ds, text_field, paths[i])
            parts.append(ds.add_column(FILE_COLUMN, np.full(len(ds), i, dtype=np.int32)))
    if not parts:  # no records at all: an empty dataset, refused as "0 document(s)" by the split
        features = datasets.Features({text_field: datasets.Value("string"), FILE_COLUMN: datasets.Value("int32")})
        return datasets.Dataset.from_dict({text_field: [], FILE_COLUMN: []}, features=features)
    return datasets.concatenate_datasets(parts)


JSON_KINDS = {bool: "a boolean", int: "a number", float: "a number", list: "an array"}  # else a dict: an object


def _check_strings(ds: Any, field: str, path: Path) -> None:
    """One UserError naming the file, line (or record) and field of the first record whose text is neither a string
    nor null (a number, a list, an object): datasets would turn it into text or drop it, silently."""
    import datasets

    feature = ds.features[field]
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string", "null"):
        return
    index = 0
    for batch in ds.iter(batch_size=4096):
        for value in batch[field]:
            if value is not None and not isinstance(value, str):
                line = _record_line(path, index)
                where = f"line {line:,}" if line is not None else f"record {index + 1:,}"
                shown = json.dumps(value)
                kind = JSON_KINDS.get(type(value), "an object")
                raise UserError(
                    f"'{path}' {where}: field '{field}' holds {kind} ({shown[:60]}"
                    f"{'...' if len(shown) > 60 else ''}), not a string; every record's text must be a JSON string: "
                    "fix the file, or choose the field with --text-field"
                )
            index += 1
    raise UserError(f"'{path}': field '{field}' holds {feature}, not strings; every record's text must be a JSON "
                    "string: fix the file, or choose the field with --text-field")


def _record_line(path: Path, index: int) -> int | None:
    """The line of JSONL record ``index`` (blank lines hold none); None for a JSON document (an array)."""
    with path.open(encoding="utf-8") as f:
        seen = 0
        for number, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            if seen == 0 and text.startswith("["):
                return None
            if seen == index:
                return number
            seen += 1
    return None


def _load_files(
    paths: Sequence[Path], text_split: str, text_field: str, cache_dir: Path, num_proc: int | None
) -> tuple[Any, dict[str, Any]]:
    """Local text or JSON/JSONL files as a DatasetDict with one 'train' split (with ``FILE_COLUMN``)."""
    import datasets

    kind = "json" if all(p.suffix.lower() in JSON_SUFFIXES for p in paths) else "text"
    try:
        ds = (_load_text_files(paths, text_split, cache_dir, num_proc) if kind == "text"
              else _load_json_files(paths, text_field, cache_dir, num_proc))
    except UserError:
        raise
    except Exception as e:  # datasets/pyarrow raise many types for unreadable input
        fault = environment_fault(e, cache_dir)  # its cache is written as it reads: a full disk is not the input's
        if fault is not None:
            raise fault from e
        raise UserError(f"could not read the {kind} file(s) {[str(p) for p in paths]} ({_one_line(e)})") from e
    source: dict[str, Any] = {"kind": "files", "format": kind, "files": [str(p) for p in paths]}
    if kind == "text":
        source["text_split"] = text_split
    return datasets.DatasetDict({"train": ds}), source


def _load_hub(name: str, config: str | None, cache_dir: Path, num_proc: int | None) -> tuple[Any, dict[str, Any]]:
    """A dataset from the Hugging Face hub (or its local cache)."""
    import datasets

    try:
        dd = datasets.load_dataset(name, config, cache_dir=str(cache_dir), num_proc=num_proc)
    except Exception as e:  # offline, unknown name, ...: one line for all
        fault = environment_fault(e, cache_dir)  # a full disk or read-only cache: said as such
        if fault is not None:
            raise fault from e
        raise UserError(
            f"could not load dataset '{name}' with datasets.load_dataset ({_one_line(e)}); the first load needs "
            "internet (or a filled --cache-dir); to work offline tokenize local files with --files"
        ) from e
    return dd, {"kind": "huggingface", "dataset": name, "config": config}


def _has_text(text: Any) -> bool:
    return isinstance(text, str) and bool(text.strip())


def _tokenize(texts: list[str], tokenizer: Tokenizer) -> dict[str, list]:
    # A plain function with the tokenizer in fn_kwargs: datasets pickles both
    # into the worker processes and hashes them for its cache fingerprint.
    ids, lens, sizes = [], [], []
    for text in texts:
        doc = tokenizer.encode(text)
        doc.append(tokenizer.eot_id)
        ids.append(doc)
        lens.append(len(doc))
        sizes.append(len(text.encode("utf-8")))  # the text's bytes: bits per byte compare tokenizers (meta.json)
    return {"ids": ids, "len": lens, "bytes": sizes}


def _split_train_val(dd: Any, val_fraction: float, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """{'train', 'val'} datasets: the dataset's own validation split, or the paper's random split."""
    if "train" not in dd:
        raise UserError(f"the dataset has no 'train' split (it has: {', '.join(dd)}); use a dataset with one")
    for name in ("val", "validation"):
        if name in dd:
            return {"train": dd["train"], "val": dd[name]}, {"method": "given", "val_split": name}
    train = dd["train"]
    if len(train) < 2:
        raise UserError(
            f"the input has {len(train)} document(s); at least 2 are needed to split off a validation set "
            "(pass more files, or --text-split paragraph|line to cut a text file into documents)"
        )
    if math.ceil(val_fraction * len(train)) >= len(train):
        raise UserError(
            f"--val-fraction {val_fraction} of {len(train)} documents leaves no training document; lower it "
            "(or pass more documents)"
        )
    # test_size as a float rounds up (ceil), so even a tiny input keeps >= 1 val document.
    parts = train.train_test_split(test_size=val_fraction, seed=seed, shuffle=True)
    split = {"method": "train_test_split", "val_fraction": val_fraction, "seed": seed}
    return {"train": parts["train"], "val": parts["test"]}, split


def _column_batches(ds: Any, column: str) -> Iterator[np.ndarray]:
    """One column of a tokenized split, 65,536 documents at a time (a corpus of billions never held whole)."""
    for batch in ds.select_columns([column]).with_format("arrow").iter(batch_size=1 << 16):
        yield np.asarray(batch.column(column))


def _token_chunks(ds: Any, bar: tqdm) -> Iterator[np.ndarray]:
    # A list column's flattened values are the concatenated documents: no per-document Python work.
    for batch in ds.select_columns(["ids"]).with_format("arrow").iter(batch_size=4096):
        for chunk in batch.column("ids").chunks:
            arr = chunk.flatten().to_numpy(zero_copy_only=False)
            bar.update(len(arr))
            yield arr


def prepare_dataset(
    out: str | Path,
    *,
    dataset: str = "openwebtext",
    dataset_config: str | None = None,
    files: Sequence[str] | None = None,
    text_field: str = "text",
    text_split: str = "file",
    tokenizer: str = "gpt2",
    tiktoken_file: str | None = None,
    expected_hash: str | None = GPT2_TIKTOKEN_SHA256,
    tokenizer_file: str | None = None,
    eot_token: str | None = None,
    val_fraction: float = 0.0005,
    split_seed: int = 2357,
    num_proc: int | None = None,
    cache_dir: str | Path | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Tokenize a dataset into ``out``/train.bin, val.bin, meta.json; returns the meta dict.

    ``files`` (local .txt or .json/.jsonl) replace the hub ``dataset``. A failure removes the folders this
    call created, except a hub download, kept for the next try.
    """
    if tokenizer != "hf" and (tokenizer_file is not None or eot_token is not None):
        flag = "--tokenizer-file" if tokenizer_file is not None else "--eot-token"
        raise UserError(f"{flag} applies to --tokenizer hf (a tokenizer.json), not --tokenizer {tokenizer}; "
                        f"drop {flag} or pass --tokenizer hf")
    if tokenizer != "gpt2" and tiktoken_file is not None:  # it would do nothing: say so rather than ignore it
        raise UserError(f"--tiktoken-file gives the GPT-2 ranks of --tokenizer gpt2, not --tokenizer {tokenizer}; "
                        "drop --tiktoken-file or pass --tokenizer gpt2")
    out = check_out_folder(out, overwrite)
    paths = check_options(files, text_field, text_split, val_fraction, split_seed, cache_dir)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else out / CACHE_NAME
    tok = build_tokenizer(tokenizer, tiktoken_file, expected_hash=expected_hash, tokenizer_file=tokenizer_file,
                          eot_token=eot_token)
    fmt.check_vocab_fits(tok.vocab_size)
    if paths:
        check_utf8(paths)  # before anything is created: a stranger's file may be binary or UTF-16
    if num_proc is not None and num_proc <= 1:
        num_proc = None  # datasets' single-process path; no worker pool to start

    created = {p for p in (_first_missing("--out", out, out), _first_missing("--cache-dir", cache, cache)) if p}
    out.mkdir(parents=True, exist_ok=True)
    loaded: list[Any] = []
    try:
        if paths:
            with _quiet_datasets():
                loaded.append(_load_files(paths, text_split, text_field, cache, num_proc))
        else:
            loaded.append(_load_hub(dataset, dataset_config, cache, num_proc))
        return _tokenize_into(out, cache, tok, *loaded[0], from_files=bool(paths), text_field=text_field,
                              val_fraction=val_fraction, split_seed=split_seed, num_proc=num_proc)
    except BaseException as e:
        if loaded and not paths:
            if isinstance(e, UserError):
                raise UserError(f"{e} (the downloaded dataset stays in {cache} for the next run)") from None
            raise
        for path in sorted(created, key=lambda p: len(p.parts)):
            shutil.rmtree(path, ignore_errors=True)
        raise


def _tokenize_into(
    out: Path, cache: Path, tok: Tokenizer, dd: Any, source: dict[str, Any], *, from_files: bool, text_field: str,
    val_fraction: float, split_seed: int, num_proc: int | None,
) -> dict[str, Any]:
    """Split, tokenize (datasets writes into ``cache``) and write the loaded dataset ``dd`` into ``out``; returns
    the meta dict. A full disk or read-only folder is one OSError naming ``cache`` or ``out``."""
    import datasets

    columns = dd[next(iter(dd))].column_names
    if text_field not in columns:
        raise UserError(f"the input has no '{text_field}' field (fields: {', '.join(columns)}); set --text-field")
    # Local files are read quietly (their mistakes must be the only line); a hub dataset shows its progress.
    with _quiet_datasets() if from_files else contextlib.nullcontext(), writing(cache):
        if from_files:  # blank lines / empty records would be lone eot tokens
            dd = dd.filter(_has_text, input_columns=text_field, desc="dropping empty documents")
        splits, source["split"] = _split_train_val(dd, val_fraction, split_seed)
    source["text_field"] = text_field

    dtype = fmt.dtype_for_vocab(tok.vocab_size)  # uint16 while every id fits (half the bytes), else uint32
    columns = {"ids": datasets.List(datasets.Value(dtype)), "len": datasets.Value("int64"),
               "bytes": datasets.Value("int64")}
    # Documents of local files keep the index of their file, for the per-file counts below.
    per_file = None
    if FILE_COLUMN in dd["train"].column_names:
        columns[FILE_COLUMN] = datasets.Value("int32")
        per_file = [{"file": name, "documents": {}, "tokens": {}} for name in source["files"]]
    features = datasets.Features(columns)
    tokens, documents, text_bytes, largest, temps = {}, {}, {}, {}, {}
    try:
        for split, ds in splits.items():
            with writing(cache):
                tokenized = ds.map(
                    _tokenize,
                    batched=True,
                    input_columns=text_field,
                    remove_columns=[c for c in ds.column_names if c != FILE_COLUMN],
                    fn_kwargs={"tokenizer": tok},
                    features=features,
                    num_proc=num_proc if num_proc and len(ds) >= num_proc else None,
                    desc=f"tokenizing {split}",
                )
            tokens[split] = int(sum(lens.sum() for lens in _column_batches(tokenized, "len")))
            documents[split] = len(tokenized)
            text_bytes[split] = int(sum(sizes.sum() for sizes in _column_batches(tokenized, "bytes")))
            temps[split] = fmt.temp_name(fmt.split_file(out, split))
            with tqdm(total=tokens[split], unit="tok", unit_scale=True, desc=f"writing {split}.bin") as bar, \
                    writing(out):
                largest[split] = fmt.write_tokens(temps[split], tokens[split], _token_chunks(tokenized, bar), dtype)
            if per_file is not None:
                docs, toks = np.zeros(len(per_file)), np.zeros(len(per_file))  # float64: exact below 2**53
                for index, lens in zip(_column_batches(tokenized, FILE_COLUMN), _column_batches(tokenized, "len")):
                    docs += np.bincount(index, minlength=len(per_file))
                    toks += np.bincount(index, weights=lens, minlength=len(per_file))
                for entry, d, t in zip(per_file, docs, toks):
                    entry["documents"][split], entry["tokens"][split] = int(d), int(t)
        if per_file is not None:
            source["per_file"] = per_file
        meta = fmt.make_meta(tok.describe(), tokens, documents, source, max_token_id=largest, dtype=dtype,
                             text_bytes=text_bytes)
        with writing(out):
            fmt.commit(out, temps, meta)
    except BaseException:  # also Ctrl-C: never leave temporary files behind
        fmt.remove_temps(temps.values())
        raise
    return meta


# ---------------------------------------------------------------------------- the report


def _display(path: str | Path) -> str:
    """``path`` relative to the working directory or absolute, whichever is shorter (a table's first column)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows): no relative path exists
        return str(path)
    return min(rel, str(path), key=len)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned first column, right-aligned numbers, two spaces between columns."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in (header, *rows)]


def format_report(meta: dict[str, Any], folder: str | Path) -> str:
    """What :func:`prepare_dataset` made, as printed by prepare_data.py: documents and tokens per input and split."""
    source = meta.get("source", {})
    splits = list(meta["tokens"])
    if source.get("per_file"):
        inputs = [(_display(f["file"]), f["documents"], f["tokens"]) for f in source["per_file"]]
    else:
        name = source.get("dataset", "input")
        if source.get("config"):
            name += f" ({source['config']})"
        inputs = [(name, meta["documents"], meta["tokens"])]
    header = ["input", *(f"{s} {what}" for s in splits for what in ("documents", "tokens"))]
    rows = [[name, *(f"{counts[s]:,}" for s in splits for counts in (docs, toks))] for name, docs, toks in inputs]
    rows.append(["total", *(f"{counts[s]:,}" for s in splits for counts in (meta["documents"], meta["tokens"]))])
    docs, toks = sum(meta["documents"].values()), sum(meta["tokens"].values())
    return "\n".join([
        (f"wrote {folder}: {', '.join(fmt.split_file('', s).name for s in splits)}, {fmt.META_NAME} "
         f"(tokenizer {meta['tokenizer']})"),
        *text_table(header, rows),
        f"{docs:,} documents, {toks:,} tokens in all (each document's tokens include the eot id after it)",
    ])
