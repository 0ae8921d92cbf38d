"""Save and resume: DCP checkpoints in ``<run>/checkpoints/step-N``.

A checkpoint holds the model and optimizer (FQN-keyed: loads at any world size), the record (:data:`META_FILE`),
every rank's RNG states and ``extra_files`` (no data state: step s's batch is a function of s). It is written into
``step-N.partial``, renamed once all ranks finished: a save killed midway leaves the previous checkpoint the latest.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NoReturn

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
from torchnlq.checkpoint.safe_reader import DCPReadError, load_dcp, refused_global
from torchnlq.config.every import Every
from torchnlq.config.job_config import Checkpoint
from torchnlq.config.manager import flatten
from torchnlq.errors import UserError
from torchnlq.files import environment_fault, os_error_line
from torchnlq.pause_points import pause_point

STEP_DIR = re.compile(r"^step-(\d+)$")
#: What a save writes into ``step-N.partial``: DCP's shards and metadata (and its temporary), RNG states, the
#: record and the tokenizer files.
SAVE_FILE = re.compile(r"^((__\d+)?\.metadata(\.tmp)?|__\d+_\d+\.distcp|rng-rank\d+\.pt|torchnlq\.json"
                       r"|tokenizer\.(json|tiktoken))$")
#: DCP warns on every single-process save that it "assumes" one process: that is our intent.
SINGLE_PROCESS_SAVE = "torch.distributed is disabled, unavailable or uninitialized"


def step_folders(folder: Path) -> list[int]:
    """Steps of every ``step-N`` folder in ``folder`` (complete or not; ``.partial`` saves excluded), ascending."""
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := STEP_DIR.match(p.name)))


def list_checkpoints(folder: Path) -> list[int]:
    """Steps of the complete checkpoints in ``folder``, ascending (partial saves are ignored)."""
    return [s for s in step_folders(folder) if (folder / f"step-{s}" / META_FILE).is_file()
            and (folder / f"step-{s}" / ".metadata").is_file()]


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
    """Read ``rng-rank{r}.pt`` with ``weights_only=True``, never running code from it (format 1's NumPy array:
    exactly its reconstructor's globals); anything that is not an RNG state is a one-line UserError."""
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a weights-only refusal (UnpicklingError) or a damaged file
        refused = refused_global(e)
        raise _bad_rng_file(path, f"it holds {refused}" if refused else f"unreadable: {type(e).__name__}") from None
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


#: An optimizer, or several stepped as one (Muon + AdamW): DCP's state-dict API takes either.
Optimizers = torch.optim.Optimizer | Iterable[torch.optim.Optimizer]

# Fingerprint keys newer than the first torchnlq checkpoints (checkpoints without them still resume).
FINGERPRINT_KEYS_ADDED_LATER = frozenset({"data.content", "data.content_sha256", "optimizer.decay",
                                          "optimizer.no_decay"})
# Keys of removed options that never changed the function (models.config.REMOVED_QUERY_FIELDS).
FINGERPRINT_KEYS_REMOVED = frozenset({"model.query.fuse_kv"})


def compare_fingerprints(saved: dict[str, Any], current: dict[str, Any], where: str, loading: bool = False) -> None:
    """Refuse a checkpoint whose model shape or data differ (the sections in ``current``), naming every difference
    at once; ``loading``: for an initial load of its weights (the fix is then the checkpoint's values), else a
    resume (the fix is the run's original settings)."""
    saved = flatten({k: v for k, v in saved.items() if k in current})
    current = flatten(current)
    differences = []
    for key in sorted(set(saved) | set(current)):
        added_later = key in FINGERPRINT_KEYS_ADDED_LATER and (key not in saved or key not in current)
        if added_later or key in FINGERPRINT_KEYS_REMOVED:
            continue
        if saved.get(key) != current.get(key):
            differences.append(key)
    if not differences:
        return
    if "data.batches" in differences and "data.batches" not in saved and "data.batches" in current:
        raise UserError(f"{where} holds a mixture ([[data.sources]]) drawn by an earlier torchnlq, whose batches "
                        "depended on training.steps; batches are now drawn from their position alone, so that run "
                        "cannot go on with the batches it had: start a new run (--job.name), from its weights "
                        "(--checkpoint.initial_load_path with --checkpoint.initial_load_model_only=true), or resume it "
                        "with the torchnlq that wrote it")
    listed = "; ".join(f"{key} {saved.get(key)!r} there, {current.get(key)!r} here" for key in differences)
    if loading:
        raise UserError(f"{where} holds another model than this run describes ({listed}); to load its weights, set "
                        "these to the checkpoint's values (or drop checkpoint.initial_load_path)")
    raise UserError(f"{where} was saved with other settings than this run has ({listed}); resume with the original "
                    "settings, or start a new run (--job.name) or from its weights (--checkpoint.initial_load_path)")


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class CorruptCheckpoint(UserError):
    """A checkpoint whose files are damaged (truncated, missing): an earlier one may still resume."""


class Checkpointer:
    """Saves, prunes and loads the run's checkpoints; one per process, all ranks call every method."""

    def __init__(
        self, cfg: Checkpoint, run_dir: Path, rank: int, logger: logging.Logger,
        extra_files: Callable[[], Mapping[str, bytes]] | None = None,
    ) -> None:
        self.cfg = cfg
        # Set when a checkpointer exists, not at import: a filter added while a module is imported lasts only as long
        # as the importer's warnings context (a test's, under pytest), and an async save warns from its own thread,
        # outside any context the saving call could hold.
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_SAVE)
        self.schedule = Every(cfg.interval if cfg.enabled else 0)  # the loop's saves
        self.folder = run_dir / "checkpoints"
        self.rank = rank
        self.logger = logger
        self._pending: tuple[Future, Path, Path, int] | None = None
        self._async_group = None
        if cfg.async_mode and dist.is_available() and dist.is_initialized():
            # A separate gloo group keeps background-save collectives off the training group.
            self._async_group = dist.new_group(backend="gloo")
        self.last_save_blocked_s = 0.0
        self._extra_files_source = extra_files
        self._extra_files: Mapping[str, bytes] | None = None  # asked for at the first save

    # ----- saving ---------------------------------------------------------------------------

    def save(self, record: RunRecord, model: nn.Module, optimizer: Optimizers) -> None:
        """Write ``step-N`` for ``record.step`` (in the background with ``async_mode``); a full disk or read-only
        folder is one UserError line naming the resume point, and the half-written ``step-N.partial`` is removed."""
        self.wait()  # at most one save in flight: the previous one must be complete and renamed
        try:
            done = self._save(record, model, optimizer)
        except BaseException as e:
            self._raise_failed(e, record.step)
        if done:
            self.logger.info(f"checkpoint saved: {self.folder / f'step-{record.step}'}")

    def _raise_failed(self, error: BaseException, step: int) -> NoReturn:
        """Raise for a save that failed. Its ``step-N.partial`` goes (a kill, KeyboardInterrupt, leaves it to the
        next start); an environment fault, wherever DCP's threads or torch's writers report it, is one line."""
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise error
        fault = environment_fault(error, self.folder)  # before the removal: the disk as the failed write left it
        self._remove_partial(step)
        if fault is None:
            raise error
        raise UserError(f"saving checkpoint step-{step} failed: {os_error_line(fault)}; its half-written "
                        f"step-{step}.partial was removed; {self.resume_note()}") from error

    def _remove_partial(self, step: int) -> None:
        if self.rank == 0:
            shutil.rmtree(self.folder / f"step-{step}.partial", ignore_errors=True)

    def resume_note(self) -> str:
        """Where the same command goes on from after a failure: the last complete checkpoint, or the run's start."""
        steps = list_checkpoints(self.folder)
        if steps:
            last = steps[-1]
            return f"the last complete checkpoint, step-{last}, is the resume point: run the same command to resume"
        return "no checkpoint is complete yet: the same command starts the run again"

    def _save(self, record: RunRecord, model: nn.Module, optimizer: Optimizers) -> bool:
        """Write ``step-N.partial``; True when it is complete and renamed (False: a background save goes on)."""
        step = record.step
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
            if self._extra_files is None:  # asked for once, at the first save
                self._extra_files = dict(self._extra_files_source()) if self._extra_files_source is not None else {}
            for name, data in self._extra_files.items():
                (partial / name).write_bytes(data)
        if self.cfg.async_mode:
            future = dcp.async_save(state, checkpoint_id=str(partial), process_group=self._async_group)
            self._pending = (future, partial, final, step)
        else:
            dcp.save(state, checkpoint_id=str(partial))
            pause_point("save", step)  # fault tests: shards written, not yet complete
            self._finish(partial, final)
        self.last_save_blocked_s = time.perf_counter() - start
        return not self.cfg.async_mode

    def wait(self) -> None:
        """Block until a background save is written, then make it visible (rename, prune)."""
        if self._pending is None:
            return
        future, partial, final, step = self._pending
        self._pending = None
        try:
            future.result()
            self._finish(partial, final)
        except BaseException as e:
            self._raise_failed(e, step)
        self.logger.info(f"checkpoint saved: {final}")

    def _finish(self, partial: Path, final: Path) -> None:
        _barrier()  # every rank's shards are on disk
        if self.rank == 0:
            if final.exists():
                shutil.rmtree(final)  # re-saving a step (e.g. after --checkpoint.resume=false)
            partial.rename(final)
            self._prune()
        _barrier()

    def remove_abandoned_saves(self) -> list[Path]:
        """Remove the ``step-N.partial`` folders a killed process left (call with the run lock held: no save is in
        flight); one holding anything a save does not write is left as it is. Returns those removed."""
        removed = []
        for path in sorted(self.folder.glob("step-*.partial")) if self.folder.is_dir() else []:
            ours = STEP_DIR.match(path.name.removesuffix(".partial")) and not path.is_symlink() and path.is_dir()
            if ours and all(SAVE_FILE.match(p.name) and p.is_file() and not p.is_symlink() for p in path.iterdir()):
                shutil.rmtree(path)
                removed.append(path)
        return removed

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
        damaged = sorted(set(step_folders(self.folder)) - set(steps))
        if self.cfg.load_step < 0 and damaged and (not steps or damaged[-1] > steps[-1]):
            # The latest checkpoint lost its record or metadata: say so rather than resume an older one silently.
            earlier = f"--checkpoint.load_step={steps[-1]}" if steps else "a new --job.name"
            raise UserError(
                f"checkpoint {self.folder / f'step-{damaged[-1]}'} is damaged (its {META_FILE} or .metadata is "
                f"missing); resume from the previous complete checkpoint with {earlier}, or move it away"
            )
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
        self, path: Path, model: nn.Module, optimizer: Optimizers | None, fingerprint: dict[str, Any]
    ) -> RunRecord:
        """Load model (and optimizer and RNG unless ``optimizer`` is None) from ``path``; return its record."""
        meta = read_meta(path)
        match = STEP_DIR.match(path.name)
        if match and meta.get("step") != int(match.group(1)):  # the step is the record's: a renamed copy is refused
            raise UserError(
                f"checkpoint {path} records step {meta.get('step')!r} but its folder is named {path.name}: "
                f"it was renamed or copied; name it step-{meta.get('step')} again (the step comes from its record)"
            )
        compare_fingerprints(meta.get("fingerprint", {}), fingerprint, f"checkpoint {path}")
        optimizers = optimizer if optimizer is not None else []
        rng_file = path / f"rng-rank{self.rank}.pt"
        # Read (and check) before anything is loaded; a new rank after a world-size change keeps its seed.
        rng = load_rng_state(rng_file) if optimizer is not None and rng_file.is_file() else None
        model_sd, optim_sd = get_state_dict(model, optimizers)
        state = {MODEL_KEY: model_sd} | ({"optimizer": optim_sd} if optimizer is not None else {})
        try:
            load_dcp(state, path)  # never unpickles beyond DCP's metadata classes (safe_reader.py)
        except DCPReadError as e:
            raise CorruptCheckpoint(f"could not load checkpoint {path}: {e}") from None
        set_state_dict(model, optimizers, model_state_dict=state[MODEL_KEY],
                       optim_state_dict=state.get("optimizer", {}), options=StateDictOptions(strict=True))
        if rng is not None:
            set_rng_state(rng)
        return RunRecord.from_meta(meta, path / META_FILE)

    def close(self) -> None:
        """Finish any background save."""
        self.wait()
