"""One trainer per run folder: an exclusive ``flock`` on ``<run_dir>/.lock``.

Rank 0 takes it before writing anything into the run folder and holds it until ``Trainer.train()`` ends;
the kernel releases a ``flock`` however the process exits (no stale lock). The ``.lock`` file stays: deleting
it on release would let two processes lock two different files of the same name. A filesystem that refuses
flock is a warning (:attr:`RunLock.warning`); a ``fork``ed child that outlives the trainer holds the lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from torchnlq.errors import UserError

LOCK_FILE = ".lock"
# flock is refused by the filesystem itself (not held by another process): run unlocked, with a warning.
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}


# What a run folder holds, and the kind each entry must be (a plain file, or a folder) for the trainer to use it.
RUN_ENTRIES = {"config.toml": "file", "train.log": "file", "run_info.json": "file", LOCK_FILE: "file",
               "checkpoints": "folder", "tb": "folder"}


#: The longest path a run writes below its folder (checkpoints/step-<10 digits>.tmp/__0_0.distcp and the like).
LONGEST_INSIDE = 64


def check_name_lengths(run_dir: Path) -> None:
    """UserError when a name on ``run_dir`` is longer than the file system holds (its NAME_MAX), or the paths the
    run writes below it longer than PATH_MAX: said before any folder is created (job.dump_folder is created too)."""
    anchor = next((p for p in (run_dir, *run_dir.parents) if os.path.isdir(p)), Path("."))
    try:
        name_max, path_max = os.pathconf(anchor, "PC_NAME_MAX"), os.pathconf(anchor, "PC_PATH_MAX")
    except (OSError, ValueError):  # a file system that does not say: the usual limits
        name_max, path_max = 255, 4096
    for part in run_dir.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            key = "job.name" if part == run_dir.name else "job.dump_folder"
            raise UserError(f"{key} has a name of {size} bytes ('{part[:24]}...'), longer than the {name_max} the "
                            f"file system under {anchor} allows; choose a shorter {key}")
    size = len(os.fsencode(str(run_dir.absolute()))) + LONGEST_INSIDE
    if size > path_max:
        raise UserError(f"the run folder's path ({size - LONGEST_INSIDE} bytes) leaves too little of the file "
                        f"system's {path_max} for the run's files; choose a shorter job.dump_folder or job.name")


def check_run_folder(run_dir: Path | str) -> None:
    """UserError (one line), before anything is created, when ``run_dir`` cannot hold a run: a name too long for
    the file system, a file on its path, not writable, or an entry of the wrong kind or a symbolic link (never
    written through)."""
    run_dir = Path(run_dir)
    check_name_lengths(run_dir)
    for path in (run_dir, *run_dir.parents):
        if path.exists():
            if not path.is_dir():
                raise UserError(
                    f"run folder {run_dir} cannot be created: {path} is a file; "
                    "set job.dump_folder (and job.name) to a folder"
                )
            if not os.access(path, os.W_OK | os.X_OK):
                raise UserError(
                    f"run folder {run_dir} cannot be written: {path} is not writable (read-only or another owner); "
                    "set job.dump_folder to a folder you can write"
                )
            break
    for name, kind in RUN_ENTRIES.items():
        entry = run_dir / name
        # Through a link, saves and prunes (checkpoints), event files (tb), the log would land in its target.
        if entry.is_symlink():
            raise UserError(f"{entry} is a symbolic link, and torchnlq never writes through links; remove the link")
        if entry.exists() and not (entry.is_file() if kind == "file" else entry.is_dir()):
            other = "folder" if kind == "file" else "file"
            raise UserError(f"{entry} is a {other} where the run keeps a {kind}; move it away or use a new --job.name")


class RunLock:
    """The exclusive lock of one run folder; ``acquire()`` (or ``with RunLock(d):``), then ``release()``
    (also on garbage collection: a Trainer built but never trained frees its folder)."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        #: Set by acquire() when the filesystem does not support locks (the run is not protected).
        self.warning: str | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock without waiting and write this process into the file; UserError naming another holder."""
        if self._fd is not None:
            return self
        # Never through a link (its target is someone else's file); not inherited by exec'd children.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        refused = self._flock(fd, fcntl.LOCK_EX)
        if refused:
            self.warning = (
                f"could not lock {self.path} ({refused}): the filesystem does not support flock, "
                "so a second trainer on this run folder would not be stopped"
            )
            return self
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    def check_free(self) -> None:
        """Raise the same one-line :class:`UserError` as :meth:`acquire` if another process holds the lock."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        if not self._flock(fd, fcntl.LOCK_SH):
            os.close(fd)

    def _flock(self, fd: int, operation: int) -> str | None:
        """``flock`` without waiting: None when taken; else ``fd`` is closed, and the reason when the filesystem
        refuses locks, a UserError naming the holder when another process has it."""
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise UserError(f"run folder {self.run_dir} is in use by {holder}; wait for it to finish or stop it, "
                            "or use another --job.name") from None
        except OSError as e:
            os.close(fd)
            if e.errno not in _UNSUPPORTED:
                raise
            return os.strerror(e.errno)

    def release(self) -> None:
        """Give the lock back (closing the descriptor releases it); safe to call more than once."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # at interpreter exit os may be gone; the kernel releases the lock anyway
            pass


def _read_holder(fd: int, attempts: int = 20, pause_s: float = 0.05) -> str:
    """``process PID on HOST (started TIME)`` from a held lock's file (read again while still being written)."""
    for attempt in range(attempts):
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode())
            return f"process {info['pid']} on {info['host']} (started {info['started']})"
        except (OSError, ValueError, KeyError, TypeError):
            if attempt + 1 < attempts:
                time.sleep(pause_s)
    return "another process (its pid could not be read from the lock file)"
