"""``suite.log``: the one record of what happened to a suite's runs, whichever executor ran them.

Every line is ``DATE TIME NAME key=value ...``: a launch or a submission (``started``, ``submitted job=ID``), an
end (``exit=CODE seconds=S``, with ``job=ID`` on SLURM and ``stopped_by=SIGNAL`` or ``requeued`` where they
apply) and the suite's own summaries (``suite NAME: ...``). Many processes append to it at once (a pool's
runs, SLURM jobs on several nodes): each line is one ``O_APPEND`` write. ``--status`` reads it back
(:func:`read_records`) to tell a queued or failed run from a new one.
"""

from __future__ import annotations

import fcntl
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torchnlq.files import make_folder, open_append

LOG_NAME = "suite.log"
#: The most of suite.log that --status reads (its end: the latest records win anyway).
MAX_READ_BYTES = 16 * 2**20
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (\S+) (.*)$")
_FIELD = re.compile(r"(\w+)=(\S+)|(\w+)")


@dataclass(frozen=True)
class Record:
    """One parsed line: its time, the run (or task) it is about, and its ``key=value`` fields (bare words map to
    ``""``, e.g. ``started``)."""

    time: str
    name: str
    fields: dict[str, str]


def append(dump_folder: Path, name: str, text: str) -> None:
    """Append ``DATE TIME NAME TEXT`` to the suite's log (the folder is made if missing)."""
    make_folder(dump_folder)
    with open_append(dump_folder / LOG_NAME) as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {name} {text}\n")


def read_end(path: Path, max_bytes: int) -> str:
    """The last ``max_bytes`` of a log file as text (a character cut in two replaced), or "" where it cannot be
    read (not written yet): a log only grows, and its latest lines are what its readers want."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_records(dump_folder: Path) -> dict[str, list[Record]]:
    """Every parsed line of suite.log by name, oldest first (an absent log: none)."""
    records: dict[str, list[Record]] = {}
    for line in read_end(dump_folder / LOG_NAME, MAX_READ_BYTES).splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        fields = {m.group(1) or m.group(3): m.group(2) or "" for m in _FIELD.finditer(match.group(3))}
        records.setdefault(match.group(2), []).append(Record(match.group(1), match.group(2), fields))
    return records


def last_line(path: Path) -> str:
    """The last non-empty line of a log file (what a failed trial or run said), or ""."""
    return next((line.strip() for line in reversed(read_end(path, 8192).splitlines()) if line.strip()), "")


LOCK_NAME = ".suite.lock"


@contextmanager
def suite_lock(dump_folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``<dump>/.suite.lock`` around a step only one process may take at a time (asking
    a study for a trial, submitting the next stage, writing the comparison), waiting for it if need be."""
    make_folder(dump_folder)
    with open_append(dump_folder / LOCK_NAME) as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
