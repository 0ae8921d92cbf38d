"""Hugging Face datasets or local files -> uint16 token files + meta.json.

The paper's recipe (nanoGPT's openwebtext/prepare.py): load the dataset, split
0.0005 of the documents off as validation with seed 2357 when the dataset has
no validation split, encode each document with the ordinary GPT-2 encoding and
append the eot id, and concatenate each split into one uint16 file. The
on-disk format is described in :mod:`torchnlq.data.token_format` and docs/data.md.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from torchnlq.data import token_format as fmt
from torchnlq.data.tokenizer import GPT2_TIKTOKEN_SHA256, Tokenizer, build_tokenizer
from torchnlq.errors import UserError
from torchnlq.paths import protected_folders

JSON_SUFFIXES = (".json", ".jsonl")
# How a local text file becomes documents: the whole file, blank-line separated
# paragraphs, or single lines (datasets' "text" builder's sample_by values).
TEXT_SPLITS = {"file": "document", "paragraph": "paragraph", "line": "line"}


# What a token folder holds: the files prepare writes (and replaces), its default cache, its temporaries.
TOKEN_FILES = (fmt.META_NAME, *(fmt.split_file("", s).name for s in fmt.SPLITS))
CACHE_NAME = "hf_cache"


def _is_ours(name: str) -> bool:
    """The default cache folder, or a temporary file of an interrupted prepare (``.train.bin.tmp-<pid>``)."""
    return name == CACHE_NAME or any(name.startswith(f".{f}.tmp-") for f in TOKEN_FILES)


def check_out_folder(out: str | Path, overwrite: bool = False) -> Path:
    """Refuse an output folder prepare could spoil; return it (user-expanded).

    Refused always: the working directory, the home folder and their parents, and a
    path that is not a folder. A folder holding anything besides ``hf_cache/`` and
    prepare's temporaries is refused unless ``overwrite``, and then it must be a
    previous token folder (one of meta.json, train.bin, val.bin): only those three
    files are replaced; nothing else in it is touched.
    """
    path = Path(out).expanduser()
    fix = "choose a new folder such as data/NAME"
    if path.resolve() in protected_folders():
        raise UserError(f"--out '{out}' is the current directory, the home folder or a parent of one; {fix}")
    if not path.exists():
        _check_creatable("--out", out, path)
        return path
    if not path.is_dir():
        raise UserError(f"--out '{out}' exists and is not a folder; {fix}")
    names = sorted(p.name for p in path.iterdir() if not _is_ours(p.name))
    if not names:
        return path
    if not overwrite:
        raise UserError(
            f"--out '{out}' is not empty (it holds {names[0]!r}); {fix}, or pass --overwrite to replace a previous "
            f"token folder's {', '.join(TOKEN_FILES)}"
        )
    if not any(n in TOKEN_FILES for n in names):
        raise UserError(
            f"--out '{out}' is not a token folder (no {', '.join(TOKEN_FILES)}) and --overwrite replaces only a previous "
            f"one; {fix}"
        )
    return path


def _check_creatable(option: str, given: str | Path, path: Path) -> None:
    """A UserError when a folder cannot be created at ``path`` because one of its parents is a file."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{option} '{given}' cannot be created: '{parent}' is a file, not a folder; "
                                "choose a path inside a folder")
            return


