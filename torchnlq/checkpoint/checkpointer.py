"""Save and resume: DCP checkpoints in ``<run>/checkpoints/step-N``.

A checkpoint holds everything an exact resume needs: the model and optimizer
(through ``get_state_dict``, so FSDP-sharded and plain models save the same
FQN-keyed state and a checkpoint loads at any world size), the step and tokens
seen (the run's :class:`~torchnlq.checkpoint.record.RunRecord`, in
:data:`~torchnlq.checkpoint.metadata.META_FILE`), and every rank's
RNG states (``rng-rank{r}.pt``: tensors and plain values, read with
``weights_only=True``), and for a gpt2 run the tokenizer's ranks
(``tokenizer.tiktoken``, a copy of the recorded ``.tiktoken`` file: the checkpoint is
sampled from and exported without the user's ranks file). The data position needs no
state: the batch of step s is a pure function of s. Reading a checkpoint runs no code from it: DCP's
``.metadata`` and shards are read through :mod:`torchnlq.checkpoint.safe_reader`.

Atomicity: everything is written into ``step-N.partial``; rank 0 renames it to
``step-N`` only after all ranks finished, so a ``step-N`` folder is always
complete, and a save killed midway leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import dataclasses

import logging
import random
import re
import shutil
import time
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from torchnlq.checkpoint.metadata import META_FILE, MODEL_KEY, read_meta, write_meta
from torchnlq.checkpoint.record import RunRecord
from torchnlq.checkpoint.safe_reader import DCPReadError, load_dcp
from torchnlq.config.job_config import Checkpoint
from torchnlq.data.hf_tokenizer import TOKENIZER_RANKS_FILE, find_gpt2_ranks
from torchnlq.errors import UserError
from torchnlq.pause_points import pause_point

STEP_DIR = re.compile(r"^step-(\d+)$")
# DCP warns on every single-process save/load that it "assumes" one process: that is our intent.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def list_checkpoints(folder: Path) -> list[int]:
    """Steps of the complete checkpoints in ``folder``, ascending (partial saves are ignored)."""
    if not folder.is_dir():
        return []
    steps = []
    for p in folder.iterdir():
        m = STEP_DIR.match(p.name)
        if m and (p / META_FILE).is_file() and (p / ".metadata").is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


RNG_FORMAT = 2  # 1 (unversioned): random.getstate() and np.random.get_state() pickled as they are


def _pack_rng(python: tuple, numpy: tuple, cpu: torch.Tensor, cuda: list[torch.Tensor] | None) -> dict[str, Any]:
    """RNG states as tensors and plain values: ``torch.load(..., weights_only=True)`` reads them back."""
    py_version, py_internal, py_gauss = python
    np_name, np_keys, np_pos, np_has_gauss, np_cached = numpy
    state: dict[str, Any] = {
        "format": RNG_FORMAT,
        "python": {
            "version": int(py_version),
            "state": torch.tensor(py_internal, dtype=torch.int64),  # 624 uint32 words + the position
            "gauss_next": py_gauss,  # None or a float
        },
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),  # 624 uint32 words
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "torch": cpu,
    }
    if cuda is not None:
        state["cuda"] = cuda
    return state


def rng_state() -> dict[str, Any]:
    """Every RNG state of this process (Python, NumPy, torch CPU and CUDA), without pickled objects."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return _pack_rng(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss_next"]))
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_array_globals() -> list[Any]:
    """The globals a pickled uint32 ndarray names (format 1 files), under NumPy 1.x and 2.x names."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct
    return [
        (_reconstruct, "numpy.core.multiarray._reconstruct"),
        (_reconstruct, "numpy._core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),  # numpy.dtypes.UInt32DType (NumPy >= 1.25), the dtype's BUILD target
    ]


def _bad_rng_file(path: Path, why: str) -> UserError:
    return UserError(
        f"'{path}' is not a torchnlq RNG state ({why}): a planted or foreign file; "
        "delete it to resume with this rank's RNG as seeded"
    )


def _is_format_1(state: dict[str, Any]) -> bool:
    """Python's state tuple of ints and NumPy's ('MT19937', uint32 array, int, int, float), as pickled before."""
    try:
        _, py_internal, py_gauss = state["python"]
        _, np_keys, *_ = state["numpy"]
        return (
            isinstance(py_internal, tuple) and all(isinstance(x, int) for x in py_internal)
            and (py_gauss is None or isinstance(py_gauss, float))
            and isinstance(np_keys, np.ndarray) and np_keys.dtype == np.uint32
        )
    except (KeyError, TypeError, ValueError):
        return False


def _is_rng_state(state: dict[str, Any]) -> bool:
    """Whether ``state`` has the shape of :func:`rng_state` (so :func:`set_rng_state` cannot fail on it)."""
    try:
        py, npy, cpu = state["python"], state["numpy"], state["torch"]
        return (
            isinstance(py["version"], int) and isinstance(py["state"], torch.Tensor)
            and py["state"].dtype == torch.int64 and py["state"].shape == (625,)
            and (py["gauss_next"] is None or isinstance(py["gauss_next"], float))
            and npy["name"] == "MT19937" and isinstance(npy["keys"], torch.Tensor)
            and npy["keys"].dtype == torch.int64 and npy["keys"].shape == (624,)
            and all(isinstance(npy[k], int) for k in ("pos", "has_gauss")) and isinstance(npy["cached_gaussian"], float)
            and isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8
            and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in state.get("cuda", []))
        )
    except (KeyError, TypeError):
        return False


def load_rng_state(path: Path) -> dict[str, Any]:
    """Read ``rng-rank{r}.pt`` with ``weights_only=True``, never running code from it.

    Format 2 files hold only tensors and plain values. Format 1 files (torchnlq before
    RNG_FORMAT 2) pickled NumPy's state tuple, whose uint32 array needs NumPy's array
    reconstructor: exactly those globals (:func:`_numpy_array_globals`) are allowed while
    reading, nothing else. Anything that is not an RNG state is a one-line UserError.
    """
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a weights-only refusal (UnpicklingError) or a damaged file
        m = re.search(r"GLOBAL ([\w.]+)", str(e))
        raise _bad_rng_file(path, f"it holds {m.group(1)}" if m else f"unreadable: {type(e).__name__}") from None
    if not isinstance(state, dict):
        raise _bad_rng_file(path, f"a {type(state).__name__}, not a dict of RNG states")
    if "format" not in state and _is_format_1(state):
        try:
            state = _pack_rng(state["python"], state["numpy"], state.get("torch"), state.get("cuda"))
        except (TypeError, ValueError, OverflowError):
            raise _bad_rng_file(path, "its NumPy state is not what torchnlq writes") from None
    elif state.get("format") not in (None, RNG_FORMAT):
        raise _bad_rng_file(path, f"format {state['format']!r}; this torchnlq reads {RNG_FORMAT}")
    if not _is_rng_state(state):
        raise _bad_rng_file(path, "its states are not what torchnlq writes")
    return state


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"dim": 8}}`` -> ``{"model.dim": 8}``, so a difference can be named exactly."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# Fingerprint keys newer than the first torchnlq checkpoints (checkpoints without them still resume).
FINGERPRINT_KEYS_ADDED_LATER = frozenset({"data.content"})


def compare_fingerprints(saved: dict[str, Any], current: dict[str, Any], where: str) -> None:
    """Refuse to resume when model shape or data differ; name the first differing field.

    Fingerprints are nested dicts (``{"model": {...}, "data": {...}}``); only the
    sections present in ``current`` are compared (model-only loads pass just "model").
    A key in :data:`FINGERPRINT_KEYS_ADDED_LATER` that an older checkpoint lacks is not
    compared: that checkpoint is checked for everything it recorded.
    """
    saved = flatten({k: v for k, v in saved.items() if k in current})
    current = flatten(current)
    for key in sorted(set(saved) | set(current)):
        if key not in saved and key in FINGERPRINT_KEYS_ADDED_LATER:
            continue
        if saved.get(key) != current.get(key):
            raise UserError(
                f"{where} was saved with {key}={saved.get(key)!r} but this run has {key}={current.get(key)!r}; "
                "resume with the original settings, or start a new run (--job.name) or from its weights "
                "(--checkpoint.initial_load_path)"
            )


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class CorruptCheckpoint(UserError):
    """A checkpoint whose files are damaged (truncated, missing): an earlier one may still resume."""


class Checkpointer:
    """Saves, prunes and loads the run's checkpoints; one per process, all ranks call every method."""

    def __init__(
        self, cfg: Checkpoint, run_dir: Path, rank: int, logger: logging.Logger, tiktoken_file: str | None = None
    ) -> None:
        self.cfg = cfg
        self.folder = run_dir / "checkpoints"
        self.rank = rank
        self.logger = logger
        self._pending: tuple[Future, Path, Path, int] | None = None
        self._async_group = None
        if cfg.async_mode and dist.is_available() and dist.is_initialized():
            # A separate gloo group keeps background-save collectives off the training group.
            self._async_group = dist.new_group(backend="gloo")
        self.last_save_blocked_s = 0.0
        # The tokenizer every checkpoint carries (rank 0 writes it): where to look, and what was found.
        self.tiktoken_file = tiktoken_file  # data.tiktoken_file
        self._tokenizer_source: Path | None = None  # the checkpoint this run resumed or started from
        self._ranks: bytes | None = None
        self._ranks_looked_up = False

    # ----- saving ---------------------------------------------------------------------------

    def due(self, step: int, last: bool) -> bool:
        """Whether the loop should save after ``step``: every ``interval`` steps and at the last one."""
        return self.cfg.enabled and (last or step % self.cfg.interval == 0)

    def save(self, record: RunRecord, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Write ``step-N`` for ``record.step`` (synchronously, or in the background with ``async_mode``)."""
        step = record.step
        self.wait()  # at most one save in flight: the previous one must be complete and renamed
        start = time.perf_counter()
        final = self.folder / f"step-{step}"
        partial = self.folder / f"step-{step}.partial"
        if self.rank == 0:
            if partial.exists():
                shutil.rmtree(partial)  # left by a killed save
            partial.mkdir(parents=True)
        _barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {MODEL_KEY: model_sd, "optimizer": optim_sd}
        torch.save(rng_state(), partial / f"rng-rank{self.rank}.pt")
        if self.rank == 0:
            write_meta(partial, record.to_meta())
            self._write_tokenizer(partial, record.tokenizer)
        if self.cfg.async_mode:
            future = dcp.async_save(state, checkpoint_id=str(partial), process_group=self._async_group)
            self._pending = (future, partial, final, step)
        else:
            dcp.save(state, checkpoint_id=str(partial))
            pause_point("save", step)  # fault tests: shards written, not yet complete
            self._finish(partial, final, step)
        self.last_save_blocked_s = time.perf_counter() - start

    def _write_tokenizer(self, partial: Path, tokenizer: dict[str, Any]) -> None:
        """Put the gpt2 ranks into the checkpoint, so generate.py and exports need no --tiktoken-file.

        Looked up once, at the first save (:func:`find_gpt2_ranks`: data.tiktoken_file, the checkpoint
        the run resumed from, $TORCHNLQ_TIKTOKEN_FILE, tiktoken's cache). Training never fails for
        them: a run whose ranks are nowhere offline warns once and saves checkpoints without.
        The byte tokenizer needs no file.
        """
        if tokenizer.get("name") != "gpt2":
            return
        if not self._ranks_looked_up:
            self._ranks_looked_up = True
            # A damaged copy in the resumed checkpoint must not hide a good file elsewhere: then look again without it.
            sources = [self._tokenizer_source, None] if self._tokenizer_source is not None else [None]
            for source in sources:
                try:
                    self._ranks = find_gpt2_ranks(tokenizer, source, self.tiktoken_file)
                    break
                except UserError as e:
                    error = e
            else:
                self.logger.warning(
                    f"warning: checkpoints will not carry the gpt2 tokenizer ({error}); generate.py and exports "
                    "of them will need the ranks file"
                )
        if self._ranks is not None:
            (partial / TOKENIZER_RANKS_FILE).write_bytes(self._ranks)

    def wait(self) -> None:
        """Block until a background save is written, then make it visible (rename, prune)."""
        if self._pending is None:
            return
        future, partial, final, step = self._pending
        self._pending = None
        future.result()
        self._finish(partial, final, step)

    def _finish(self, partial: Path, final: Path, step: int) -> None:
        _barrier()  # every rank's shards are on disk
        if self.rank == 0:
            if final.exists():
                shutil.rmtree(final)  # re-saving a step (e.g. after --checkpoint.resume=false)
            partial.rename(final)
            self._prune()
            self.logger.info(f"checkpoint saved: {final}")
        _barrier()

    def _prune(self) -> None:
        if self.cfg.keep_latest_k <= 0:
            return
        for step in list_checkpoints(self.folder)[: -self.cfg.keep_latest_k]:
            shutil.rmtree(self.folder / f"step-{step}", ignore_errors=True)

    # ----- loading --------------------------------------------------------------------------

    def resume_path(self) -> Path | None:
        """The checkpoint to resume from: ``load_step`` or the latest; None for a fresh run."""
        if not self.cfg.resume:
            return None
        steps = list_checkpoints(self.folder)
        if self.cfg.load_step >= 0:
            if self.cfg.load_step not in steps:
                have = ", ".join(map(str, steps)) or "none"
                raise UserError(
                    f"checkpoint.load_step={self.cfg.load_step} not found in {self.folder} (have: {have}); "
                    "use -1 for the latest"
                )
            return self.folder / f"step-{self.cfg.load_step}"
        return self.folder / f"step-{steps[-1]}" if steps else None

    def load(
        self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, fingerprint: dict[str, Any]
    ) -> RunRecord:
        """Load model (and optimizer and RNG unless ``optimizer`` is None) from ``path``; return its record.

        ``fingerprint`` is this run's :meth:`RunRecord.resume_fingerprint`: a checkpoint of
        another model shape or data order is refused, naming the first difference.
        """
        meta = read_meta(path)
        compare_fingerprints(meta.get("fingerprint", {}), fingerprint, f"checkpoint {path}")
        self._tokenizer_source = path  # its tokenizer ranks, if it carries them, go on into this run's checkpoints
        model_only = optimizer is None
        rng_file = path / f"rng-rank{self.rank}.pt"
        # Read (and check) before anything is loaded; a new rank after a world-size change keeps its seed.
        rng = load_rng_state(rng_file) if not model_only and rng_file.is_file() else None
        model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
        state: dict[str, Any] = {MODEL_KEY: model_sd}
        if not model_only:
            state["optimizer"] = optim_sd
        try:
            load_dcp(state, path)  # never unpickles beyond DCP's metadata classes (safe_reader.py)
        except DCPReadError as e:
            raise CorruptCheckpoint(f"could not load checkpoint {path}: {e}") from None
        set_state_dict(
            model, optimizer if optimizer is not None else [],
            model_state_dict=state[MODEL_KEY],
            optim_state_dict=state.get("optimizer", {}),
            options=StateDictOptions(strict=True),
        )
        if rng is not None:
            set_rng_state(rng)
        return RunRecord.from_meta(meta, path / META_FILE)

    def load_model_only(self, path: str, model: nn.Module, model_fingerprint: dict[str, Any]) -> str:
        """Load only the weights of another run's checkpoint (checkpoint.initial_load_path); returns a note for the log.

        ``model_fingerprint`` is ``{"model": ...}``: the shapes must match, the data may differ.
        ``path`` may also be a safetensors export or a Hugging Face GPT-2 folder; from either, a
        run whose query is ``anchored`` starts from a linear-query model (upcycling: W_Q becomes
        the anchor, f keeps this run's own initialisation, zero at the start).
        """
        from torchnlq.checkpoint.load import is_export
        from torchnlq.checkpoint.upcycle import is_hf_gpt2_folder, pretrained_weights

        if is_export(path) or is_hf_gpt2_folder(path):
            return self._load_pretrained(path, model, model_fingerprint, pretrained_weights(path))
        meta = read_meta(path)
        compare_fingerprints(meta.get("fingerprint", {}), model_fingerprint, f"checkpoint.initial_load_path {path}")
        self._tokenizer_source = Path(path)
        model_sd, _ = get_state_dict(model, [])
        state = {MODEL_KEY: model_sd}
        try:
            load_dcp(state, path)
        except DCPReadError as e:
            raise UserError(f"could not load weights from {path}: {e} (is the model shape the same?)") from None
        set_state_dict(model, [], model_state_dict=state[MODEL_KEY], optim_state_dict={})
        return ""

    def _load_pretrained(self, path: str, model: nn.Module, model_fingerprint: dict[str, Any],
                         pretrained: tuple[Any, dict[str, Any]]) -> str:
        """Load a full (unsharded) state dict read from an export or a Hugging Face folder into ``model``.

        Returns a note for the run's log ("" unless the load upcycled a linear query).
        """
        from torchnlq.checkpoint.upcycle import anchored_from_linear
        from torchnlq.models.args import ModelArgs

        source_args, state = pretrained
        run_args = ModelArgs.from_dict(model_fingerprint["model"])
        upcycling = anchored_from_linear(source_args, run_args)
        # Upcycling compares the shapes as if this run's query were the source's linear one.
        expected = dataclasses.replace(run_args, query=source_args.query) if upcycling else run_args
        compare_fingerprints({"model": source_args.to_dict()}, {"model": expected.to_dict()},
                             f"checkpoint.initial_load_path {path}")
        self._tokenizer_source = Path(path)
        set_state_dict(model, [], model_state_dict=state, optim_state_dict={},
                       options=StateDictOptions(full_state_dict=True, strict=not upcycling))
        return "upcycled: its W_Q anchors this run's queries, f starts at zero" if upcycling else ""

    def close(self) -> None:
        """Finish any background save."""
        self.wait()
