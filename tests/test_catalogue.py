"""A catalogue of user mistakes: what happens when I get X wrong, for every entry point of torchnlq.

Read it as a table (``IN_PROCESS`` and ``SUBPROCESS`` below, grouped by entry point). Each row is one
mistake a user can make: the command, its arguments (and the bad files lying around, written by the
row's ``setup``), and a fragment the error line must contain, so that a row cannot pass with some other
error. Its test id reads ``entry:mistake``. Every mistake must end the same way, the project's rule:

* exit code 2;
* exactly one line on stderr, starting with ``error:``, that says what is wrong and how to fix it;
* no Python traceback, on stdout or stderr;
* nothing written or deleted: a snapshot of every path under the row's folder (the parent of its
  working directory, so ``..`` is watched too) and under the shared inputs (each file's sha256 and
  mtime) is the same before and after.

Most rows run in this process: the entry point's ``main(argv)`` through :func:`torchnlq.cli.run_cli`,
as its ``__main__`` block calls it (a Python process with torch for each row would take minutes). An
exception escaping ``main`` is what a user would see as a traceback: the row fails with it. Python
warnings are counted as stderr lines, as a terminal shows them. What only a real process shows (log
handlers bound to the real stderr, messages of torch's C++ side, the shell script itself) is covered
by a few rows run as processes: one per Python entry point, and run_train.sh's own checks
(``test_mistake_in_a_subprocess``, marked ``integration``).

Caches are outside the snapshots by design: this test's HF_HOME, TIKTOKEN_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR (tests/conftest.py, and the subprocesses' own) and the TORCHNLQ_CACHE folder it
gives run_train.sh. Everything else counts, including the cache folder run_train.sh creates by default.

A row marked ``xfail`` (strict) is a known violation, not fixed yet; its reason names the cause and the
file where the fix belongs. When the fix lands the row passes, strict xfail fails, and the mark comes off.

To add a mistake: add a ``row(entry, name, argv, fragment, setup=...)`` to its entry point's group;
``argv`` and file contents may use the placeholders of :meth:`Inputs.places` ({tmp}, {data}, {ckpt} ...).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import REPO_ROOT
from helpers.checkpoints import load_script, tiny_model, write_byte_data, write_checkpoint
from helpers.data import write_token_folder
from helpers.train import script_env

from torchnlq.cli import LAUNCH_DIR_ENV, run_cli

# ==================================================================================================
# The table's vocabulary: a row, the placeholders of its command line, the set-ups of its bad files
# ==================================================================================================

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

#: A tiny, valid training run on the shared token folder: each run_train.sh row adds one mistake to it.
TRAIN = (
    "--job.dump_folder={tmp}/outputs", "--job.name=run", "--model.flavor=debug", "--model.n_layers=1",
    "--model.dim=32", "--model.n_heads=2", "--training.steps=2", "--training.seq_len=32",
    "--training.micro_batch_size=2", "--training.device=cpu", "--data.path={data}", "--data.tokenizer=byte",
    "--validation.sequences=4", "--metrics.log_interval=1",
)
#: TRAIN resuming a real run: a copy of the shared run folder (RESUMABLE), so a resume that goes wrong
#: could only spoil the row's own copy.
RESUME = (*TRAIN, "--job.dump_folder={tmp}/resume")
#: scripts/bench.py's tiny config (tests/test_bench.py): a few milliseconds per step on a CPU.
BENCH = (
    "--model.flavor=debug", "--model.n_layers=1", "--model.dim=32", "--model.n_heads=2", "--training.seq_len=32",
    "--training.micro_batch_size=2", "--training.grad_accum_steps=2", "--training.device=cpu", "--data.tokenizer=byte",
)
#: scripts/bench_attention.py at a tiny shape.
ATTENTION = ("--dim", "32", "--heads", "4", "--seq", "8", "--steps", "1", "--warmup", "0")
#: A suite of one run of the shared config: a suite row adds one mistake to it.
SUITE = 'config = "{config}"\n'
#: Two text documents for prepare_data.py, enough for a train and a validation split.
DOCS = {"src/a.txt": "the first document", "src/b.txt": "the second document"}
NANO = {"nano/train.bin": bytes(100), "nano/val.bin": bytes(100)}
#: A folder that passes bench_nanogpt.py's checkout check, and its two modes on the CPU.
NANOGPT = {"ng/train.py": "", "ng/model.py": "", "ng/configurator.py": ""}
NANO_CPU = ("--nanogpt", "{tmp}/ng", "--mode", "cpu-seconds")
NANO_PROFILE = ("--nanogpt", "{tmp}/ng", "--mode", "profile", "--device", "cpu")  # a nanoGPT folder: uint16 zeros, no meta.json
#: A folder with the files bench_torchtitan.py looks for, whose trainer does not import.
TORCHTITAN = {"tt/torchtitan/__init__.py": "", "tt/torchtitan/train.py": "",
              "tt/torchtitan/models/llama3/config_registry.py": ""}
#: prepare_data.py into a new folder with the byte tokenizer (no download, no tiktoken file).
PREPARE = ("--out", "{tmp}/tokens", "--tokenizer", "byte")

RESUMABLE = copy_of("{run}", "resume/run")
#: The copy, and another trainer on it: this process holds its lock file until the row is done.
BUSY = both(RESUMABLE, hold_run_lock("{tmp}/resume/run"))

# A known violation would be a row with ``xfail="<reason>"`` (strict); none are left.

# ==================================================================================================
# The catalogue, in-process rows: what happens when I get X wrong
# ==================================================================================================

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


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of a JSON dict: set the dotted ``path`` to ``value``."""

    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for part in parents:
            d = d[part]
        d[last] = value

    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.pop(key)