def _first_missing(path: Path) -> Path | None:
    """The outermost folder on the way to ``path`` that does not exist yet (what creating ``path`` adds), or None."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            return missing
        missing = p
    return missing


def check_options(
    files: Sequence[str] | None, text_field: str, text_split: str, val_fraction: float, split_seed: int,
    cache_dir: str | Path | None,
) -> list[Path] | None:
    """Every check of prepare's options that needs no dataset loaded; returns the resolved input files.

    Run before anything is created, so a mistake here leaves no trace.
    """
    if not (math.isfinite(val_fraction) and 0.0 < val_fraction < 1.0):
        raise UserError(f"--val-fraction {val_fraction} must lie strictly between 0 and 1 (the paper uses 0.0005)")
    if split_seed < 0:
        raise UserError(f"--split-seed {split_seed} must be a non-negative integer")
    if cache_dir is not None:
        cache = Path(cache_dir).expanduser()
        if cache.exists() and not cache.is_dir():
            raise UserError(f"--cache-dir '{cache_dir}' exists and is not a folder; choose a folder for the cache")
        _check_creatable("--cache-dir", cache_dir, cache)
    if not files:
        return None
    paths = _input_paths(files)
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


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars or warnings from datasets: reading local files is quick, and a mistake found
    while reading them (a missing field, too few documents) must be the only line on the terminal."""
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


def _input_paths(files: Sequence[str]) -> list[Path]:
    """The resolved input files; a missing one or one named twice is a UserError (checked before ``out`` exists)."""
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
    return paths


def _load_files(paths: Sequence[Path], text_split: str, cache_dir: Path, num_proc: int | None) -> tuple[Any, dict[str, Any]]:
    """Local text or JSON/JSONL files (checked by :func:`check_options`) as a DatasetDict with one 'train' split."""
    import datasets

    kind = "json" if all(p.suffix.lower() in JSON_SUFFIXES for p in paths) else "text"
    kwargs: dict[str, Any] = {}
    if kind == "text":
        kwargs["sample_by"] = TEXT_SPLITS[text_split]
    try:
        dd = datasets.load_dataset(
            kind, data_files=[str(p) for p in paths], cache_dir=str(cache_dir), num_proc=num_proc, **kwargs
        )
    except Exception as e:  # datasets/pyarrow raise many types for unreadable input
        raise UserError(f"could not read the {kind} file(s) {[str(p) for p in paths]} ({_one_line(e)})") from e
    source = {"kind": "files", "format": kind, "files": [str(p) for p in paths]}
    if kind == "text":
        source["text_split"] = text_split
    return dd, source


def _load_hub(name: str, config: str | None, cache_dir: Path, num_proc: int | None) -> tuple[Any, dict[str, Any]]:
    """A dataset from the Hugging Face hub (or its local cache)."""
    import datasets

    try:
        dd = datasets.load_dataset(name, config, cache_dir=str(cache_dir), num_proc=num_proc)
    except Exception as e:  # offline, unknown name, disk full, ...: one line for all
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
    ids, lens = [], []
    for text in texts:
        doc = tokenizer.encode(text)
        doc.append(tokenizer.eot_id)
        ids.append(doc)
        lens.append(len(doc))
    return {"ids": ids, "len": lens}


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
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val-fraction {val_fraction} must lie strictly between 0 and 1")
    if math.ceil(val_fraction * len(train)) >= len(train):
        raise UserError(
            f"--val-fraction {val_fraction} of {len(train)} documents leaves no training document; lower it "
            "(or pass more documents)"
        )
    # test_size as a float rounds up (ceil), so even a tiny input keeps >= 1 val document.
    parts = train.train_test_split(test_size=val_fraction, seed=seed, shuffle=True)
    split = {"method": "train_test_split", "val_fraction": val_fraction, "seed": seed}
    return {"train": parts["train"], "val": parts["test"]}, split


def _count_tokens(ds: Any) -> int:
    lens = ds.select_columns(["len"]).with_format("arrow")
    return int(sum(np.asarray(b.column("len")).sum() for b in lens.iter(batch_size=1 << 16)))


