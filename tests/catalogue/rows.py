"""The catalogue's vocabulary: a row, the placeholders of its command line, the set-ups of its bad files,
and what the rows of several entry points share (the valid training run each run_train.sh row breaks)."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.checkpoints import tiny_model, write_checkpoint
from helpers.data import write_token_folder

#: What a row's set-up may return: a clean-up to run after the command (e.g. releasing a held lock).
Cleanup = Callable[[], None]


@dataclass(frozen=True)
class Inputs:
    """The valid inputs the rows share (built once per session, never written by a row: snapshotted)."""

    root: Path
    data: Path  # a byte-tokenizer token folder: train.bin (3000 tokens), val.bin (800), meta.json
    run: Path  # a real run folder written by the trainer: config.toml, run_info.json, tb/, checkpoints/step-2
    ckpt: Path  # run/checkpoints/step-2: the TRAIN model (1 layer, d=32, 2 heads, 256 positions, byte vocab)
    export: Path  # a safetensors export of ckpt
    runs: Path  # hand-made run folders for compare_runs (see write_compare_run)
    config: Path  # a TOML file equal to TRAIN (data.path is the shared data folder)

    def places(self, tmp: Path) -> dict[str, str]:
        """The placeholders a row's argv, env and files may use, and what they stand for."""
        return {
            "{tmp}": str(tmp), "{data}": str(self.data), "{run}": str(self.run), "{ckpt}": str(self.ckpt),
            "{export}": str(self.export), "{runs}": str(self.runs), "{config}": str(self.config),
        }


#: A set-up writes the bad files of a mistake into the row's folder, before the "before" snapshot.
Setup = Callable[[Path, Inputs], "Cleanup | None"]


def fill(text: str, places: Mapping[str, str]) -> str:
    """Replace the known placeholders only (TOML braces such as inline tables stay as they are)."""
    for key, value in places.items():
        text = text.replace(key, value)
    return text


@dataclass(frozen=True)
class Mistake:
    """One row: run ``entry`` with ``argv`` (and ``env``) after ``setup``; the error line contains ``fragment``."""

    entry: str
    argv: tuple[str, ...]
    fragment: str
    setup: Setup | None = None
    env: tuple[tuple[str, str], ...] = ()

    def key(self) -> tuple[Any, ...]:
        """What makes a mistake distinct: the command as typed (environment variables are part of it)."""
        return (self.entry, self.argv, self.env)