IN_PROCESS = [
    # ---------------------------------------------------------------- run_train.sh: the TOML file
    row(T, "config-file-missing", ["missing.toml", *TRAIN], "config file 'missing.toml' not found"),
    row(T, "loss-chunk-negative", [*TRAIN, "--training.loss_chunk_tokens=-1"], "training.loss_chunk_tokens"),
    row(T, "compile-loss-removed", [*TRAIN, "--training.compile_loss=true"], "training.compile_loss was removed"),
    row(T, "config-in-utf16", ["{tmp}/u16.toml", *TRAIN], "(it starts with a UTF-16 byte-order mark)",
        setup=write({"u16.toml": "\ufeff[training]\nsteps = 2\n".encode("utf-16")})),
    row(T, "config-key-with-a-zero-width-space", ["{tmp}/zw.toml", *TRAIN],
        "the line holds U+200B (ZERO WIDTH SPACE) there; retype it", setup=write({"zw.toml": "[training]\nst\u200beps = 2\n"})),
    row(T, "config-quoted-key-with-a-zero-width-space", ["{tmp}/zwq.toml", *TRAIN],
        "contains U+200B (ZERO WIDTH SPACE) at position 11", setup=write({"zwq.toml": '[training]\n"st\u200beps" = 2\n'})),
    row(T, "override-key-with-a-non-breaking-space", [*TRAIN, "--training.steps\u00a0=2"],
        "contains U+00A0 (NO-BREAK SPACE) at position 14"),
    row(T, "config-section-with-a-cyrillic-letter", ["{tmp}/cy.toml", *TRAIN],
        "the line holds U+0430 (CYRILLIC SMALL LETTER A) there", setup=write({"cy.toml": "[tr\u0430ining]\nsteps = 2\n"})),
    row(T, "config-quoted-section-with-a-cyrillic-letter", ["{tmp}/cyq.toml", *TRAIN],
        "contains U+0430 (CYRILLIC SMALL LETTER A) at position 2", setup=write({"cyq.toml": '["tr\u0430ining"]\nsteps = 2\n'})),
    row(T, "validation-protocol-unknown", [*TRAIN, "--validation.protocol=papr"], "paper"),
    row(T, "model-init-unknown", [*TRAIN, "--model.init=nanogpt"], "model.init"),
    row(T, "paper-rows-too-few-for-the-run", [*TRAIN, "--validation.protocol=paper", "--validation.interval=1",
        "--training.steps=600"], "raise validation.interval to at least 2"),
    row(T, "config-file-is-a-folder", ["configs", *TRAIN], "config file 'configs' is a folder", setup=folders("configs")),
    row(T, "toml-syntax-error", ["syntax.toml", *TRAIN], "is not valid TOML",
        setup=write({"syntax.toml": "[training\nsteps = 3\n"})),
    row(T, "toml-not-utf8", ["latin1.toml", *TRAIN], "is not UTF-8 text",
        setup=write({"latin1.toml": b'[job]\ndescription = "caf\xe9"\n'})),
    row(T, "toml-unknown-section", ["trainer.toml", *TRAIN], "unknown section '[trainer]'; did you mean 'training'?",
        setup=write({"trainer.toml": "[trainer]\nsteps = 3\n"})),
    row(T, "toml-unknown-key", ["stesp.toml", *TRAIN], "unknown key 'training.stesp' in training; did you mean 'steps'?",
        setup=write({"stesp.toml": "[training]\nstesp = 3\n"})),
    row(T, "toml-key-outside-any-section", ["bare.toml", *TRAIN], "key 'steps' is outside any section",
        setup=write({"bare.toml": "steps = 3\n"})),
    row(T, "toml-array-of-tables", ["array.toml", *TRAIN], "[[training]] is an array of tables",
        setup=write({"array.toml": "[[training]]\nsteps = 3\n"})),
    row(T, "toml-unknown-subsection", ["sub.toml", *TRAIN], "unknown section '[model.query.extra]'",
        setup=write({"sub.toml": "[model.query.extra]\n"})),
    row(T, "toml-section-as-a-key", ["query.toml", *TRAIN], "'model.query' is a section, not a key",
        setup=write({"query.toml": '[model]\nquery = "linear"\n'})),
    row(T, "toml-key-as-a-section", ["steps.toml", *TRAIN], "'training.steps' is a key, not a section",
        setup=write({"steps.toml": "[training.steps]\nvalue = 3\n"})),
    row(T, "toml-key-twice", ["twice.toml", *TRAIN], "Cannot overwrite a value",
        setup=write({"twice.toml": "[training]\nsteps = 3\nsteps = 4\n"})),
    row(T, "toml-section-twice", ["sections.toml", *TRAIN], "Cannot declare ('model',) twice",
        setup=write({"sections.toml": "[model]\ndim = 32\n[model]\nn_layers = 1\n"})),
    row(T, "toml-string-for-an-integer", ["ten.toml", *TRAIN], "training.steps expects int, got str 'ten'",
        setup=write({"ten.toml": '[training]\nsteps = "ten"\n'})),
    row(T, "toml-float-for-an-integer", ["half.toml", *TRAIN], "training.steps expects int, got float 1.5",
        setup=write({"half.toml": "[training]\nsteps = 1.5\n"})),
    row(T, "toml-integer-for-a-boolean", ["one.toml", *TRAIN], "training.compile expects bool, got int 1",
        setup=write({"one.toml": "[training]\ncompile = 1\n"})),
    row(T, "toml-string-for-a-float", ["lr.toml", *TRAIN], "optimizer.lr expects float, got str '3e-4'",
        setup=write({"lr.toml": '[optimizer]\nlr = "3e-4"\n'})),
    row(T, "toml-list-for-an-integer", ["list.toml", *TRAIN], "training.steps expects int, got list",
        setup=write({"list.toml": "[training]\nsteps = [1, 2]\n"})),
    row(T, "toml-date-for-an-integer", ["date.toml", *TRAIN], "training.steps expects int, got date",
        setup=write({"date.toml": "[training]\nsteps = 2024-01-01\n"})),
    row(T, "toml-nan", ["nan.toml", *TRAIN], "optimizer.lr must be a finite number, got nan",
        setup=write({"nan.toml": "[optimizer]\nlr = nan\n"})),
    row(T, "toml-inf", ["inf.toml", *TRAIN], "training.max_norm must be a finite number, got inf",
        setup=write({"inf.toml": "[training]\nmax_norm = inf\n"})),
    row(T, "toml-below-the-minimum", ["accum.toml", *TRAIN], "training.grad_accum_steps must be >= 1, got 0",
        setup=write({"accum.toml": "[training]\ngrad_accum_steps = 0\n"})),
    row(T, "toml-above-the-maximum", ["beta.toml", *TRAIN], "optimizer.beta2 must be < 1.0, got 1.5",
        setup=write({"beta.toml": "[optimizer]\nbeta2 = 1.5\n"})),
    row(T, "toml-zero-learning-rate", ["zero.toml", *TRAIN], "optimizer.lr must be > 0.0, got 0.0",
        setup=write({"zero.toml": "[optimizer]\nlr = 0.0\n"})),
    row(T, "toml-value-not-a-choice", ["fp16.toml", *TRAIN], "training.mixed_precision: 'fp16' is not one of bf16, fp32",
        setup=write({"fp16.toml": '[training]\nmixed_precision = "fp16"\n'})),
    row(T, "toml-choice-typo", ["skp.toml", *TRAIN], "did you mean 'skip'?",
        setup=write({"skp.toml": '[training]\non_nonfinite = "skp"\n'})),
    row(T, "toml-inline-table-unknown-name", ["inline.toml", *TRAIN], "model.query.type: unknown 'mlp'",
        setup=write({"inline.toml": '[model]\nquery = {type = "mlp"}\n'})),
    row(T, "toml-extends-itself", ["self.toml", *TRAIN], "extends itself",
        setup=write({"self.toml": 'extends = "self.toml"\n'})),
    row(T, "toml-extends-in-a-cycle", ["a.toml", *TRAIN], "b.toml -> ",
        setup=write({"a.toml": 'extends = "b.toml"\n', "b.toml": 'extends = "a.toml"\n'})),
    row(T, "toml-extends-a-missing-file", ["child.toml", *TRAIN], "base.toml' not found",
        setup=write({"child.toml": 'extends = "base.toml"\n'})),
    row(T, "toml-extends-not-a-string", ["three.toml", *TRAIN], "extends must be a file name string, got 3",
        setup=write({"three.toml": "extends = 3\n"})),
    row(T, "two-config-files", ["first.toml", "second.toml", *TRAIN], "two config files given ('first.toml' and 'second.toml')",
        setup=write({"first.toml": "[job]\n", "second.toml": "[job]\n"})),
    row(T, "wandb-mode-unknown", [*TRAIN, "--metrics.wandb_mode=ofline"],
        "metrics.wandb_mode: 'ofline' is not one of online, offline, disabled"),
    row(T, "wandb-project-with-a-slash", [*TRAIN, "--metrics.wandb=true", "--metrics.wandb_project=team/proj"],
        "metrics.wandb_project='team/proj' contains /"),
    row(T, "wandb-project-empty", [*TRAIN, "--metrics.wandb=true", "--metrics.wandb_project="],
        "metrics.wandb_project='' is empty"),
    row(T, "wandb-project-too-long", [*TRAIN, "--metrics.wandb=true", "--metrics.wandb_project=" + "p" * 129],
        "is over 128 characters"),
    row(T, "wandb-not-a-boolean", [*TRAIN, "--metrics.wandb=maybe"], "--metrics.wandb expects true or false, got 'maybe'"),
    row(T, "weight-dynamics-interval-negative", [*TRAIN, "--metrics.weight_dynamics_interval=-1"],
        "metrics.weight_dynamics_interval"),
    row(T, "mlp-activation-unknown", [*TRAIN, "--model.mlp_activation=relu"], "model.mlp_activation"),
    row(T, "norm-unknown", [*TRAIN, "--model.norm=batch"], "model.norm"),
    row(T, "optimizer-groups-on-the-command-line", [*TRAIN, "--optimizer.groups=x"],
        "--optimizer.groups is a list of tables: write it in a TOML config as [[optimizer.groups]] entries"),
    row(T, "optimizer-group-pattern-matches-nothing", ["{tmp}/g.toml"], "'wq' matches no parameter of this model",
        setup=write({"g.toml": '[model]\nflavor = "debug"\n[data]\ntokenizer = "byte"\nsynthetic = true\n'
                     'path = "{tmp}/syn"\n[[optimizer.groups]]\nname = "wq"\nparams = ["layers.*.attn.wq.weight"]\n'})),
    row(T, "optimizer-group-unknown-key", ["{tmp}/g2.toml"], "unknown key 'optimizer.groups[0].lr'",
        setup=write({"g2.toml": '[[optimizer.groups]]\nname = "x"\nlr = 2.0\n'})),
    row(T, "optimizer-group-not-a-table", ["{tmp}/g3.toml"], "optimizer.groups is written as [[optimizer.groups]] tables",
        setup=write({"g3.toml": '[optimizer]\ngroups = ["x"]\n'})),
    row(T, "muon-adjust-lr-unknown", [*TRAIN, "--optimizer.muon_adjust_lr=kimi"], "optimizer.muon_adjust_lr"),
    row(T, "decay-length-with-the-cosine", [*TRAIN, "--lr_schedule.decay_length=5"],
        "lr_schedule.decay_length is the decay tail of lr_schedule.name = 'wsd'"),
    row(T, "wsd-decay-longer-than-the-run", [*TRAIN, "--lr_schedule.name=wsd", "--lr_schedule.decay_length=100000"],
        "there is no stable phase"),
    row(T, "qk-norm-not-a-bool", [*TRAIN, "--model.qk_norm=maybe"], "model.qk_norm"),
    row(T, "mlp-multiple-of-zero", [*TRAIN, "--model.mlp_activation=swiglu", "--model.mlp_multiple_of=0"],
        "model.mlp_multiple_of"),
    row(T, "paper-init-with-a-llama-block", [*TRAIN, "--model.init=paper", "--model.norm=rms"],
        "model.init='paper' repeats the draws of the paper's GPT-2 block"),
    row(T, "rope-scaling-with-learned-positions", [*TRAIN, "--model.rope_scaling_factor=8"],
        "model.rope_scaling_factor=8.0 scales RoPE frequencies, but model.positions='learned'"),
    row(T, "rope-scaling-below-one", [*TRAIN, "--model.positions=rope", "--model.rope_scaling_factor=0.5"],
        "model.rope_scaling_factor"),
    row(T, "rope-high-freq-below-low", [*TRAIN, "--model.positions=rope", "--model.rope_scaling_factor=8",
                                        "--model.rope_high_freq_factor=0.5"], "must exceed model.rope_low_freq_factor"),
    row(T, "anchored-layers-outside-the-model", [*TRAIN, "--model.query.type=anchored", "--model.query.layers=5"],
        "names blocks outside 0..0"),
    row(T, "initial-load-of-an-export-with-its-optimizer", [*TRAIN, "--checkpoint.initial_load_path={export}",
        "--checkpoint.initial_load_model_only=false"], "is an export: it holds weights, no optimizer state"),
    row(T, "initial-load-of-an-export-of-another-shape", [*TRAIN, "--checkpoint.initial_load_path={export}",
        "--model.bias=true"], "was saved with model.bias=None but this run has model.bias=True"),
    row(T, "initial-load-of-a-pickled-hugging-face-folder", [*TRAIN, "--checkpoint.initial_load_path={tmp}/hf"],
        "which torchnlq does not unpickle", setup=HF_PICKLED),
    row(T, "config-file-option-without-a-file", [*TRAIN, "--job.config_file"], "--job.config_file needs a TOML file"),
    row(T, "config-file-option-and-a-positional-config", ["first.toml", "--job.config_file", "second.toml", *TRAIN],
        "two config files given ('first.toml' and 'second.toml')",
        setup=write({"first.toml": "[job]\n", "second.toml": "[job]\n"})),
    row(T, "config-file-option-missing-file", ["--job.config_file={tmp}/nope.toml", *TRAIN], "nope.toml' not found"),
    row(T, "print-config-of-a-config-that-cannot-run", [*TRAIN, "--model.n_heads=3", "--print-config"],
        "n_heads"),
    # ---------------------------------------------------------------- run_train.sh: --section.key overrides
    row(T, "unknown-section", [*TRAIN, "--trainig.steps=3"], "unknown section 'trainig' in config; did you mean 'training'?"),
    row(T, "unknown-key", [*TRAIN, "--training.stesp=3"], "unknown key 'training.stesp' in training; did you mean 'steps'?"),
    row(T, "key-without-a-section", [*TRAIN, "--steps=3"], "option '--steps' must be --section.key"),
    row(T, "key-without-a-value", [*TRAIN, "--training.steps"], "--training.steps needs a value"),
    row(T, "not-an-integer", [*TRAIN, "--training.steps=ten"], "--training.steps expects an integer, got 'ten'"),
    row(T, "not-a-number", [*TRAIN, "--optimizer.lr=fast"], "--optimizer.lr expects a number, got 'fast'"),
    row(T, "not-a-boolean", [*TRAIN, "--training.compile=maybe"], "--training.compile expects true or false, got 'maybe'"),
    row(T, "none-for-a-required-integer", [*TRAIN, "--training.steps=none"], "--training.steps expects an integer, got 'none'"),
    row(T, "nan-learning-rate", [*TRAIN, "--optimizer.lr=nan"], "optimizer.lr must be a finite number, got nan"),
    row(T, "float-overflowing-to-inf", [*TRAIN, "--training.max_norm=1e999"], "training.max_norm must be a finite number, got inf"),
    row(T, "negative-seed", [*TRAIN, "--training.seed=-1"], "training.seed must be >= 0, got -1"),
    row(T, "seed-above-2**64-1", [*TRAIN, f"--data.seed={2**64}"], f"data.seed must be <= {2**64 - 1}"),
    row(T, "value-not-a-choice", [*TRAIN, "--training.device=tpu"], "training.device: 'tpu' is not one of auto, cuda, cpu"),
    row(T, "section-as-a-key", [*TRAIN, "--model.query=linear"], "'model.query' is a section, not a key"),
    row(T, "key-as-a-section", [*TRAIN, "--training.steps.max=3"], "'training.steps' is a key, not a section"),
    row(T, "zero-micro-batch", [*TRAIN, "--training.micro_batch_size=0"], "training.micro_batch_size must be >= 1, got 0"),
    row(T, "dp-shard-below-minus-one", [*TRAIN, "--parallelism.dp_shard=-2"], "parallelism.dp_shard must be >= -1, got -2"),
    row(T, "zero-peak-tflops", [*TRAIN, "--metrics.peak_tflops=0"], "metrics.peak_tflops must be > 0.0, got 0.0"),
    row(T, "unknown-optimizer", [*TRAIN, "--optimizer.name=sgd"], "optimizer.name: 'sgd' is not one of adamw, adamw8bit"),
    # ---------------------------------------------------------------- run_train.sh: rules between sections
    row(T, "query-type-typo", [*TRAIN, "--model.query.type=residual_mpl"],
        "model.query.type: unknown 'residual_mpl'; did you mean 'residual_mlp'?"),
    row(T, "activation-typo", [*TRAIN, "--model.query.activation=gleu"], "model.query.activation: unknown 'gleu'; did you mean 'gelu'?"),
    row(T, "unknown-norm", [*TRAIN, "--model.query.input_norm=batch"], "model.query.input_norm: unknown 'batch'"),
    row(T, "flavor-typo", [*TRAIN, "--model.flavor=gpt_smal"], "model.flavor: unknown 'gpt_smal'; did you mean 'gpt_small'?"),
    row(T, "unknown-positions", [*TRAIN, "--model.positions=alibi"], "model.positions: unknown 'alibi'"),
    row(T, "synthetic-corpus-with-gpt2", [*TRAIN, "--data.synthetic=true", "--data.tokenizer=gpt2"],
        'data.synthetic = true writes a byte-level corpus; set data.tokenizer = "byte"'),
    row(T, "min-lr-above-lr", [*TRAIN, "--optimizer.lr=1e-3", "--lr_schedule.min_lr=1e-2"],
        "lr_schedule.min_lr=0.01 is above optimizer.lr=0.001"),
    row(T, "export-without-checkpoints", [*TRAIN, "--checkpoint.enabled=false", "--checkpoint.export_at_end=true"],
        "checkpoint.export_at_end exports the final checkpoint; set checkpoint.enabled = true"),
    row(T, "seq-len-above-the-positions", [*TRAIN, "--training.seq_len=4096"],
        "training.seq_len=4096 exceeds the model's max_seq_len=256"),
    row(T, "heads-do-not-divide-dim", [*TRAIN, "--model.n_heads=5"], "model.n_heads=5 does not divide model.dim=32"),
    row(T, "kv-heads-do-not-divide-heads", [*TRAIN, "--model.n_kv_heads=3"], "model.n_kv_heads=3 must be in 1..2"),
    row(T, "rope-with-an-odd-head-dim", [*TRAIN, "--model.positions=rope", "--model.n_heads=32"],
        "model.positions='rope' needs an even head_dim, got dim/n_heads = 1"),
    row(T, "mlp-ratio-rounding-to-zero", [*TRAIN, "--model.mlp_ratio=0.001"], "model.mlp_ratio=0.001 gives an MLP of 0 units"),
    row(T, "bottleneck-rounding-to-zero", [*TRAIN, "--model.query.type=residual_mlp", "--model.query.bottleneck_ratio=0.001"],
        "model.query.bottleneck_ratio=0.001 gives r = round(0.001*32) = 0"),
    row(T, "removed-fuse-kv", [*TRAIN, "--model.query.fuse_kv=true"], "model.query.fuse_kv was removed"),
    # Plugins, options that cannot both take effect, sizes that cannot be allocated (issues 19, 20).
    row(T, "plugin-module-missing", [*TRAIN, "--job.plugins=no_such_plugin_module"],
        "job.plugins: cannot import 'no_such_plugin_module'"),
    row(T, "plugin-not-a-module-name", [*TRAIN, "--job.plugins=../evil"], "job.plugins: '../evil' is not a module name"),
    row(T, "load-step-without-resume", [*TRAIN, "--checkpoint.load_step=4", "--checkpoint.resume=false"],
        "checkpoint.load_step=4 picks the checkpoint to resume from, but checkpoint.resume = false"),
    row(T, "decay-shorter-than-warmup", [*TRAIN, "--lr_schedule.warmup_steps=10", "--lr_schedule.decay_steps=5"],
        "lr_schedule.decay_steps=5 is shorter than lr_schedule.warmup_steps=10"),
    row(T, "adamw-beta-of-one", [*TRAIN, "--optimizer.beta2=1.0"], "optimizer.beta2 must be < 1.0"),
    row(T, "vocabulary-beyond-ram", [*TRAIN, "--model.vocab_size=1000000000"],
        "GiB per process for weights, gradients and AdamW state alone, more than this machine's RAM"),
    row(T, "config-nested-too-deeply", ["{tmp}/deep.toml"], "is nested too deeply for a config",
        setup=write({"deep.toml": "a = " + "[" * 5000 + "]" * 5000 + "\n"})),
    row(T, "job-name-with-a-slash", [*TRAIN, "--job.name=runs/a"], "job.name='runs/a' is not a plain folder name"),
    row(T, "job-name-dot-dot", [*TRAIN, "--job.name=.."], "job.name='..' is not a plain folder name"),
    # ---------------------------------------------------------------- run_train.sh: devices and parallelism
    row(T, "cuda-without-a-gpu", [*TRAIN, "--training.device=cuda"], "training.device='cuda' but no CUDA device is visible",
        needs_no_cuda=True),
    row(T, "float8-on-a-cpu", [*TRAIN, "--float8.enabled=true"], "float8.enabled needs a GPU with float8 support"),
    row(T, "memory-snapshot-on-a-cpu", [*TRAIN, "--profiling.memory_snapshot=true"],
        "profiling.memory_snapshot records CUDA's allocator, and this run trains on the CPU"),
    # ---------------------------------------------------------------- run_train.sh: profiling and debug
    row(T, "profiling-active-zero", [*TRAIN, "--profiling.enabled=true", "--profiling.active=0"],
        "profiling.active must be >= 1, got 0"),
    row(T, "profiling-warmup-zero", [*TRAIN, "--profiling.warmup=0"], "profiling.warmup must be >= 1, got 0"),
    row(T, "profiling-wait-negative", [*TRAIN, "--profiling.wait=-1"], "profiling.wait must be >= 0, got -1"),
    row(T, "profiling-repeat-negative", [*TRAIN, "--profiling.repeat=-2"], "profiling.repeat must be >= 0, got -2"),
    row(T, "profiling-active-not-a-number", [*TRAIN, "--profiling.active=two"],
        "--profiling.active expects an integer, got 'two'"),
    row(T, "profiling-section-misspelled", [*TRAIN, "--profiler.enabled=true"],
        "unknown section 'profiler' in config; did you mean 'profiling'?"),
    row(T, "deterministic-not-a-boolean", [*TRAIN, "--debug.deterministic=always"],
        "--debug.deterministic expects true or false, got 'always'"),
    row(T, "fused-adamw8bit", [*TRAIN, "--optimizer.name=adamw8bit", "--optimizer.fused=true"],
        "optimizer.fused = true is torch's fused AdamW kernel"),
    row(T, "dp-replicate-above-the-world-size", [*TRAIN, "--parallelism.dp_replicate=2"],
        "parallelism.dp_replicate=2 does not divide the world size 1"),
    row(T, "dp-shard-above-the-world-size", [*TRAIN, "--parallelism.dp_shard=2"], "parallelism.dp_shard=2 = 2 != world size 1"),
    row(T, "dump-folder-is-a-file", [*TRAIN, "--job.dump_folder={tmp}/notes.txt"], "notes.txt",
        setup=write({"notes.txt": "mine"})),
    # ---------------------------------------------------------------- run_train.sh: the data folder
    row(T, "data-folder-missing", [*TRAIN, "--data.path={tmp}/nowhere"],
        "data.path '{tmp}/nowhere' does not exist; prepare it with: "),
    # A GPT-2-token config without its corpus: the offline way out names every override it needs (issue 24).
    row(T, "data-folder-missing-gpt2-tokens", [*TRAIN, "--data.path={tmp}/nowhere", "--data.tokenizer=gpt2"],
        "--files YOUR_TEXT.txt --text-split paragraph --val-fraction 0.1 --tokenizer gpt2 (any text file; the README's "
        "quickstart; OpenWebText: docs/data.md), or train on the offline synthetic corpus: --data.synthetic=true "
        "--data.tokenizer=byte --data.path=./outputs/data/synthetic"),
    row(T, "data-folder-empty", [*TRAIN, "--data.path={tmp}/empty"], "lacks meta.json, train.bin, val.bin",
        setup=folders("empty")),
    row(T, "data-without-meta-json", [*TRAIN, "--data.path={tmp}/nometa"], "data.path '{tmp}/nometa' lacks meta.json (",
        setup=token_folder("nometa", drop=["meta.json"])),
    row(T, "data-without-val-bin", [*TRAIN, "--data.path={tmp}/noval"], "data.path '{tmp}/noval' lacks val.bin",
        setup=token_folder("noval", drop=["val.bin"])),
    row(T, "data-path-is-a-file", [*TRAIN, "--data.path={tmp}/notes.txt"], "is a file, not a data folder",
        setup=write({"notes.txt": "mine"})),
    row(T, "synthetic-corpus-over-a-file", [*TRAIN, "--data.synthetic=true", "--data.path={tmp}/notes.txt"], "notes.txt",
        setup=write({"notes.txt": "mine"})),
    row(T, "token-ids-above-the-vocabulary", [*TRAIN, "--data.path={tmp}/big"], "train.bin holds token id 300",
        setup=token_folder("big", train=BYTES_300)),
    row(T, "recorded-token-id-above-the-vocabulary", [*TRAIN, "--data.path={tmp}/recorded"], "train.bin holds token id 999",
        setup=token_folder("recorded", meta=_set("max_token_id", {"train": 999, "val": 65}))),
    row(T, "train-split-too-short", [*TRAIN, "--data.path={tmp}/short"],
        "train.bin has 20 tokens, fewer than one sequence of seq_len+1=33",
        setup=token_folder("short", train=np.full(20, 65, dtype=np.uint16))),
    row(T, "seq-len-longer-than-the-val-split", [*TRAIN, "--training.seq_len=1000", "--model.max_seq_len=1024"],
        "val.bin has 800 tokens, fewer than one sequence of seq_len+1=1001"),
    row(T, "token-file-of-odd-size", [*TRAIN, "--data.path={tmp}/odd"], "train.bin' has an odd size (1201 bytes)",
        setup=token_folder("odd", raw={"train.bin": b"\0" * 1201})),
    row(T, "meta-json-not-json", [*TRAIN, "--data.path={tmp}/badmeta"], "meta.json' is corrupt",
        setup=token_folder("badmeta", raw={"meta.json": b"{oops"})),
    row(T, "meta-json-without-tokenizer", [*TRAIN, "--data.path={tmp}/notok"], "meta.json' has no 'tokenizer' entry",
        setup=token_folder("notok", meta=_drop("tokenizer"))),
    row(T, "meta-json-token-count-wrong", [*TRAIN, "--data.path={tmp}/count"], "train.bin has 600 tokens but meta.json says 7",
        setup=token_folder("count", meta=_set("tokens.train", 7))),
    row(T, "meta-json-unknown-dtype", [*TRAIN, "--data.path={tmp}/f16"],
        "records token dtype 'float16'; torchnlq reads uint16 or uint32",
        setup=token_folder("f16", meta=_set("dtype", "float16"))),
    row(T, "meta-json-uint32-over-uint16-files", [*TRAIN, "--data.path={tmp}/u32"],
        "has 300 tokens but meta.json says 600", setup=token_folder("u32", meta=_set("dtype", "uint32"))),
    # ---------------------------------------------------------------- run_train.sh: a tokenizer.json (hf)
    row(T, "hf-tokenizer-without-its-file", [*TRAIN, "--data.tokenizer=hf"],
        'data.tokenizer = "hf" reads a Hugging Face tokenizer.json: set data.tokenizer_file'),
    row(T, "tokenizer-file-missing", [*TRAIN, "--data.tokenizer=hf", "--data.tokenizer_file={tmp}/nope.json"],
        "tokenizer file '{tmp}/nope.json' does not exist"),
    row(T, "tokenizer-file-corrupt", [*TRAIN, "--data.tokenizer=hf", "--data.tokenizer_file={tmp}/tokenizer.json"],
        "is not a tokenizer.json the tokenizers library reads", setup=write({"tokenizer.json": '{"model": {'})),
    row(T, "tokenizer-file-is-a-folder", [*TRAIN, "--data.tokenizer=hf", "--data.tokenizer_file={tmp}/llama"],
        "name the file itself: '{tmp}/llama/tokenizer.json'", setup=tokenizer_json("llama/tokenizer.json")),
    row(T, "eot-token-not-in-the-vocabulary", [*TRAIN, "--data.tokenizer=hf", "--data.tokenizer_file={tmp}/t.json",
        "--data.eot_token=<eos>"], "end-of-text token '<eos>' is not in the vocabulary",
        setup=tokenizer_json("t.json")),
    row(T, "tokenizer-json-without-an-end-of-text",
        [*TRAIN, "--data.tokenizer=hf", "--data.tokenizer_file={tmp}/sep.json"], "has none of the end-of-text tokens",
        setup=tokenizer_json("sep.json", special=("<sep>",))),
    row(T, "byte-data-for-an-hf-tokenizer", [*TRAIN, "--data.tokenizer=hf", "--data.tokenizer_file={tmp}/t.json"],
        "was tokenized with 'byte' (meta.json) but data.tokenizer is 'hf'", setup=tokenizer_json("t.json")),
    row(T, "data-of-another-tokenizer-json", [*TRAIN, "--data.path={tmp}/hfdata", "--data.tokenizer=hf",
        "--data.tokenizer_file={tmp}/t.json"], "tokenized with a tokenizer.json of sha256 0000000000000000",
        setup=both(tokenizer_json("t.json"), token_folder("hfdata", meta=lambda m: m.update(
            tokenizer="hf", tokenizer_info={"name": "hf", "tokenizer_sha256": "0" * 64})))),
    row(T, "meta-json-without-vocab-size", [*TRAIN, "--data.path={tmp}/novocab"], "vocab_size",
        setup=token_folder("novocab", meta=_drop("vocab_size"))),
    row(T, "meta-json-vocab-size-not-a-number", [*TRAIN, "--data.path={tmp}/many"], "vocab_size",
        setup=token_folder("many", meta=_set("vocab_size", "many"))),
    row(T, "data-of-another-tokenizer", [*TRAIN, "--data.tokenizer=gpt2"],
        "was tokenized with 'byte' (meta.json) but data.tokenizer is 'gpt2'"),
    row(T, "vocab-size-below-the-data", [*TRAIN, "--model.vocab_size=100"],
        "model.vocab_size=100 is smaller than the data's 257 tokens"),
    # ---------------------------------------------------------------- run_train.sh: resuming and loading checkpoints
    row(T, "resume-with-another-model-width", [*RESUME, "--model.dim=64"],
        "was saved with model.dim=32 but this run has model.dim=64", setup=RESUMABLE),
    row(T, "resume-with-another-data-seed", [*RESUME, "--data.seed=7"],
        "was saved with data.seed=42 but this run has data.seed=7", setup=RESUMABLE),
    row(T, "resume-from-a-step-that-does-not-exist", [*RESUME, "--checkpoint.load_step=5"],
        "checkpoint.load_step=5 not found in {tmp}/resume/run/checkpoints (have: 2)", setup=RESUMABLE),
    row(T, "run-folder-in-use", RESUME, f"is in use by process {os.getpid()}", setup=BUSY),
    # Issue 24.5: a run that left no checkpoint is not trained again beside its own train.log and tb/.
    row(T, "second-start-of-a-run-without-checkpoints", [*TRAIN, "--job.dump_folder={tmp}/again"],
        "{tmp}/again/run already holds a run finished at step 2 and no checkpoint to resume from",
        setup=copy_of("{run}", "again/run", damage=lambda run: shutil.rmtree(run / "checkpoints"))),
    row(T, "second-start-of-an-unfinished-run-without-checkpoints", [*RESUME, "--checkpoint.enabled=false"],
        "holds an unfinished run (recorded at step 0 of 2) and no checkpoint to resume from: training again from "
        "step 0 would mix two runs in its train.log and tb/; use a new --job.name, or pass --job.rerun=true",
        setup=copy_of("{run}", "resume/run", damage=lambda run: (
            shutil.rmtree(run / "checkpoints"), edit_json("run_info.json", lambda info: info.update(
                step=0, finished=False))(run)))),
    row(T, "resume-from-a-truncated-checkpoint", [*TRAIN, "--job.dump_folder={tmp}/cut"], "is truncated (100 of",
        setup=copy_of("{run}", "cut/run", damage=truncate_shard)),
    row(T, "initial-load-path-missing", [*TRAIN, "--checkpoint.initial_load_path={tmp}/nowhere"],
        "checkpoint '{tmp}/nowhere' does not exist"),
    row(T, "initial-load-path-not-a-checkpoint", [*TRAIN, "--checkpoint.initial_load_path={data}"],
        "is not a torchnlq checkpoint (no torchnlq.json)"),
    row(T, "initial-load-path-of-another-shape", [*TRAIN, "--checkpoint.initial_load_path={ckpt}", "--model.dim=64"],
        "checkpoint.initial_load_path {ckpt} was saved with model.dim=32"),
    # ---------------------------------------------------------------- run_train.sh with NGPU=2: the preflight
    row(P, "unknown-key", [*TRAIN, "--training.stesp=3"], "unknown key 'training.stesp'"),
    row(P, "min-lr-above-lr", [*TRAIN, "--optimizer.lr=1e-3", "--lr_schedule.min_lr=1e-2"], "is above optimizer.lr=0.001"),
    row(P, "data-folder-missing", [*TRAIN, "--data.path={tmp}/nowhere"], "data.path '{tmp}/nowhere' does not exist"),
    row(P, "token-ids-above-the-vocabulary", [*TRAIN, "--data.path={tmp}/big"], "train.bin holds token id 300",
        setup=token_folder("big", train=BYTES_300)),
    row(P, "vocab-size-below-the-data", [*TRAIN, "--model.vocab_size=100"], "smaller than the data's 257 tokens"),
    row(P, "run-folder-in-use", RESUME, f"is in use by process {os.getpid()}", setup=BUSY),
    # ---------------------------------------------------------------- prepare_data.py
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
    # ---------------------------------------------------------------- convert_checkpoint.py
    row("convert_checkpoint.py", "output-folder-not-given", ["{ckpt}"], "OUT"),
    row("convert_checkpoint.py", "plugin-module-missing", ["{ckpt}", "{tmp}/out", "--plugins", "no_such_plugin_module"],
        "--plugins: cannot import 'no_such_plugin_module'"),
    row("convert_checkpoint.py", "unknown-dtype", ["{ckpt}", "{tmp}/out", "--dtype", "int8"], "int8"),
    row("convert_checkpoint.py", "checkpoint-missing", ["{tmp}/nowhere", "{tmp}/out"], "'{tmp}/nowhere' does not exist"),
    row("convert_checkpoint.py", "hf-model-without-its-tokenizer-json", ["{tmp}/hftok", "{tmp}/out"],
        "but '{tmp}/hftok' carries none; copy that file into '{tmp}/hftok' as tokenizer.json",
        setup=checkpoint("hftok", meta=HF_MODEL_META, vocab_size=64)),
    row("convert_checkpoint.py", "run-folder-for-a-checkpoint", ["{run}", "{tmp}/out"],
        "(it looks like a run folder: pass one of {run}/checkpoints/step-N)"),
    row("convert_checkpoint.py", "data-folder-for-a-checkpoint", ["{data}", "{tmp}/out"],
        "'{data}' is neither a torchnlq checkpoint"),
    row("convert_checkpoint.py", "output-exists", ["{ckpt}", "{tmp}/out"], "'{tmp}/out' already exists",
        setup=copy_of("{export}", "out")),
    row("convert_checkpoint.py", "output-is-the-checkpoint", ["{ckpt}", "{ckpt}", "--overwrite"], "is the source"),
    row("convert_checkpoint.py", "output-inside-the-checkpoint", ["{ckpt}", "{ckpt}/export"], "lies inside the source"),
    row("convert_checkpoint.py", "output-is-the-run-folder", ["{ckpt}", "{run}", "--overwrite"], "contains the source"),
    row("convert_checkpoint.py", "output-inside-the-checkpoints-folder", ["{ckpt}", "{run}/checkpoints/export"],
        "lies inside the run's checkpoints folder"),
    row("convert_checkpoint.py", "output-is-the-working-directory", ["{ckpt}", ".", "--overwrite"],
        "output folder '.' is the current directory"),
    row("convert_checkpoint.py", "output-is-the-home-folder", ["{ckpt}", "~", "--overwrite"],
        "output folder '~' is the current directory, the home folder", setup=folders("home"), env={"HOME": "{tmp}/home"}),
    row("convert_checkpoint.py", "overwrite-a-folder-that-is-not-an-export", ["{ckpt}", "{tmp}/notes", "--overwrite"],
        "is not a torchnlq export (it holds 'thesis.tex')", setup=write({"notes/thesis.tex": "years of work"})),
    row("convert_checkpoint.py", "overwrite-a-file", ["{ckpt}", "{tmp}/notes.txt", "--overwrite"],
        "'{tmp}/notes.txt' exists and is not a folder", setup=write({"notes.txt": "mine"})),
    row("convert_checkpoint.py", "overwrite-a-symbolic-link", ["{ckpt}", "{tmp}/link", "--overwrite"],
        "'{tmp}/link' is a symbolic link", setup=lambda tmp, inputs: (tmp / "link").symlink_to(inputs.export)),
    row("convert_checkpoint.py", "hf-gpt2-of-a-nonlinear-query", ["{tmp}/mlp", "{tmp}/hf", "--format", "hf-gpt2"],
        "query type residual_mlp has no GPT-2 equivalent", setup=checkpoint("mlp", qtype="residual_mlp")),
    row("convert_checkpoint.py", "hf-gpt2-of-a-rope-model", ["{tmp}/rope", "{tmp}/hf", "--format", "hf-gpt2"],
        "positions='rope': GPT-2 has learned absolute positions only", setup=checkpoint("rope", positions="rope")),
    row("convert_checkpoint.py", "hf-gpt2-of-a-gqa-model", ["{tmp}/gqa", "{tmp}/hf", "--format", "hf-gpt2"],
        "n_kv_heads=2 != n_heads=4 (GQA/MQA)", setup=checkpoint("gqa", n_kv_heads=2)),
    row("convert_checkpoint.py", "checkpoint-metadata-corrupt", ["{tmp}/corrupt", "{tmp}/out"], "torchnlq.json' is corrupt",
        setup=copy_of("{ckpt}", "corrupt", overwrite("torchnlq.json", "{not json"))),
    row("convert_checkpoint.py", "checkpoint-shard-truncated", ["{tmp}/truncated", "{tmp}/out"], "is truncated (100 of",
        setup=copy_of("{ckpt}", "truncated", truncate_shard)),
    row("convert_checkpoint.py", "checkpoint-metadata-of-another-model", ["{tmp}/other", "{tmp}/out"],
        "but the model_args give", setup=copy_of("{ckpt}", "other", edit_json("torchnlq.json", _set("model_args.dim", 64)))),
    row("convert_checkpoint.py", "export-from-a-newer-torchnlq", ["{tmp}/export", "{tmp}/out"],
        "has format_version 99, newer than this torchnlq reads",
        setup=copy_of("{export}", "export", edit_json("config.json", _set("format_version", 99)))),
    row("convert_checkpoint.py", "hugging-face-folder-for-a-checkpoint", ["{tmp}/hf", "{tmp}/out"],
        "is not a torchnlq export (a Hugging Face folder?)",
        setup=write({"hf/config.json": '{"model_type": "gpt2"}', "hf/model.safetensors": "x"})),
    row("convert_checkpoint.py", "unknown-format", ["{ckpt}", "{tmp}/out", "--format", "hf2"], "invalid choice: 'hf2'"),
    row("convert_checkpoint.py", "hf-output-inside-the-checkpoint", ["{ckpt}", "{ckpt}/hf", "--format", "hf"],
        "lies inside the source"),
    row("convert_checkpoint.py", "hf-overwrite-a-folder-that-is-not-an-export",
        ["{ckpt}", "{tmp}/notes", "--format", "hf", "--overwrite"], "is not a torchnlq export",
        setup=write({"notes/mine.txt": "mine"})),
    row("convert_checkpoint.py", "hf-of-a-gpt2-checkpoint-without-ranks-offline", ["{tmp}/gpt2", "{tmp}/hf", "--format", "hf"],
        "the gpt2 tokenizer needs its BPE ranks", setup=gpt2_checkpoint()),
    row("convert_checkpoint.py", "gpt2-checkpoint-whose-carried-ranks-are-damaged", ["{tmp}/damaged", "{tmp}/out"],
        "tokenizer.tiktoken' is corrupt (sha256",
        setup=both(gpt2_checkpoint("damaged"), write({"damaged/tokenizer.tiktoken": "damaged"}))),
    row("convert_checkpoint.py", "gpt2-checkpoint-without-ranks-offline", ["{tmp}/gpt2", "{tmp}/out"],
        "the gpt2 tokenizer needs its BPE ranks: '{tmp}/gpt2' carries none and they were not found offline",
        setup=gpt2_checkpoint()),
    # ---------------------------------------------------------------- bench_inference.py
    row("bench_inference.py", "zero-batch", ["--batch", "0"], "--batch must be at least 1, got 0"),
    row("bench_inference.py", "heads-do-not-divide-dim", ["--heads", "5"], "--heads 5 must divide --dim 768"),
    row("bench_inference.py", "kv-heads-do-not-divide-heads", ["--kv-heads", "5"], "--kv-heads 5 must divide --heads 12"),
    row("bench_inference.py", "json-is-a-folder", ["--json", "{tmp}"], "is a folder; name a file"),
    row("bench_inference.py", "unknown-variant", ["--variants", "quadratic"], "invalid choice: 'quadratic'"),
    row("bench_inference.py", "cuda-without-a-gpu", ["--device", "cuda"], "no CUDA device is visible", needs_no_cuda=True),
    # ---------------------------------------------------------------- bench_cpu_allocator.py
    row("bench_cpu_allocator.py", "no-config", ["--rounds", "2"], "give a config first"),
    row("bench_cpu_allocator.py", "config-missing", ["{tmp}/nope.toml"], "config file '{tmp}/nope.toml' not found"),
    row("bench_cpu_allocator.py", "rounds-zero", ["{config}", "--rounds", "0"], "--rounds must be at least 1, got 0"),
    row("bench_cpu_allocator.py", "steps-not-a-number", ["{config}", "--steps", "few"], "argument --steps: invalid int value: 'few'"),
    row("bench_cpu_allocator.py", "json-in-a-missing-folder", ["{config}", "--json", "{tmp}/no/such/out.json"],
        "must be a file in an existing folder"),
    # ---------------------------------------------------------------- gpu_check.py
    row("gpu_check.py", "cuda-without-a-gpu", ["--device", "cuda"], "for the CPU smoke mode run: ", needs_no_cuda=True),
    row("gpu_check.py", "unknown-query-type", ["--device", "cpu", "--query-types", "quadratic"], "--query-types: unknown 'quadratic'"),
    row("gpu_check.py", "query-type-misspelt", ["--device", "cpu", "--query-types", "residual-mlp"], "did you mean 'residual_mlp'?"),
    row("gpu_check.py", "query-types-without-a-value", ["--device", "cpu", "--query-types"], "argument --query-types: expected at least one argument"),
    row("gpu_check.py", "steps-zero", ["--device", "cpu", "--steps", "0"], "--steps must be at least 1, got 0"),
    row("gpu_check.py", "steps-not-a-number", ["--device", "cpu", "--steps", "two"], "argument --steps: invalid int value: 'two'"),
    row("gpu_check.py", "steps-without-a-value", ["--device", "cpu", "--steps"], "argument --steps: expected one argument"),
    row("gpu_check.py", "warmup-zero", ["--device", "cpu", "--warmup", "0"], "--warmup must be at least 1"),
    row("gpu_check.py", "unknown-device", ["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    row("gpu_check.py", "unknown-compile-backend", ["--device", "cpu", "--compile-backend", "tvm"], "argument --compile-backend: invalid choice: 'tvm'"),
    row("gpu_check.py", "json-is-a-folder", ["--device", "cpu", "--json", "{tmp}"], "is a folder"),
    row("gpu_check.py", "json-in-a-missing-folder", ["--device", "cpu", "--json", "{tmp}/no/such/out.json"], "does not exist"),
    row("gpu_check.py", "json-without-a-value", ["--device", "cpu", "--json"], "argument --json: expected one argument"),
    row("gpu_check.py", "config-missing", ["nowhere.toml", "--device", "cpu"], "config file 'nowhere.toml' not found"),
    row("gpu_check.py", "unknown-config-key", ["--device", "cpu", "--model.query.typo=1"], "unknown key 'model.query.typo'"),
    row("gpu_check.py", "fused-projection-of-a-linear-query", ["--device", "cpu", "--query-types", "linear",
        "--model.query.fuse_kv=true"], "model.query.fuse_kv was removed"),
    # ---------------------------------------------------------------- upcycle.py
    row("upcycle.py", "source-missing", ["{tmp}/nowhere", "{tmp}/out"], "'{tmp}/nowhere' does not exist or is not a folder"),
    row("upcycle.py", "data-folder-for-a-model", ["{data}", "{tmp}/out"], "is neither a Hugging Face GPT-2 or Llama folder"),
    row("upcycle.py", "layers-outside-the-model", ["{ckpt}", "{tmp}/out", "--query", "anchored", "--layers", "1-3"],
        "names blocks outside 0..0"),
    row("upcycle.py", "layers-not-indices", ["{ckpt}", "{tmp}/out", "--query", "anchored", "--layers", "first"],
        "is not 'all' nor block indices"),
    row("upcycle.py", "bottleneck-ratio-zero", ["{ckpt}", "{tmp}/out", "--query", "anchored", "--bottleneck-ratio", "0"],
        "--bottleneck-ratio must be positive"),
    row("upcycle.py", "unknown-activation", ["{ckpt}", "{tmp}/out", "--query", "anchored", "--activation", "tanh"],
        "model.query.activation: unknown 'tanh'"),
    row("upcycle.py", "query-type-that-is-not-an-upcycle", ["{ckpt}", "{tmp}/out", "--query", "residual_mlp"],
        "invalid choice: 'residual_mlp'"),
    row("upcycle.py", "anchor-a-nonlinear-query", ["{tmp}/mlp", "{tmp}/out", "--query", "anchored"],
        "has a 'residual_mlp' query; upcycling needs a pretrained linear W_Q", setup=checkpoint("mlp", qtype="residual_mlp")),
    row("upcycle.py", "output-inside-the-source", ["{ckpt}", "{ckpt}/out"], "lies inside the source"),
    row("upcycle.py", "negative-seed", ["{ckpt}", "{tmp}/out", "--seed", "-1"], "--seed must be in 0..2^63-1"),
    row("upcycle.py", "hugging-face-folder-with-a-pickle", ["{tmp}/hf", "{tmp}/out"],
        "pytorch_model.bin, which torchnlq does not unpickle", setup=HF_PICKLED),
    row("upcycle.py", "hugging-face-config-without-shapes", ["{tmp}/hf2", "{tmp}/out"], "lacks or mangles 'n_embd'",
        setup=write({"hf2/config.json": '{"model_type": "gpt2"}', "hf2/model.safetensors": "x"})),
    row("upcycle.py", "hugging-face-activation-torchnlq-lacks", ["{tmp}/hf3", "{tmp}/out"],
        "activation_function 'swish' is not one torchnlq has",
        setup=write({"hf3/config.json": '{"model_type": "gpt2", "activation_function": "swish"}'})),
    row("upcycle.py", "source-without-a-tokenizer", ["{tmp}/notok", "{tmp}/out"],
        "'{tmp}/notok' carries no tokenizer (no tokenizer.json or vocab.json) and its vocabulary (320 ids) is not "
        "GPT-2's (50,257), so --tiktoken-file cannot supply one", setup=checkpoint("notok", meta={"tokenizer": {}})),
    row("upcycle.py", "gpt2-source-without-ranks-offline", ["{tmp}/gpt2", "{tmp}/out"],
        "were not found offline; set TORCHNLQ_TIKTOKEN_FILE (or pass --tiktoken-file)", setup=gpt2_checkpoint()),
    row("upcycle.py", "tiktoken-file-missing", ["{tmp}/gpt2", "{tmp}/out", "--tiktoken-file", "{tmp}/no.tiktoken"],
        "tiktoken file '{tmp}/no.tiktoken' is unreadable", setup=gpt2_checkpoint()),
    row("upcycle.py", "tiktoken-file-of-other-ranks", ["{tmp}/gpt2", "{tmp}/out", "--tiktoken-file", "{tmp}/o.tiktoken"],
        "tiktoken file '{tmp}/o.tiktoken' has sha256", setup=both(gpt2_checkpoint(), write({"o.tiktoken": "IQ== 0\n"}))),
    row("upcycle.py", "tiktoken-file-for-a-byte-model", ["{ckpt}", "{tmp}/out", "--tiktoken-file", "{tmp}/o.tiktoken"],
        "--tiktoken-file gives GPT-2 ranks, but this model's tokenizer is 'byte'; drop the flag"),
    row("convert_checkpoint.py", "tiktoken-file-for-a-byte-model", ["{ckpt}", "{tmp}/out", "--tiktoken-file", "x"],
        "--tiktoken-file gives GPT-2 ranks, but this model's tokenizer is 'byte'; drop the flag"),
    row("convert_checkpoint.py", "tiktoken-file-of-other-ranks", ["{tmp}/gpt2", "{tmp}/out", "--tiktoken-file",
        "{tmp}/o.tiktoken"], "tiktoken file '{tmp}/o.tiktoken' has sha256",
        setup=both(gpt2_checkpoint(), write({"o.tiktoken": "IQ== 0\n"}))),
    row("generate.py", "tiktoken-file-of-other-ranks-for-a-model-without-a-tokenizer",
        ["{tmp}/notok", "--tiktoken-file", "{tmp}/o.tiktoken"], "not the GPT-2 (r50k_base) ranks",
        setup=both(checkpoint("notok", meta={"tokenizer": {}}), write({"o.tiktoken": "IQ== 0\n"}))),
    row("evaluate.py", "multiple-choice-file-missing", ["{ckpt}", "--multiple-choice", "{tmp}/nowhere.jsonl"],
        "multiple-choice file '{tmp}/nowhere.jsonl' does not exist"),
    row("evaluate.py", "multiple-choice-file-is-a-folder", ["{ckpt}", "--multiple-choice", "{tmp}"],
        "is not a file (give a .jsonl file)"),
    row("evaluate.py", "multiple-choice-empty-file", ["{ckpt}", "--multiple-choice", "{tmp}/q.jsonl"], "holds no rows",
        setup=write({"q.jsonl": "\n\n"})),
    row("evaluate.py", "multiple-choice-malformed-row", ["{ckpt}", "--multiple-choice", "{tmp}/q2.jsonl"],
        "line 3: not valid JSON", setup=write({"q2.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n' '{"ctx": "a", "endings": ["b", "c"], "label": 1}\n{"ctx": \n'})),
    row("evaluate.py", "multiple-choice-label-out-of-range", ["{ckpt}", "--multiple-choice", "{tmp}/q3.jsonl"],
        "line 1: 'label' is 2 but the row has 2 endings (0..1)",
        setup=write({"q3.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 2}\n'})),
    row("evaluate.py", "multiple-choice-label-a-bool", ["{ckpt}", "--multiple-choice", "{tmp}/q4.jsonl"],
        "'label' must be an integer, got true", setup=write({"q4.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": true}\n'})),
    row("evaluate.py", "multiple-choice-one-ending", ["{ckpt}", "--multiple-choice", "{tmp}/q5.jsonl"],
        "'endings' must be a list of at least two strings", setup=write({"q5.jsonl": '{"ctx": "a", "endings": ["b"], "label": 0}\n'})),
    row("evaluate.py", "multiple-choice-no-context", ["{ckpt}", "--multiple-choice", "{tmp}/q6.jsonl"],
        "line 1: no context: give 'ctx'", setup=write({"q6.jsonl": '{"endings": ["b", "c"], "label": 0}\n'})),
    row("evaluate.py", "multiple-choice-not-an-object", ["{ckpt}", "--multiple-choice", "{tmp}/q7.jsonl"],
        "line 1: expected a JSON object, got list", setup=write({"q7.jsonl": "[1, 2]\n"})),
    row("evaluate.py", "multiple-choice-not-utf8", ["{ckpt}", "--multiple-choice", "{tmp}/q8.jsonl"],
        "line 1: not UTF-8 text", setup=write({"q8.jsonl": b"\xff\xfe\n"})),
    row("evaluate.py", "multiple-choice-limit-0", ["{ckpt}", "--multiple-choice", "{tmp}/q.jsonl", "--limit", "0"],
        "--limit=0 must be at least 1", setup=write({"q.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n'})),
    row("evaluate.py", "multiple-choice-batch-size-0",
        ["{ckpt}", "--multiple-choice", "{tmp}/q.jsonl", "--batch-size", "0"], "--batch-size=0 must be at least 1",
        setup=write({"q.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n'})),
    row("evaluate.py", "data-and-multiple-choice", ["{ckpt}", "--data", "{data}", "--multiple-choice", "{tmp}/q.jsonl"],
        "not allowed with argument"),
    row("evaluate.py", "limit-with-data", ["{ckpt}", "--data", "{data}", "--limit", "5"], "--limit does not apply to --data"),
    row("evaluate.py", "sequences-with-multiple-choice",
        ["{ckpt}", "--multiple-choice", "{tmp}/q.jsonl", "--sequences", "3"], "--sequences does not apply to --multiple-choice",
        setup=write({"q.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n'})),
    # ---------------------------------------------------------------- generate.py
    row("generate.py", "checkpoint-not-given", [], "CKPT_OR_EXPORT"),
    row("generate.py", "gpt2-checkpoint-whose-carried-ranks-are-damaged", ["{tmp}/gpt2"],
        "tokenizer.tiktoken' is corrupt (sha256",
        setup=both(gpt2_checkpoint(), write({"gpt2/tokenizer.tiktoken": "damaged"}))),
    row("generate.py", "export-whose-vocab-json-is-corrupt", ["{tmp}/export"], "vocab.json' is corrupt",
        setup=copy_of("{export}", "export", lambda f: (
            edit_json("config.json", _set("tokenizer", {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}))(f),
            overwrite("vocab.json", "{not json")(f)))),
    row("generate.py", "max-new-tokens-not-a-number", ["{ckpt}", "--max-new-tokens", "ten"], "ten"),
    row("generate.py", "checkpoint-missing", ["{tmp}/nowhere"], "'{tmp}/nowhere' does not exist"),
    row("generate.py", "run-folder-for-a-checkpoint", ["{run}"], "it looks like a run folder"),
    row("generate.py", "negative-max-new-tokens", ["{ckpt}", "--max-new-tokens", "-1"], "--max-new-tokens=-1 must be at least 0"),
    row("generate.py", "negative-temperature", ["{ckpt}", "--temperature", "-0.5"],
        "--temperature=-0.5 must be a finite number >= 0"),
    row("generate.py", "nan-temperature", ["{ckpt}", "--temperature", "nan"], "--temperature=nan must be a finite number"),
    row("generate.py", "infinite-temperature", ["{ckpt}", "--temperature", "inf"], "--temperature=inf must be a finite number"),
    row("generate.py", "zero-top-k", ["{ckpt}", "--top-k", "0"], "--top-k=0 must be at least 1"),
    row("generate.py", "negative-seed", ["{ckpt}", "--seed", "-1"], "--seed=-1 must be in 0.."),
    row("generate.py", "seed-above-2**64-1", ["{ckpt}", "--seed", str(2**64)], f"--seed={2**64} must be in 0.."),
    row("generate.py", "cuda-without-a-gpu", ["{ckpt}", "--device", "cuda"], "no CUDA device is visible; use --device cpu",
        needs_no_cuda=True),
    row("generate.py", "unknown-device", ["{ckpt}", "--device", "tpu"], "unknown device 'tpu'"),
    row("generate.py", "device-this-torch-lacks", ["{ckpt}", "--device", "mps"], "mps"),
    row("generate.py", "prompt-longer-than-the-context", ["{ckpt}", "--prompt", "x" * 300],
        "the prompt has 300 tokens but the model's context is max_seq_len=256"),
    row("generate.py", "gpt2-model-without-its-tiktoken-file", ["{tmp}/gpt2", "--tiktoken-file", "{tmp}/gpt2.tiktoken"],
        "tiktoken file '{tmp}/gpt2.tiktoken' does not exist",
        setup=checkpoint("gpt2", meta={"tokenizer": {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}},
                         n_layers=1, dim=8, n_heads=2, vocab_size=50304, max_seq_len=16)),
    row("generate.py", "model-without-a-tokenizer", ["{tmp}/notok"], "the model records no tokenizer",
        setup=checkpoint("notok", meta={"tokenizer": {}})),
    row("generate.py", "tokenizer-larger-than-the-model", ["{tmp}/small"], "tokenizer byte has 257 tokens but the model only 200",
        setup=checkpoint("small", vocab_size=200)),
    row("generate.py", "hf-model-without-its-tokenizer-json", ["{tmp}/hftok"], "that '{tmp}/hftok' does not carry",
        setup=checkpoint("hftok", meta=HF_MODEL_META, vocab_size=64)),
    row("generate.py", "hf-model-whose-tokenizer-json-changed", ["{tmp}/edited"],
        "not the tokenizer.json the model was trained with",
        setup=both(checkpoint("edited", meta=HF_MODEL_META, vocab_size=64), tokenizer_json("edited/tokenizer.json"))),
    # ---------------------------------------------------------------- evaluate.py
    row("evaluate.py", "data-not-given", ["{ckpt}"], "--data"),
    row("evaluate.py", "data-folder-missing", ["{ckpt}", "--data", "{tmp}/nowhere"], "data.path '{tmp}/nowhere' does not exist"),
    row("evaluate.py", "checkpoint-for-the-data", ["{ckpt}", "--data", "{ckpt}"], "lacks meta.json, train.bin, val.bin"),
    row("evaluate.py", "zero-sequences", ["{ckpt}", "--data", "{data}", "--sequences", "0"], "--sequences=0 must be at least 1"),
    row("evaluate.py", "zero-micro-batch", ["{ckpt}", "--data", "{data}", "--micro-batch-size", "0"],
        "--micro-batch-size=0 must be at least 1"),
    row("evaluate.py", "zero-seq-len", ["{ckpt}", "--data", "{data}", "--seq-len", "0"], "--seq-len=0 must be at least 1"),
    row("evaluate.py", "seq-len-above-the-positions", ["{ckpt}", "--data", "{data}", "--seq-len", "512"],
        "--seq-len=512 exceeds the model's max_seq_len=256"),
    row("evaluate.py", "seed-above-2**64-1", ["{ckpt}", "--data", "{data}", "--seed", str(2**64)], f"--seed={2**64} must be in"),
    row("evaluate.py", "data-of-another-tokenizer", ["{tmp}/gpt2", "--data", "{data}"],
        "was tokenized with 'byte' (meta.json) but the model uses the 'gpt2' tokenizer",
        setup=checkpoint("gpt2", meta={"tokenizer": {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}})),
    row("evaluate.py", "gpt2-data-for-a-byte-model", ["{ckpt}", "--data", "{tmp}/gpt2data"],  # names no data.tokenizer
        "was tokenized with 'gpt2' (meta.json) but the model uses the 'byte' tokenizer; evaluate on a data folder "
        "prepared with 'byte' (scripts/prepare_data.py --tokenizer byte)",
        setup=token_folder("gpt2data", meta=lambda m: m.update(tokenizer="gpt2"))),
    row("evaluate.py", "export-without-validation-settings", ["{tmp}/export", "--data", "{data}"],
        "records no validation settings; pass --sequences N",
        setup=copy_of("{export}", "export", edit_json("config.json", _drop("validation")))),
    row("evaluate.py", "val-split-shorter-than-seq-len", ["{ckpt}", "--data", "{tmp}/short"],
        "val.bin has 10 tokens, fewer than one sequence of seq_len+1=33",
        setup=token_folder("short", val=np.full(10, 65, dtype=np.uint16))),
    row("evaluate.py", "device-this-torch-lacks", ["{ckpt}", "--data", "{data}", "--device", "meta"], "meta",
        ),
    # ---------------------------------------------------------------- run_suite.py
    row("run_suite.py", "suite-file-not-given", [], "give the suite file first"),
    row("run_suite.py", "option-before-the-suite-file", ["--dry-run", "{tmp}/s.toml"], "give the suite file first",
        setup=suite(SUITE)),
    row("run_suite.py", "suite-file-missing", ["{tmp}/missing.toml", "--dry-run"], "suite file '{tmp}/missing.toml' not found"),
    row("run_suite.py", "suite-not-valid-toml", ["{tmp}/syntax.toml", "--dry-run"], "is not valid TOML",
        setup=suite("config = \n", "syntax.toml")),
    row("run_suite.py", "unknown-suite-key", ["{tmp}/basline.toml", "--dry-run"], "unknown key 'basline'; did you mean 'baseline'?",
        setup=suite(SUITE + 'basline = "run"\n', "basline.toml")),
    row("run_suite.py", "neither-config-nor-runs", ["{tmp}/empty.toml", "--dry-run"], "give a top-level config",
        setup=suite('dump_folder = "x"\n', "empty.toml")),
    row("run_suite.py", "run-config-missing", ["{tmp}/runcfg.toml", "--dry-run"], "config 'missing.toml' not found",
        setup=suite('[[runs]]\nname = "a"\nconfig = "missing.toml"\n', "runcfg.toml")),
    row("run_suite.py", "grid-key-typo", ["{tmp}/typ.toml", "--dry-run"], "did you mean 'type'?",
        setup=suite(SUITE + '[grid]\n"model.query.typ" = ["linear"]\n', "typ.toml")),
    row("run_suite.py", "grid-value-of-the-wrong-type", ["{tmp}/many.toml", "--dry-run"], "grid key 'training.steps' = 'many'",
        setup=suite(SUITE + '[grid]\n"training.steps" = ["many"]\n', "many.toml")),
    row("run_suite.py", "grid-empty-list", ["{tmp}/none.toml", "--dry-run"], "grid key 'training.seed' needs a non-empty list",
        setup=suite(SUITE + '[grid]\n"training.seed" = []\n', "none.toml")),
    row("run_suite.py", "grid-value-twice", ["{tmp}/twice.toml", "--dry-run"], "grid key 'training.seed' lists 1 twice",
        setup=suite(SUITE + '[grid]\n"training.seed" = [1, 2, 1]\n', "twice.toml")),
    row("run_suite.py", "grid-not-a-table", ["{tmp}/grid5.toml", "--dry-run"], "[grid] must map dotted config keys",
        setup=suite(SUITE + "grid = 5\n", "grid5.toml")),
    row("run_suite.py", "baseline-not-a-run", ["{tmp}/nope.toml", "--dry-run"], "baseline 'nope' is not a run name",
        setup=suite(SUITE + 'baseline = "nope"\n', "nope.toml")),
    row("run_suite.py", "run-name-twice", ["{tmp}/dup.toml", "--dry-run"], "run name 'a' appears twice",
        setup=suite(SUITE + '[[runs]]\nname = "a"\n[[runs]]\nname = "a"\n', "dup.toml")),
    row("run_suite.py", "run-without-a-name", ["{tmp}/noname.toml", "--dry-run"], "runs[0] needs a name",
        setup=suite(SUITE + '[[runs]]\noverrides = []\n', "noname.toml")),
    row("run_suite.py", "run-sets-job-name", ["{tmp}/jobname.toml", "--dry-run"], "the suite sets job.name and job.dump_folder",
        setup=suite(SUITE + '[[runs]]\nname = "a"\noverrides = ["--job.name=x"]\n', "jobname.toml")),
    row("run_suite.py", "overrides-not-a-list", ["{tmp}/str.toml", "--dry-run"], "overrides must be a list of strings",
        setup=suite(SUITE + 'overrides = "--training.steps=3"\n', "str.toml")),
    row("run_suite.py", "run-override-invalid", ["{tmp}/heads.toml", "--dry-run"], "run 'a': model.n_heads=3 does not divide",
        setup=suite(SUITE + '[[runs]]\nname = "a"\noverrides = ["--model.n_heads=3"]\n', "heads.toml")),
    row("run_suite.py", "shared-overrides-set-the-dump-folder", ["{tmp}/dump.toml", "--dry-run"],
        "set the suite's dump_folder instead", setup=suite(SUITE + 'overrides = ["--job.dump_folder=x"]\n', "dump.toml")),
    row("run_suite.py", "dump-folder-not-a-string", ["{tmp}/five.toml", "--dry-run"], "dump_folder must be a string, got 5",
        setup=suite(SUITE + "dump_folder = 5\n", "five.toml")),
    row("run_suite.py", "compare-step-zero", ["{tmp}/step.toml", "--dry-run"], "compare_step must be a positive integer step, got 0",
        setup=suite(SUITE + "compare_step = 0\n", "step.toml")),
    row("run_suite.py", "command-line-flattens-a-varied-key", ["{tmp}/seeds.toml", "--dry-run", "--training.seed=5"],
        "--training.seed is set per run by the suite", setup=suite(SUITE + '[grid]\n"training.seed" = [1, 2]\n', "seeds.toml")),
    row("run_suite.py", "command-line-sets-job-name", ["{tmp}/s.toml", "--dry-run", "--job.name=x"],
        "the suite names its runs; do not override job.name", setup=suite(SUITE)),
    row("run_suite.py", "command-line-dump-folder-without-a-value", ["{tmp}/s.toml", "--dry-run", "--job.dump_folder"],
        "--job.dump_folder needs a value", setup=suite(SUITE)),
    row("run_suite.py", "command-line-override-typo", ["{tmp}/s.toml", "--dry-run", "--training.stesp=3"],
        "run 'run': unknown key 'training.stesp'", setup=suite(SUITE)),
    # Not a dry run: the data of every run is opened before the first launch.
    row("run_suite.py", "data-folder-missing", ["{tmp}/s.toml", "--data.path={tmp}/nowhere"],
        "run 'run': data.path '{tmp}/nowhere' does not exist", setup=suite(SUITE)),
    # ---------------------------------------------------------------- compare_runs.py
    row("compare_runs.py", "x-axis-unknown", ["{runs}/a", "--baseline", "a", "--x", "epochs"],
        "argument --x: invalid choice: 'epochs'"),
    row("compare_runs.py", "x-without-a-value", ["{runs}/a", "--baseline", "a", "--x"],
        "argument --x: expected one argument"),
    row("compare_runs.py", "tokens-axis-without-world-size", ["{runs}/a", "--baseline", "a", "--x", "tokens"],
        "run 'a' records no world_size"),
    row("compare_runs.py", "baseline-not-given", ["{runs}/a"], "--baseline"),
    row("compare_runs.py", "run-folder-missing", ["{tmp}/nowhere", "--baseline", "{runs}/a"],
        "'{tmp}/nowhere' is neither a run folder (with run_info.json) nor a folder of runs"),
    row("compare_runs.py", "empty-folder-of-runs", ["{tmp}/empty", "--baseline", "{runs}/a"],
        "'{tmp}/empty' is neither a run folder", setup=folders("empty")),
    row("compare_runs.py", "baseline-not-a-run", ["{runs}/a", "--baseline", "nobody"],
        "baseline 'nobody' is neither the name of one of the runs nor a run folder"),
    row("compare_runs.py", "different-training-batches", ["{runs}/a", "{runs}/other_batches", "--baseline", "a"],
        "the runs saw different training batches"),
    row("compare_runs.py", "different-validation-sequences", ["{runs}/a", "{runs}/other_val", "--baseline", "a"],
        "the runs saw different validation sequences"),
    row("compare_runs.py", "no-common-validation-step", ["{runs}/a", "{runs}/late", "--baseline", "a"],
        "differ only in their seed but share no validation step"),
    row("compare_runs.py", "step-not-a-validation-step", ["{runs}/a", "{runs}/b", "--baseline", "a", "--step", "15"],
        "step 15 is not a validation step of every run"),
    row("compare_runs.py", "run-without-validation-losses", ["{runs}/a", "{runs}/no_tb", "--baseline", "a"],
        "has no validation losses (loss/val)"),
    row("compare_runs.py", "config-toml-corrupt", ["{runs}/a", "{tmp}/broken", "--baseline", "a"],
        "config.toml' is not valid TOML", setup=copy_of("{runs}/b", "broken", overwrite("config.toml", "[job\n"))),
    row("compare_runs.py", "run-info-corrupt", ["{runs}/a", "{tmp}/broken_info", "--baseline", "a"],
        "run_info.json' is not valid JSON", setup=copy_of("{runs}/b", "broken_info", overwrite("run_info.json", "{oops"))),
    row("compare_runs.py", "out-is-a-file", ["{runs}/a", "{runs}/b", "--baseline", "a", "--out", "{tmp}/notes.txt"],
        "--out '{tmp}/notes.txt' exists and is not a folder", setup=write({"notes.txt": "mine"})),
    row("compare_runs.py", "out-is-a-compared-run", ["{runs}/a", "{runs}/b", "--baseline", "a", "--out", "{runs}/b"],
        "is inside the run folder '{runs}/b' being compared"),
    # ---------------------------------------------------------------- loss_compare.py
    row("loss_compare.py", "side-missing", ["{tmp}/nowhere", "{runs}/a"],
        "A '{tmp}/nowhere' is neither a run folder, a loss file (.json), a config (.toml) nor REF:CONFIG"),
    row("loss_compare.py", "one-side-only", ["{runs}/a"], "the following arguments are required: B"),
    row("loss_compare.py", "unknown-commit", ["no-such-ref:train_configs/debug_model.toml", "{runs}/a"],
        "'no-such-ref' is not a commit of the git checkout"),
    row("loss_compare.py", "commit-without-the-config", ["HEAD:train_configs/nowhere.toml", "{runs}/a"],
        "commit HEAD has no file 'train_configs/nowhere.toml'"),
    row("loss_compare.py", "run-folder-without-training-losses", ["{runs}/a", "{runs}/b"],
        "'{runs}/a' holds no training losses (loss/train"),
    row("loss_compare.py", "loss-file-corrupt", ["{tmp}/l.json", "{runs}/a"], "'{tmp}/l.json' is corrupt",
        setup=write({"l.json": "{oops"})),
    row("loss_compare.py", "loss-file-of-a-list", ["{tmp}/list.json", "{runs}/a"],
        "'{tmp}/list.json' is not a loss file: its train_loss must map steps to losses",
        setup=write({"list.json": '{"train_loss": [5.7, 5.2]}'})),
    row("loss_compare.py", "set-not-key-value", ["{config}", "{config}", "--set", "training.steps"],
        "--set 'training.steps' is not KEY=VALUE"),
    # Both sides' overrides are checked before side A trains.
    row("loss_compare.py", "set-b-typo", ["{config}", "{config}", "--set-b", "training.stesp=3"],
        "unknown key 'training.stesp'"),
    row("loss_compare.py", "set-a-for-a-side-that-is-read", ["{runs}/a", "{config}", "--set-a", "training.steps=3"],
        "--set-a applies to a side that trains (a config or REF:CONFIG), not to A '{runs}/a'"),
    row("loss_compare.py", "set-for-two-sides-that-are-read", ["{runs}/a", "{runs}/b", "--set", "training.steps=3"],
        "--set applies to the sides that train (a config or REF:CONFIG); A and B are both read"),
    row("loss_compare.py", "tolerance-negative", ["{runs}/a", "{runs}/b", "--tolerance=-1e-5"],
        "--tolerance must be a finite number at least 0, got -1e-05"),
    row("loss_compare.py", "tolerance-nan", ["{runs}/a", "{runs}/b", "--tolerance", "nan"],
        "--tolerance must be a finite number at least 0, got nan"),
    # ---------------------------------------------------------------- model_summary.py
    row("model_summary.py", "config-file-missing", ["nowhere.toml"], "config file 'nowhere.toml' not found"),
    row("model_summary.py", "processes-not-a-number", ["--processes", "two"], "argument --processes: expects a positive integer, got 'two'"),
    row("model_summary.py", "processes-zero", ["--processes=0"], "argument --processes: expects a positive integer, got '0'"),
    row("model_summary.py", "processes-without-a-value", ["--processes"], "argument --processes: expected one argument"),
    row("model_summary.py", "card-gib-not-finite", ["--card-gib=nan"], "argument --card-gib: expects a positive number, got 'nan'"),
    row("model_summary.py", "card-gib-for-a-cpu-run", ["--training.device=cpu", "--card-gib=24"],
        "--card-gib is a GPU's memory, but this config trains on the CPU (training.device = cpu); drop --card-gib or "
        "add --training.device=cuda"),
    row("model_summary.py", "toml-syntax-error", ["{tmp}/syntax.toml"], "is not valid TOML",
        setup=write({"syntax.toml": "[model\n"})),
    row("model_summary.py", "unknown-key", ["--model.dimm=64"], "unknown key 'model.dimm' in model; did you mean 'dim'?"),
    row("model_summary.py", "unknown-flavor", ["--model.flavor=gpt_huge"], "model.flavor: unknown 'gpt_huge'"),
    row("model_summary.py", "heads-do-not-divide-dim", ["--model.dim=100", "--model.n_heads=3"],
        "model.n_heads=3 does not divide model.dim=100"),
    row("model_summary.py", "seq-len-above-the-positions", ["--training.seq_len=2048"], "exceeds the model's max_seq_len=256"),
    row("model_summary.py", "bare-section", ["--model"], "option '--model' must be --section.key"),
    row("model_summary.py", "two-config-files", ["a.toml", "b.toml"], "two config files given ('a.toml' and 'b.toml')"),
    # ---------------------------------------------------------------- bench.py
    row("bench.py", "zero-steps", [*BENCH, "--steps", "0"], "--steps must be at least 1"),
    row("bench.py", "steps-not-an-integer", [*BENCH, "--steps", "two"], "argument --steps: invalid int value: 'two'"),
    row("bench.py", "steps-without-a-value", [*BENCH, "--steps"], "argument --steps: expected one argument"),
    row("bench.py", "negative-warmup", [*BENCH, "--warmup", "-1"], "--warmup at least 0"),
    row("bench.py", "unknown-autocast", [*BENCH, "--autocast=fp16"], "argument --autocast: invalid choice: 'fp16'"),
    row("bench.py", "compare-with-an-unknown-key", [*BENCH, "--compare", "a: --model.query.typo=1"],
        "unknown key 'model.query.typo'"),
    row("bench.py", "compare-labels-twice", [*BENCH, "--compare", "a: --training.steps=1", "--compare", "a: --training.steps=2"],
        "--compare labels must differ"),
    row("bench.py", "compare-unclosed-quote", [*BENCH, "--compare", "a: --job.description='x"], "No closing quotation"),
    row("bench.py", "compare-unknown-autocast", [*BENCH, "--compare", "a: --autocast=int8"], "--compare 'a': argument --autocast: invalid choice: 'int8'"),
    row("bench.py", "json-into-a-folder", [*BENCH, "--json", "{tmp}"], "--json '{tmp}' is a folder"),
    row("bench.py", "json-in-a-missing-folder", [*BENCH, "--json", "{tmp}/nowhere/bench.json"], "folder '{tmp}/nowhere' does not exist"),
    row("bench.py", "config-file-missing", ["nowhere.toml", *BENCH], "config file 'nowhere.toml' not found"),
    row("bench.py", "removed-fuse-kv", [*BENCH, "--model.query.type=linear", "--model.query.fuse_kv=true"],
        "model.query.fuse_kv was removed"),
    row("bench.py", "real-data-missing", [*BENCH, "--real-data", "--data.path={tmp}/nowhere"],
        "data.path '{tmp}/nowhere' does not exist"),
    row("bench.py", "cuda-without-a-gpu", [*BENCH, "--training.device=cuda"], "no CUDA device is visible", needs_no_cuda=True),
    # ---------------------------------------------------------------- bench_attention.py
    row("bench_attention.py", "heads-do-not-divide-dim", ["--dim", "32", "--heads", "5"], "model.n_heads=5 does not divide model.dim=32"),
    row("bench_attention.py", "kv-heads-do-not-divide-heads", [*ATTENTION, "--kv-heads", "3"], "model.n_kv_heads=3 must be in 1..4"),
    row("bench_attention.py", "rope-with-an-odd-head-dim", ["--dim", "30", "--heads", "6", "--rope"], "needs an even head_dim"),
    row("bench_attention.py", "zero-dim", ["--dim", "0", "--heads", "4"], "model.dim=0 must be at least 1"),
    row("bench_attention.py", "zero-steps", ["--dim", "32", "--heads", "4", "--steps", "0"], "--steps must be at least 1"),
    row("bench_attention.py", "negative-batch", ["--dim", "32", "--heads", "4", "--batch", "-1"], "(got -1, "),
    row("bench_attention.py", "cuda-without-a-gpu", [*ATTENTION, "--device", "cuda"], "--device cuda asked for but no CUDA device",
        needs_no_cuda=True),
    row("bench_attention.py", "unknown-autocast", [*ATTENTION, "--autocast", "fp16"], "fp16"),
    # ---------------------------------------------------------------- bench_startup.py, bench_overhead.py, bench_nanogpt.py
    row("bench_startup.py", "zero-rounds", ["--rounds", "0"], "--rounds must be at least 1, got 0"),
    row("bench_startup.py", "only-an-unknown-command", ["--only", "sample"], "--only 'sample' names no command"),
    row("bench_overhead.py", "zero-steps", ["--steps", "0"], "--steps must be at least 1, got 0"),
    row("bench_overhead.py", "zero-threads", ["--threads", "0"], "--threads must be at least 1, got 0"),
    row("bench_overhead.py", "unknown-shape", ["--shape", "huge"], "argument --shape: invalid choice: 'huge'"),
    row("bench_nanogpt.py", "no-nanogpt-checkout", [], "the following arguments are required: --nanogpt"),
    row("bench_nanogpt.py", "nanogpt-folder-without-train-py", ["--nanogpt", "{tmp}"],
        "lacks train.py, model.py or configurator.py"),
    row("bench_nanogpt.py", "steps-not-a-pair", [*NANO_CPU, "--steps", "60"],
        "--steps '60': expected LONG,SHORT such as 60,10", setup=write(NANOGPT)),
    row("bench_nanogpt.py", "short-not-below-long", [*NANO_CPU, "--steps", "10,60"],
        "need 1 <= SHORT < LONG", setup=write(NANOGPT)),
    row("bench_nanogpt.py", "cpu-seconds-with-a-config", [*NANO_CPU, "{config}"],
        "--mode cpu-seconds runs its own toy shape; it takes no config", setup=write(NANOGPT)),
    row("bench_nanogpt.py", "profile-of-a-llama-block", [*NANO_PROFILE, "{config}", "--model.norm=rms"],
        "nanoGPT's model is GPT-2's block", setup=write(NANOGPT)),
    row("bench_nanogpt.py", "profile-steps-all-warm-up", [*NANO_PROFILE, "{config}", "--steps", "2"],
        "--steps must be more than the 2 warm-up steps, got 2", setup=write(NANOGPT)),
    row("bench_nanogpt.py", "profile-steps-a-pair", [*NANO_PROFILE, "{config}", "--steps", "60,10"],
        "--mode profile takes one number of steps", setup=write(NANOGPT)),
    row("bench_nanogpt.py", "profile-configs-of-two-shapes", [*NANO_PROFILE, "{config}", "{tmp}/short.toml"],
        "training.seq_len = 16, but {config} (nanoGPT's shape) has 32",
        setup=write({**NANOGPT, "short.toml": 'extends = "{config}"\n[training]\nseq_len = 16\n'})),
    row("bench_nanogpt.py", "profile-json-in-a-missing-folder", [*NANO_PROFILE, "{config}", "--json", "{tmp}/no/x.json"],
        "folder '{tmp}/no' does not exist", setup=write(NANOGPT)),
    row("bench_nanogpt.py", "profile-stray-word", [*NANO_PROFILE, "{config}", "-x"], "unrecognized argument '-x'",
        setup=write(NANOGPT)),
    # ---------------------------------------------------------------- bench_torchtitan.py
    row("bench_torchtitan.py", "no-torchtitan-folder", [], "the following arguments are required: --torchtitan"),
    row("bench_torchtitan.py", "folder-without-torchtitan", ["--torchtitan", "{tmp}"],
        "holds no torchtitan package (torchtitan/train.py)"),
    row("bench_torchtitan.py", "steps-not-a-pair", ["--torchtitan", "{tmp}/tt", "--steps", "8"],
        "--steps '8': expected LONG,SHORT such as 8,2", setup=write(TORCHTITAN)),
    row("bench_torchtitan.py", "short-not-below-long", ["--torchtitan", "{tmp}/tt", "--steps", "2,8"],
        "need 1 <= SHORT < LONG", setup=write(TORCHTITAN)),
    row("bench_torchtitan.py", "zero-rounds", ["--torchtitan", "{tmp}/tt", "--rounds", "0"],
        "--rounds must be at least 1, got 0", setup=write(TORCHTITAN)),
    row("bench_torchtitan.py", "torchtitan-dependencies-missing", ["--torchtitan", "{tmp}/tt"],
        "'import torchtitan.trainer' failed", setup=write(TORCHTITAN)),
    # ---------------------------------------------------------------- bench_loader.py
    row("bench_loader.py", "shapes-not-pairs", ["--shapes", "12by1024"], "--shapes: expected pairs like 12x1024,1x1024"),
    row("bench_loader.py", "zero-in-a-shape", ["--shapes", "0x64", "--tokens", "1000"], "every --shapes size must be at least 1"),
    row("bench_loader.py", "zero-iterations", ["--iters", "0", "--tokens", "1e5"], "--iters and every --shapes size must be at least 1 (got 0"),
    row("bench_loader.py", "file-missing", ["--file", "{tmp}/train.bin"], "--file: no such file"),
    row("bench_loader.py", "tokens-below-one-micro-batch", ["--tokens", "10"], "--tokens 10 is smaller than one micro-batch"),
    row("bench_loader.py", "tokens-nan", ["--tokens", "nan"], "--tokens must be a finite number of tokens, got nan"),
    row("bench_loader.py", "file-shorter-than-a-window", ["--file", "{tmp}/small.bin", "--shapes", "2x64"],
        "holds 10 tokens, fewer than one window", setup=write({"small.bin": b"\0\0" * 10})),
    row("bench_loader.py", "file-empty", ["--file", "{tmp}/empty.bin"], "holds 0 tokens", setup=write({"empty.bin": b""})),
    row("bench_loader.py", "file-of-odd-size", ["--file", "{tmp}/odd.bin", "--shapes", "1x2"], "has an odd size (3 bytes)",
        setup=write({"odd.bin": b"abc"})),
    # ---------------------------------------------------------------- bench_checkpoint.py
    row("bench_checkpoint.py", "flavor-typo", ["--flavor", "gpt_smal"], "--flavor: unknown 'gpt_smal'; did you mean 'gpt_small'?"),
    row("bench_checkpoint.py", "zero-repeats", ["--flavor", "debug", "--repeats", "0"], "--repeats must be at least 1, got 0"),
    row("bench_checkpoint.py", "option-spelled-flavour", ["--flavour", "debug"], "--flavour"),
    # ---------------------------------------------------------------- bench_parallel.py
    row("bench_parallel.py", "unknown-query", ["--query", "mlp"], "model.query.type: unknown 'mlp'"),
    row("bench_parallel.py", "heads-do-not-divide-dim", ["--heads", "3"], "model.n_heads=3 does not divide model.dim=256"),
    row("bench_parallel.py", "zero-steps", ["--steps", "0"], "--steps must be at least 1, got 0"),
    row("bench_parallel.py", "zero-threads", ["--threads", "0"], "--threads must be at least 1, got 0"),
    row("bench_parallel.py", "zero-seq", ["--seq", "0"], "--seq must be at least 1, got 0"),
    # ---------------------------------------------------------------- gen_config_docs.py
    row("gen_config_docs.py", "option-typo", ["--chek"], "--chek"),
    row("gen_config_docs.py", "file-argument", ["docs/configs.md"], "docs/configs.md"),
]

# ==================================================================================================
# The catalogue, real processes: one row per Python entry point, and run_train.sh's own checks
# ==================================================================================================

SUBPROCESS = [
    # ---------------------------------------------------------------- run_train.sh: the shell's checks
    row(T, "NGPU-zero", list(TRAIN), "NGPU='0' must be a positive integer", env={"NGPU": "0"}),
    row(T, "NGPU-not-a-number", list(TRAIN), "NGPU='two' must be a positive integer", env={"NGPU": "two"}),
    row(T, "STOP_TIMEOUT-not-a-number", list(TRAIN), "STOP_TIMEOUT='soon' must be a positive number of seconds",
        env={"NGPU": "2", "STOP_TIMEOUT": "soon"}),
    row(T, "config-file-missing-in-a-process", ["missing.toml"], "config file 'missing.toml' not found"),
    row(T, "NNODES-without-RDZV_ENDPOINT", list(TRAIN), "RDZV_ENDPOINT", env={"NNODES": "2"}),
    row(T, "LOG_RANK-not-a-number", list(TRAIN), "LOG_RANK", env={"NGPU": "2", "LOG_RANK": "first"}),
    row(T, "LOG_RANK-beyond-NGPU", list(TRAIN), "LOG_RANK=3 is not a local rank of this node (NGPU=2",
        env={"NGPU": "2", "LOG_RANK": "0,3"}),
    row(T, "TORCHNLQ_CACHE-is-a-file", ["missing.toml"], "TORCHNLQ_CACHE", setup=write({"notes.txt": "mine"}),
        env={"TORCHNLQ_CACHE": "{tmp}/notes.txt"}),
    row(T, "TORCHINDUCTOR_CACHE_DIR-is-a-file", list(TRAIN), "TORCHINDUCTOR_CACHE_DIR='{tmp}/notes.txt' is a file",
        setup=write({"notes.txt": "mine"}), env={"TORCHINDUCTOR_CACHE_DIR": "{tmp}/notes.txt"}),
    row(T, "HF_HOME-inside-a-file", list(TRAIN), "HF_HOME='{tmp}/notes.txt/hf' lies inside the file",
        setup=write({"notes.txt": "mine"}), env={"HF_HOME": "{tmp}/notes.txt/hf"}),
    row(T, "NODE_RANK-not-a-number", list(TRAIN), "NODE_RANK='abc' must be this node's index, 0..1",
        env={"NNODES": "2", "RDZV_ENDPOINT": "node0:29500", "NODE_RANK": "abc"}),
    row(T, "NODE_RANK-beyond-NNODES", list(TRAIN), "NODE_RANK='2' must be this node's index, 0..1",
        env={"NNODES": "2", "RDZV_ENDPOINT": "node0:29500", "NODE_RANK": "2"}),
    row(T, "NODE_RANK-without-NNODES", list(TRAIN), "NODE_RANK=1 is set but NNODES is not", env={"NODE_RANK": "1"}),
    # An empty TORCHNLQ_CACHE is unset for run_train.sh: its default, ./outputs/.cache, inside the snapshot.
    row(T, "mistake-with-the-default-cache", ["missing.toml"], "config file 'missing.toml' not found",
        env={"TORCHNLQ_CACHE": ""}),
    # ---------------------------------------------------------------- run_train.sh with NGPU=2: the preflight, then torchrun
    row(T, "NGPU=2-data-mistake", [*TRAIN, "--data.path={tmp}/big", "--data.synthetic=false"],
        "train.bin holds token id 300", setup=token_folder("big", train=BYTES_300), env={"NGPU": "2"}),
    # The debug config's data.synthetic = true never writes over a data folder the user names (issue 20).
    row(T, "debug-config-with-a-users-data-folder", ["--data.path={tmp}/big"],
        "holds files torchnlq did not write as its synthetic corpus", setup=token_folder("big", train=BYTES_300)),
    # ---------------------------------------------------------------- one row per Python script
    row("prepare_data.py", "hub-dataset-offline", ["--out", "{tmp}/owt", "--tokenizer", "byte"],
        "could not load dataset 'openwebtext'", env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}),
    row("convert_checkpoint.py", "output-is-a-parent-of-the-working-directory", ["{ckpt}", "..", "--overwrite"],
        "output folder '..' is the current directory"),
    # After the checkpoint is loaded: torch's DCP must not add a warning line of its own.
    row("generate.py", "prompt-longer-than-the-context-in-a-process", ["{ckpt}", "--prompt", "y" * 257],
        "the prompt has 257 tokens"),
    row("evaluate.py", "negative-micro-batch", ["{ckpt}", "--data", "{data}", "--micro-batch-size", "-2"],
        "--micro-batch-size=-2 must be at least 1"),
    row("run_suite.py", "suite-file-is-a-folder", ["{tmp}", "--dry-run"], "suite file '{tmp}' not found"),
    row("compare_runs.py", "baseline-of-another-data-order", ["{runs}/b", "--baseline", "{runs}/other_batches"],
        "the runs saw different training batches"),
    # A side that trains and fails: the trainer's own error line, in loss_compare's one line.
    row("loss_compare.py", "trained-side-fails", ["{config}", "{runs}/a", "--set", "data.path={tmp}/nowhere"],
        "the run of A ({config}) failed with exit code 2: error: data.path '{tmp}/nowhere' does not exist"),
    row("model_summary.py", "unknown-section", ["--modell.dim=64"], "unknown section 'modell' in config; did you mean 'model'?"),
    row("bench.py", "warmup-not-an-integer", [*BENCH, "--warmup", "x"], "argument --warmup: invalid int value: 'x'"),
    row("bench_attention.py", "zero-heads", ["--heads", "0"], "model.n_heads=0 does not divide model.dim=768"),
    row("bench_loader.py", "tokens-infinite", ["--tokens", "inf"], "--tokens must be a finite number of tokens, got inf"),
    row("bench_checkpoint.py", "negative-repeats", ["--flavor", "debug", "--repeats", "-1"], "--repeats must be at least 1, got -1"),
    row("bench_startup.py", "negative-rounds", ["--rounds", "-2"], "--rounds must be at least 1, got -2"),
    row("bench_overhead.py", "negative-rounds", ["--rounds", "-1"], "--rounds must be at least 1, got -1"),
    row("bench_nanogpt.py", "nanogpt-folder-missing", ["--nanogpt", "{tmp}/nowhere"],
        "lacks train.py, model.py or configurator.py"),
    row("bench_torchtitan.py", "torchtitan-folder-missing", ["--torchtitan", "{tmp}/nowhere"],
        "holds no torchtitan package (torchtitan/train.py)"),
    row("bench_parallel.py", "negative-batch", ["--batch", "-1"], "--batch must be at least 1, got -1"),
    row("gen_config_docs.py", "unknown-option", ["--write"], "--write"),
    row("upcycle.py", "source-is-a-file", ["{tmp}/notes.txt", "{tmp}/out"], "does not exist or is not a folder",
        setup=write({"notes.txt": "mine"})),
    row("bench_inference.py", "zero-decode-steps", ["--decode", "0"], "--decode must be at least 1, got 0"),
    row("bench_cpu_allocator.py", "warmup-negative", ["{config}", "--warmup", "-1"], "--warmup must be at least 0, got -1"),
    row("gpu_check.py", "no-gpu", [], "no CUDA device is visible", needs_no_cuda=True),
]


# ==================================================================================================
# The entry points: how a row runs, in this process and as a process
# ==================================================================================================

Main = Callable[[list[str]], "int | None"]


@dataclass(frozen=True)
class EntryPoint:
    """How users start a command (``script``, relative to the repository) and its ``main(argv)``."""

    script: str
    load: Callable[[], Main]  # imported on first use: only the rows that need torch's heavy parts pay for them
    watch: tuple[Path, ...] = ()  # folders of the repository it could write by mistake (snapshotted too)


_scripts: dict[str, Any] = {}


def _script(name: str) -> Callable[[], Main]:
    """``main`` of scripts/<name>.py, imported once (the scripts that define their own main)."""

    def load() -> Main:
        if name not in _scripts:
            _scripts[name] = load_script(name)
        return _scripts[name].main

    return load


def _train_main() -> Main:
    from torchnlq.train.__main__ import main

    return main


def _preflight_main() -> Main:
    main = _train_main()
    return lambda argv: main(["--preflight", *argv])  # what run_train.sh runs first when NGPU > 1


def _attr(module: str, name: str = "main") -> Callable[[], Main]:
    """``module.name``, imported on first use (library mains the scripts wrap with run_cli)."""

    def load() -> Main:
        import importlib

        return getattr(importlib.import_module(module), name)

    return load


ENTRIES: dict[str, EntryPoint] = {
    T: EntryPoint("run_train.sh", _train_main),
    P: EntryPoint("run_train.sh", _preflight_main),
    "prepare_data.py": EntryPoint("scripts/prepare_data.py", _script("prepare_data")),
    "convert_checkpoint.py": EntryPoint("scripts/convert_checkpoint.py", _script("convert_checkpoint")),
    "generate.py": EntryPoint("scripts/generate.py", _script("generate")),
    "evaluate.py": EntryPoint("scripts/evaluate.py", _script("evaluate")),
    "run_suite.py": EntryPoint("scripts/run_suite.py", _attr("torchnlq.experiments.suite_run")),
    "compare_runs.py": EntryPoint("scripts/compare_runs.py", _attr("torchnlq.experiments.compare")),
    "loss_compare.py": EntryPoint("scripts/loss_compare.py", _attr("torchnlq.experiments.loss_compare")),
    "model_summary.py": EntryPoint("scripts/model_summary.py", _attr("torchnlq.inference.summary")),
    "bench.py": EntryPoint("scripts/bench.py", _attr("benchmarks.train_step")),
    "bench_attention.py": EntryPoint("scripts/bench_attention.py", _attr("benchmarks.attention_block")),
    "bench_loader.py": EntryPoint("scripts/bench_loader.py", _attr("benchmarks.batch_reads")),
    "bench_startup.py": EntryPoint("scripts/bench_startup.py", _attr("benchmarks.startup")),
    "bench_overhead.py": EntryPoint("scripts/bench_overhead.py", _attr("benchmarks.trainer_overhead")),
    "bench_nanogpt.py": EntryPoint("scripts/bench_nanogpt.py", _attr("benchmarks.versus_nanogpt")),
    "bench_torchtitan.py": EntryPoint("scripts/bench_torchtitan.py", _attr("benchmarks.versus_torchtitan")),
    "bench_checkpoint.py": EntryPoint("scripts/bench_checkpoint.py", _attr("benchmarks.checkpoint_io")),
    "bench_parallel.py": EntryPoint("scripts/bench_parallel.py", _script("bench_parallel")),
    "gen_config_docs.py": EntryPoint("scripts/gen_config_docs.py", _script("gen_config_docs"), (REPO_ROOT / "docs",)),
    "upcycle.py": EntryPoint("scripts/upcycle.py", _script("upcycle")),
    "bench_inference.py": EntryPoint("scripts/bench_inference.py", _attr("benchmarks.inference_speed")),
    "bench_cpu_allocator.py": EntryPoint("scripts/bench_cpu_allocator.py", _attr("benchmarks.cpu_allocator")),
    "gpu_check.py": EntryPoint("scripts/gpu_check.py", _attr("benchmarks.gpu_check")),
}


@dataclass(frozen=True)
class Outcome:
    """How a command ended: its exit code and what it printed."""

    code: int
    out: str
    err: str


#: Warning categories Python does not show by default (DeprecationWarning only for __main__'s own code).
HIDDEN_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_in_process(entry: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``run_cli(main, argv)`` as the script's ``__main__`` calls it; an escaping exception fails the row.

    ``SystemExit`` is what the process would exit with (argparse's usage errors raise it). Warnings
    are recorded each time (not once per process, as the rows stand for separate processes) and
    those a terminal would show become stderr lines.
    """
    main = ENTRIES[entry].load()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code = run_cli(main, argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    captured = capsys.readouterr()
    shown = [f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, HIDDEN_BY_DEFAULT)]
    return Outcome(code, captured.out, captured.err + "".join(f"{line}\n" for line in shown))


def command(entry: str) -> list[str]:
    """The command line of an entry point as a user types it (the scripts with this Python)."""
    script = REPO_ROOT / ENTRIES[entry].script
    return [str(script)] if script.suffix == ".sh" else [sys.executable, str(script)]


# ==================================================================================================
# Checking a row: the one-line rule and the snapshots
# ==================================================================================================

Snapshot = dict[str, tuple[Any, ...]]


def snapshot(*roots: Path) -> Snapshot:
    """Every path under ``roots``: files by sha256 and mtime, links by target, folders by existence.

    A folder's own mtime is left out: it changes when a file is created and removed again inside it,
    and a temporary file that is gone is not a file left behind.
    """
    tree: Snapshot = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                if path.is_symlink():
                    tree[str(path)] = ("link", os.readlink(path))
                elif path.is_dir():
                    tree[str(path)] = ("dir",)
                else:
                    tree[str(path)] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return tree


def assert_unchanged(before: Snapshot, after: Snapshot) -> None:
    """Nothing created, deleted or changed between the two snapshots (the first few of each are named)."""
    created = sorted(set(after) - set(before))
    deleted = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    assert not (created or deleted or changed), f"created {created[:5]}, deleted {deleted[:5]}, changed {changed[:5]}"


def assert_one_clean_line(outcome: Outcome, fragment: str) -> None:
    """Exit code 2, one ``error:`` line on stderr holding ``fragment``, no traceback anywhere."""
    shown = f"exit code {outcome.code}\n--- stderr:\n{outcome.err[-3000:]}\n--- stdout:\n{outcome.out[-1500:]}"
    assert "Traceback (most recent call last)" not in outcome.out + outcome.err, shown
    assert outcome.code == 2, shown
    lines = [line for line in outcome.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"not one 'error:' line\n{shown}"
    assert fragment in lines[0], f"{fragment!r} is not in the error line\n{shown}"


# ==================================================================================================
# The shared inputs
# ==================================================================================================

def write_compare_run(root: Path, name: str, val: Mapping[int, float], batch: str = "aaaa", validation: str = "vvvv",
                      tensorboard: bool = True) -> Path:
    """A finished run folder as compare_runs reads it: config.toml, run_info.json and TensorBoard's loss/val."""
    from torch.utils.tensorboard import SummaryWriter

    from torchnlq.config.manager import load_job_config
    from torchnlq.config.render import to_toml

    run = root / name
    run.mkdir(parents=True)
    (run / "config.toml").write_text(to_toml(load_job_config([f"--job.name={name}"])))
    (run / "run_info.json").write_text(json.dumps({
        "name": name, "step": max(val), "steps": max(val), "finished": True, "query_type": "linear",
        "non_embedding_params": 1000, "batch_fingerprint": batch, "validation_fingerprint": validation,
    }))
    if tensorboard:
        writer = SummaryWriter(str(run / "tb"))
        for step, loss in val.items():
            writer.add_scalar("loss/val", loss, step)
        writer.close()
    return run


@pytest.fixture(scope="session")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    """The valid inputs of every row: a token folder, a real run (trained here for two steps), its export, runs."""
    import io
    import logging

    from torchnlq.interop.export import export_safetensors
    from torchnlq.config.manager import load_job_config
    from torchnlq.config.render import to_toml
    from torchnlq.train.trainer import Trainer

    root = tmp_path_factory.mktemp("inputs")
    data = write_byte_data(root / "data")
    places = {"{tmp}": str(root), "{data}": str(data)}
    cfg = load_job_config([fill(a, places) for a in TRAIN])
    config = root / "train.toml"
    config.write_text(to_toml(cfg))
    # A real run folder, as the trainer leaves it: the resume rows break a real resume.
    with contextlib.redirect_stdout(io.StringIO()):
        Trainer(cfg).train()
    logger = logging.getLogger("torchnlq")  # setup_logging's handlers hold the run's train.log open
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    run = root / "outputs" / "run"
    ckpt = run / "checkpoints" / "step-2"
    export = export_safetensors(ckpt, root / "export")
    runs = root / "runs"
    write_compare_run(runs, "a", {10: 3.0, 20: 2.5})
    write_compare_run(runs, "b", {10: 2.9, 20: 2.4})
    write_compare_run(runs, "other_batches", {10: 2.9, 20: 2.4}, batch="bbbb")
    write_compare_run(runs, "other_val", {10: 2.9, 20: 2.4}, validation="wwww")
    write_compare_run(runs, "late", {30: 2.0})
    write_compare_run(runs, "no_tb", {10: 2.9}, tensorboard=False)
    return Inputs(root, data, run, ckpt, export, runs, config)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No launcher, no torchrun ranks, no tiktoken file from the caller's environment; datasets offline."""
    for var in (LAUNCH_DIR_ENV, "TORCHNLQ_TIKTOKEN_FILE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return monkeypatch


# ==================================================================================================
# The tests
# ==================================================================================================

def working_folder(tmp: Path) -> Path:
    """The row's working directory ({tmp}), one level below the snapshotted folder: '..' is watched too."""
    work = tmp / "work"
    work.mkdir()
    return work


@pytest.mark.parametrize("mistake", IN_PROCESS)
def test_mistake(mistake: Mistake, inputs: Inputs, tmp_path: Path, clean_env: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    """One in-process row: exit 2, one ``error:`` line with the fragment, no traceback, nothing written."""
    work = working_folder(tmp_path)
    places = inputs.places(work)
    for name, value in mistake.env:
        clean_env.setenv(name, fill(value, places))
    cleanup = mistake.setup(work, inputs) if mistake.setup else None
    clean_env.chdir(work)
    roots = (tmp_path, inputs.root, *ENTRIES[mistake.entry].watch)
    before = snapshot(*roots)
    capsys.readouterr()
    try:
        outcome = run_in_process(mistake.entry, [fill(a, places) for a in mistake.argv], capsys)
    finally:
        if cleanup is not None:
            cleanup()
    assert_one_clean_line(outcome, fill(mistake.fragment, places))
    assert_unchanged(before, snapshot(*roots))


@dataclass
class Launched:
    """A subprocess row in flight: its folder (the parent of its cwd), the snapshot taken before it started,
    its future outcome."""

    tmp: Path
    places: dict[str, str]
    before: Snapshot
    outcome: concurrent.futures.Future[Outcome]


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> Outcome:
    proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


@dataclass
class Launches:
    """The subprocess rows in flight, and the shared inputs as they were before any of them started."""

    rows: dict[str, Launched]
    inputs_before: Snapshot


@pytest.fixture(scope="module")
def launched(request: pytest.FixtureRequest, inputs: Inputs,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launches]:
    """Start every selected subprocess row at once (a few at a time), so their ~3 s starts overlap.

    Each row gets its own folder (cwd) and a cache folder outside it: TORCHNLQ_CACHE, HF_HOME,
    TIKTOKEN_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR are this test's caches, excluded by design.
    """
    selected = {item.callspec.id: item.callspec.params["mistake"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_mistake_in_a_subprocess"}
    cache = tmp_path_factory.mktemp("subprocess-cache")
    base_env = script_env(cache)  # this Python first on PATH, OMP_NUM_THREADS=1, TORCHNLQ_CACHE=cache/cache
    for var, sub in (("HF_HOME", "hf"), ("TIKTOKEN_CACHE_DIR", "tiktoken"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        base_env[var] = str(cache / sub)
    for var in (LAUNCH_DIR_ENV, "TORCHNLQ_TIKTOKEN_FILE", "NGPU", "NNODES", "LOG_RANK", "STOP_TIMEOUT"):
        base_env.pop(var, None)
    inputs_before = snapshot(inputs.root)
    workers = os.cpu_count() or 2
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        rows: dict[str, Launched] = {}
        for row_id, mistake in selected.items():
            tmp = tmp_path_factory.mktemp("mistake")
            work = working_folder(tmp)
            places = inputs.places(work)
            if mistake.setup is not None:
                mistake.setup(work, inputs)
            env = {**base_env, **{name: fill(value, places) for name, value in mistake.env}}
            cmd = [*command(mistake.entry), *(fill(a, places) for a in mistake.argv)]
            rows[row_id] = Launched(tmp, places, snapshot(tmp), pool.submit(_run, cmd, work, env))
        yield Launches(rows, inputs_before)


@pytest.fixture(scope="module", autouse=True)
def start_the_subprocess_rows_first(request: pytest.FixtureRequest) -> None:
    """Start the subprocess rows before the in-process ones when both are selected.

    The in-process rows keep one core busy; the processes run on the others meanwhile (on a
    2-core CI machine this hides most of their cost). Nothing starts under -m "not integration".
    """
    if any(getattr(item, "originalname", "") == "test_mistake_in_a_subprocess" for item in request.session.items):
        request.getfixturevalue("launched")


@pytest.mark.integration
@pytest.mark.parametrize("mistake", SUBPROCESS)
def test_mistake_in_a_subprocess(mistake: Mistake, request: pytest.FixtureRequest, launched: Launches) -> None:
    """One row as a real process (started by the ``launched`` fixture): the same rule as in-process."""
    state = launched.rows[request.node.callspec.id]
    outcome = state.outcome.result()
    assert_one_clean_line(outcome, fill(mistake.fragment, state.places))
    assert_unchanged(state.before, snapshot(state.tmp))


@pytest.mark.integration
def test_subprocess_rows_leave_the_shared_inputs_alone(inputs: Inputs, launched: Launches) -> None:
    """The processes run side by side: the shared inputs are compared once, after all of them ended."""
    for state in launched.rows.values():
        state.outcome.result()
    assert_unchanged(launched.inputs_before, snapshot(inputs.root))


# ----- the table itself --------------------------------------------------------------------------

def _mistakes(params: list[Any]) -> list[Mistake]:
    return [p.values[0] for p in params]


def test_the_catalogue_has_at_least_120_distinct_mistakes() -> None:
    """Every row is its own mistake (command line and environment), and every entry point has rows."""
    rows = _mistakes(IN_PROCESS) + _mistakes(SUBPROCESS)
    keys = [m.key() for m in rows]
    duplicates = sorted({str(k) for k in keys if keys.count(k) > 1})
    assert not duplicates, duplicates
    assert len(set(keys)) >= 120, len(set(keys))
    ids = [p.id for p in IN_PROCESS + SUBPROCESS]
    assert len(set(ids)) == len(ids)
    assert {m.entry for m in rows} == set(ENTRIES), set(ENTRIES) - {m.entry for m in rows}
    assert {m.entry for m in _mistakes(SUBPROCESS)} >= set(ENTRIES) - {P}  # each script once as a real process


# ----- controls: the valid commands the rows break ------------------------------------------------

CONTROLS = [
    pytest.param(P, list(TRAIN), None, id="preflight-of-TRAIN"),
    pytest.param("generate.py", ["{ckpt}", "--max-new-tokens", "2", "--prompt", "ab"], None, id="generate"),
    pytest.param("evaluate.py", ["{ckpt}", "--data", "{data}"], None, id="evaluate"),
    pytest.param("convert_checkpoint.py", ["{ckpt}", "{tmp}/export"], None, id="convert"),
    pytest.param("run_suite.py", ["{tmp}/s.toml", "--dry-run"], suite(SUITE), id="suite-dry-run"),
    pytest.param("compare_runs.py", ["{runs}/a", "{runs}/b", "--baseline", "a", "--out", "{tmp}/cmp"], None, id="compare"),
    pytest.param("model_summary.py", [], None, id="model-summary"),
    pytest.param("bench_checkpoint.py", ["--flavor", "debug", "--repeats", "1"], None, id="bench-checkpoint"),
]


@pytest.mark.parametrize(("entry", "argv", "setup"), CONTROLS)
def test_the_valid_command_works(entry: str, argv: list[str], setup: Setup | None, inputs: Inputs, tmp_path: Path,
                                 clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The shared inputs and the base commands are valid: a row fails for its own mistake, not theirs."""
    work = working_folder(tmp_path)
    places = inputs.places(work)
    if setup is not None:
        setup(work, inputs)
    clean_env.chdir(work)
    before = snapshot(inputs.root)
    outcome = run_in_process(entry, [fill(a, places) for a in argv], capsys)
    assert outcome.code == 0, outcome.err[-3000:]
    assert "error:" not in outcome.err and "Traceback" not in outcome.err
    assert_unchanged(before, snapshot(inputs.root))