def _token_chunks(ds: Any, bar: tqdm) -> Iterator[np.ndarray]:
    # Arrow batches in dataset order; a list column's flattened values are the
    # concatenated documents, so no per-document Python work here.
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
    val_fraction: float = 0.0005,
    split_seed: int = 2357,
    num_proc: int | None = None,
    cache_dir: str | Path | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Tokenize a dataset into ``out``/train.bin, val.bin, meta.json; returns the meta dict.

    ``files`` (local .txt or .json/.jsonl) replace the hub ``dataset``. Text
    files become documents per ``text_split`` (file, paragraph or line); JSON
    records take their ``text_field``. ``cache_dir`` (default ``out``/hf_cache)
    holds datasets' arrow caches. ``out`` must be new or empty (``hf_cache/`` aside);
    ``overwrite`` lets it be a previous token folder, whose three files are replaced
    (:func:`check_out_folder`). Nothing appears under the final names until every
    file is complete. Every option is checked before anything is created
    (:func:`check_options`); a failure later removes the folders this call created,
    except a hub download, which is kept for the next try.
    """
    out = check_out_folder(out, overwrite)
    paths = check_options(files, text_field, text_split, val_fraction, split_seed, cache_dir)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else out / CACHE_NAME
    tok = build_tokenizer(tokenizer, tiktoken_file, expected_hash=expected_hash)
    fmt.check_vocab_fits(tok.vocab_size)
    if num_proc is not None and num_proc <= 1:
        num_proc = None  # datasets' single-process path; no worker pool to start

    # Everything this call creates (out, the cache, missing parents) is removed again when it fails,
    # except a hub download that succeeded: it is kept for the next try (and the error says where).
    created = {p for p in (_first_missing(out), _first_missing(cache)) if p is not None}
    out.mkdir(parents=True, exist_ok=True)
    loaded: list[Any] = []
    try:
        if paths:
            with _quiet_datasets():
                loaded.append(_load_files(paths, text_split, cache, num_proc))
        else:
            loaded.append(_load_hub(dataset, dataset_config, cache, num_proc))
        return _tokenize_into(out, tok, *loaded[0], from_files=bool(paths), text_field=text_field,
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
    out: Path, tok: Tokenizer, dd: Any, source: dict[str, Any], *, from_files: bool, text_field: str,
    val_fraction: float, split_seed: int, num_proc: int | None,
) -> dict[str, Any]:
    """Split, tokenize and write the loaded dataset ``dd`` into ``out``; returns the meta dict."""
    import datasets

    columns = dd[next(iter(dd))].column_names
    if text_field not in columns:
        raise UserError(f"the input has no '{text_field}' field (fields: {', '.join(columns)}); set --text-field")
    # Local files are read quietly (their mistakes must be the only line); a hub dataset shows its progress.
    with _quiet_datasets() if from_files else contextlib.nullcontext():
        if from_files:  # blank lines / empty records would be lone eot tokens
            dd = dd.filter(_has_text, input_columns=text_field, desc="dropping empty documents")
        splits, source["split"] = _split_train_val(dd, val_fraction, split_seed)
    source["text_field"] = text_field

    features = datasets.Features({"ids": datasets.List(datasets.Value("uint16")), "len": datasets.Value("int64")})
    tokens: dict[str, int] = {}
    documents: dict[str, int] = {}
    largest: dict[str, int] = {}
    temps: dict[str, Path] = {}
    try:
        for split, ds in splits.items():
            tokenized = ds.map(
                _tokenize,
                batched=True,
                input_columns=text_field,
                remove_columns=ds.column_names,
                fn_kwargs={"tokenizer": tok},
                features=features,
                num_proc=num_proc if num_proc and len(ds) >= num_proc else None,
                desc=f"tokenizing {split}",
            )
            total = _count_tokens(tokenized)
            temps[split] = fmt.temp_name(fmt.split_file(out, split))
            with tqdm(total=total, unit="tok", unit_scale=True, desc=f"writing {split}.bin") as bar:
                largest[split] = fmt.write_tokens(temps[split], total, _token_chunks(tokenized, bar))
            tokens[split], documents[split] = total, len(tokenized)
        meta = fmt.make_meta(tok.describe(), tokens, documents, source, max_token_id=largest)
        fmt.commit(out, temps, meta)
    except BaseException:  # also Ctrl-C: never leave temporary files behind
        fmt.remove_temps(temps.values())
        raise
    return meta