def row(
    entry: str, name: str, argv: Sequence[str], fragment: str, *, setup: Setup | None = None,
    env: Mapping[str, str] | None = None, xfail: str | None = None, needs_no_cuda: bool = False,
) -> Any:
    """One catalogue row as a pytest param; ``xfail`` is the reason of a known violation (strict)."""
    marks: list[Any] = []
    if xfail:
        marks.append(pytest.mark.xfail(strict=True, reason=xfail))
    if needs_no_cuda:  # with a GPU the command is no mistake: it would start working
        marks.append(pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible"))
    mistake = Mistake(entry, tuple(argv), fragment, setup, tuple(sorted((env or {}).items())))
    return pytest.param(mistake, id=f"{entry}:{name}", marks=marks)


# ----- set-ups: the bad files a mistake needs ------------------------------------------------------

def write(files: Mapping[str, str | bytes]) -> Setup:
    """Files relative to the row's folder; text may use the placeholders ({data}, {tmp}, ...)."""

    def setup(tmp: Path, inputs: Inputs) -> None:
        for name, content in files.items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(fill(content, inputs.places(tmp)))

    return setup


def folders(*names: str) -> Setup:
    """Empty folders relative to the row's folder."""

    def setup(tmp: Path, inputs: Inputs) -> None:
        for name in names:
            (tmp / name).mkdir(parents=True, exist_ok=True)

    return setup


def both(*setups: Setup) -> Setup:
    """Several set-ups in order (their clean-ups, if any, run in reverse)."""

    def setup(tmp: Path, inputs: Inputs) -> Cleanup | None:
        cleanups = [c for c in (s(tmp, inputs) for s in setups) if c is not None]

        def cleanup() -> None:
            for c in reversed(cleanups):
                c()

        return cleanup if cleanups else None

    return setup


def token_folder(
    name: str, train: np.ndarray | None = None, val: np.ndarray | None = None,
    meta: Callable[[dict[str, Any]], Any] | None = None, drop: Sequence[str] = (), raw: Mapping[str, bytes] | None = None,
) -> Setup:
    """A token folder in the prepare format (byte tokenizer), then damaged as a mistake needs.

    ``meta`` edits the meta.json dict in place; ``drop`` removes files; ``raw`` replaces file bytes.
    """
    ok = np.full(600, 65, dtype=np.uint16)  # long enough for TRAIN's seq_len of 32

    def setup(tmp: Path, inputs: Inputs) -> None:
        folder = write_token_folder(tmp / name, ok if train is None else train, ok if val is None else val)
        if meta is not None:
            content = json.loads((folder / "meta.json").read_text())
            meta(content)
            (folder / "meta.json").write_text(json.dumps(content))
        for file_name, content in (raw or {}).items():
            (folder / file_name).write_bytes(content)
        for file_name in drop:
            (folder / file_name).unlink()

    return setup


def tokenizer_json(name: str, special: Sequence[str] = ("<|endoftext|>",)) -> Setup:
    """A small Hugging Face tokenizer.json (WordLevel: w0..w9, [UNK], then ``special``), made by the tokenizers
    library."""

    def setup(tmp: Path, inputs: Inputs) -> None:
        from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({**{f"w{i}": i for i in range(10)}, "[UNK]": 10}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.add_special_tokens([AddedToken(s, special=True) for s in special])
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(tmp / name))

    return setup


#: A model of an hf tokenizer.json (13 ids) whose checkpoint carries no tokenizer.json (generate.py must say so).
HF_MODEL_META = {"tokenizer": {"name": "hf", "vocab_size": 12, "eot_id": 11, "eot_token": "<|endoftext|>",
                               "tokenizer_sha256": "0" * 64}}


def checkpoint(name: str, meta: Mapping[str, Any] | None = None, **model: Any) -> Setup:
    """A trainer-like checkpoint folder (tests/helpers/checkpoints.py) of a tiny model, with extra metadata."""

    def setup(tmp: Path, inputs: Inputs) -> None:
        write_checkpoint(tmp / name, tiny_model(**model), **dict(meta or {}))

    return setup


def copy_of(source: str, name: str, damage: Callable[[Path], Any] | None = None) -> Setup:
    """A copy of a shared input ({ckpt}, {run}, {export}, {runs}/a ...) in the row's folder, then damaged."""

    def setup(tmp: Path, inputs: Inputs) -> None:
        target = tmp / name
        shutil.copytree(fill(source, inputs.places(tmp)), target)
        if damage is not None:
            damage(target)

    return setup


def edit_json(name: str, change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """A damage: edit one JSON file of the copied folder."""

    def damage(folder: Path) -> None:
        content = json.loads((folder / name).read_text())
        change(content)
        (folder / name).write_text(json.dumps(content))

    return damage


def overwrite(name: str, content: str | bytes) -> Callable[[Path], None]:
    """A damage: replace one file of the copied folder."""

    def damage(folder: Path) -> None:
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())

    return damage


def truncate_shard(folder: Path) -> None:
    """A damage: cut a checkpoint's first DCP shard to 100 bytes (a save killed mid-write, a full disk)."""
    shard = min(folder.rglob("*.distcp"))
    with shard.open("r+b") as f:
        f.truncate(100)


def hold_run_lock(run: str) -> Setup:
    """Another trainer on the run folder: this process holds its lock until the row is done."""

    def setup(tmp: Path, inputs: Inputs) -> Cleanup:
        from torchnlq.train.run_lock import RunLock

        lock = RunLock(fill(run, inputs.places(tmp))).acquire()
        return lock.release

    return setup


def suite(body: str, name: str = "s.toml") -> Setup:
    """A suite file in the row's folder; ``{config}`` is the shared valid training config."""
    return write({name: body})


# ----- the valid commands each row breaks in one place ----------------------------------------------

#: A tiny, valid training run on the shared token folder: each run_train.sh row adds one mistake to it
#: (the shared inputs are made with it: conftest.py).
TRAIN = (
    "--job.dump_folder={tmp}/outputs", "--job.name=run", "--model.flavor=debug", "--model.n_layers=1",
    "--model.dim=32", "--model.n_heads=2", "--training.steps=2", "--training.seq_len=32",
    "--training.micro_batch_size=2", "--training.device=cpu", "--data.path={data}", "--data.tokenizer=byte",
    "--validation.sequences=4", "--metrics.log_interval=1",
)
T = "run_train.sh"  # ./run_train.sh [CONFIG.toml] [--section.key value ...] (python -m torchnlq.train)
P = "run_train.sh NGPU=2"  # with NGPU > 1 run_train.sh first runs python -m torchnlq.train --preflight
BYTES_300 = np.full(600, 300, dtype=np.uint16)  # token ids the byte tokenizer (257 ids) does not have


def gpt2_checkpoint(name: str = "gpt2") -> Setup:
    """A gpt2-tokenized checkpoint of a tiny model that carries no BPE ranks (as older checkpoints)."""
    return checkpoint(name, meta={"tokenizer": {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}},
                      n_layers=1, dim=8, n_heads=2, vocab_size=50304, max_seq_len=16)


# Hugging Face GPT-2 folders that torchnlq must refuse to read (upcycle.py, initial_load_path).
HF_CONFIG = '{"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 1, "vocab_size": 320, "n_positions": 64}'
HF_PICKLED = write({"hf/config.json": HF_CONFIG, "hf/pytorch_model.bin": "not unpickled"})


def set_key(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of a JSON dict: set the dotted ``path`` to ``value``."""

    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for part in parents:
            d = d[part]
        d[last] = value

    return change


def drop_key(key: str) -> Callable[[dict[str, Any]], None]:
    """An edit of a JSON dict: remove ``key``."""
    return lambda d: d.pop(key)
