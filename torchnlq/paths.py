"""Folders torchnlq must never write into or replace, whoever asks: one rule for every writer."""

from __future__ import annotations

import contextlib
from pathlib import Path


def protected_folders() -> list[Path]:
    """The working directory, the home folder and all their ancestors (``/`` included), resolved."""
    folders = [Path.cwd().resolve()]
    with contextlib.suppress(RuntimeError, KeyError, OSError):  # no home folder (a bare container)
        folders.append(Path.home().resolve())
    return [p for f in folders for p in (f, *f.parents)]


def is_within(path: Path, folder: Path) -> bool:
    """True when ``path`` is ``folder`` or lies inside it (both resolved)."""
    return path == folder or folder in path.parents
