"""Read DCP checkpoints without running code from the folder: the one way torchnlq opens them.

DCP's stock reader unpickles ``.metadata`` and ``torch.load``-s non-tensor items with ``weights_only=False``.
Here :class:`MetadataUnpickler` resolves only :data:`METADATA_GLOBALS` (shards must lie inside the folder) and
:class:`SafeLoadPlanner` loads with ``weights_only=True``; every DCP read goes through :func:`load_dcp`.
"""

from __future__ import annotations

import collections
import io
import pathlib
import pickle
import re
import warnings
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from torchnlq.errors import UserError

METADATA_FILE = ".metadata"


def _metadata_globals() -> dict[tuple[str, str], Any]:
    """(module, name) -> object for everything a DCP ``.metadata`` pickle refers to by name."""
    allowed: dict[tuple[str, str], Any] = {
        ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
        for name in ("Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
                     "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")
    }
    allowed[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = dcp_filesystem._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    # dtypes pickle by name (torch.float32); layouts through torch.serialization._get_layout("torch.strided").
    for name, value in vars(torch).items():
        if isinstance(value, (torch.dtype, torch.layout)):
            allowed[("torch", name)] = value
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    # StorageMeta.checkpoint_id is the str or path the checkpoint was saved to (pathlib._local on 3.13+).
    for module in ("pathlib", "pathlib._local"):
        for name in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
            allowed[(module, name)] = getattr(pathlib, name)
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    allowed[("builtins", "set")] = set  # protocol 2 pickles (older writers) name them
    allowed[("builtins", "frozenset")] = frozenset
    return allowed


#: The only globals a ``.metadata`` may name; see :func:`_metadata_globals`.
METADATA_GLOBALS: dict[tuple[str, str], Any] = _metadata_globals()


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle named a global outside the allow-list."""

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.qualname = f"{module}.{name}"


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`METADATA_GLOBALS` (no import, no other callable)."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return METADATA_GLOBALS[(module, name)]
        except KeyError:
            raise RefusedGlobal(module, name) from None

    def persistent_load(self, pid: Any) -> NoReturn:
        raise pickle.UnpicklingError("persistent ids are not allowed in DCP metadata")


class DCPReadError(Exception):
    """DCP could not load a checkpoint that passed the safety checks (missing keys, other shapes, a damaged shard)."""


def first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's message, else its type name."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _refuse(folder: Any, what: str) -> NoReturn:
    raise UserError(
        f"'{folder}' is not a torchnlq checkpoint: {what}, which torchnlq does not load (a planted or foreign file)"
    )


def read_safe_metadata(folder: str | Path, file: str | Path | None = None) -> dcp_metadata.Metadata:
    """Unpickle ``folder/.metadata`` (or ``file``) with :class:`MetadataUnpickler` and check what came out."""
    path = Path(file) if file is not None else Path(folder, METADATA_FILE)
    try:
        with open(path, "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except RefusedGlobal as e:
        _refuse(folder, f"its {path.name} holds {e.qualname}")
    except FileNotFoundError:
        raise UserError(f"checkpoint '{folder}' is incomplete (no DCP {path.name}); use another checkpoint") from None
    except Exception as e:  # a damaged pickle fails in many ways (EOFError, UnpicklingError, TypeError, ...)
        raise UserError(
            f"checkpoint '{folder}' has an unreadable {path.name} ({type(e).__name__}); it is corrupt"
        ) from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        _refuse(folder, f"its {path.name} holds a {type(metadata).__name__}, not DCP metadata")
    if not isinstance(metadata.state_dict_metadata, dict) or not isinstance(metadata.storage_data, dict):
        _refuse(folder, f"its {path.name} is not DCP metadata of a file-system checkpoint")
    for info in metadata.storage_data.values():
        if not isinstance(info, dcp_filesystem._StorageInfo) or not isinstance(info.relative_path, str):
            _refuse(folder, f"its {path.name} is not DCP metadata of a file-system checkpoint")
        rel = PurePosixPath(info.relative_path.replace("\\", "/"))
        if rel.is_absolute() or ".." in rel.parts or ":" in info.relative_path or not rel.parts:
            _refuse(folder, f"its {path.name} points at '{info.relative_path}', outside the folder")
    return metadata


def refused_global(error: BaseException) -> str | None:
    """The global a weights-only ``torch.load`` refused, read from its message (None: another failure)."""
    m = re.search(r"GLOBAL ([\w.]+)", str(error))
    return m.group(1) if m else None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that non-tensor items are read with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, map_location="cpu", weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` reading ``.metadata`` with :func:`read_safe_metadata`; needs :class:`SafeLoadPlanner`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        # Mirrors FileSystemReader.read_metadata (torch 2.x): the global file, or a rank's own.
        rank = kwargs.get("rank")
        path = self._get_metadata_path(rank)
        metadata = read_safe_metadata(self.path, path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _slice_file(self, file: Any, sinfo: dcp_filesystem._StorageInfo) -> Any:
        self._reading = sinfo.relative_path  # the shard a failure names
        return super()._slice_file(file, sinfo)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        if not isinstance(planner, SafeLoadPlanner) and any(r.type == LoadItemType.BYTE_IO for r in plan.items):
            raise TypeError("SafeFileSystemReader reads non-tensor items only with SafeLoadPlanner (see load_dcp)")
        self._reading = "?"
        try:
            return super().read_data(plan, planner)
        except pickle.UnpicklingError as e:  # what a weights-only torch.load raises for a foreign pickle
            refused = refused_global(e)
            if refused is None:
                m = re.search(r"WeightsUnpickler error: ([^\n]+)", str(e))  # what failed (torch puts advice first)
                reason = m.group(1).strip() if m else first_line(e)
                raise DCPReadError(f"shard {self._reading} is unreadable ({reason})") from None
            _refuse(self.path, f"its shard {self._reading} holds {refused}")


def damaged_shards(folder: str | Path) -> list[str]:
    """The shard files of ``folder`` that are missing or shorter than its metadata says, as readable phrases."""
    metadata = read_safe_metadata(folder)
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    damaged = []
    for name, size in sorted(needed.items()):
        file = Path(folder, name)
        if not file.is_file():
            damaged.append(f"{name} is missing")
        elif file.stat().st_size < size:
            damaged.append(f"{name} is truncated ({file.stat().st_size:,} of {size:,} bytes)")
    return damaged


def load_dcp(state: dict[str, Any], folder: str | Path) -> None:
    """``dcp.load(state)`` from ``folder``, safely; a refusal is a UserError, other failures DCPReadError."""
    reader = SafeFileSystemReader(str(folder))
    reader.read_metadata()  # refusals surface here, before DCP would log and wrap them
    with warnings.catch_warnings():
        # "torch.distributed is disabled ... assuming the intent is to load in a single process": it is.
        warnings.filterwarnings("ignore", message=".*single process.*")
        try:
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
        except CheckpointException as e:  # a BaseException: DCP's report of every rank's failure
            errors = [exc for exc, _trace in e.failures.values()]  # every rank's; a UserError first, if any
            cause = next((exc for exc in errors if isinstance(exc, UserError)), errors[0] if errors else e)
            if isinstance(cause, UserError):
                raise UserError(str(cause)) from None
            damaged = damaged_shards(folder)  # name the bad file when the sizes tell which
            raise DCPReadError("; ".join(damaged) if damaged else first_line(cause)) from None
        except UserError:
            raise
        except Exception as e:
            raise DCPReadError(first_line(e)) from None
