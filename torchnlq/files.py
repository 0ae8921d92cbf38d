"""The one small I/O layer every writer uses: writes that cannot destroy what torchnlq did not write.

Files are replaced atomically through a temporary sibling; a symbolic link at a path written to is
refused, never followed (its target is the user's); entries set aside are renamed, never copied or
deleted; :func:`os_error_line` turns an environment fault into the one line entry points print, and
:func:`writing` makes every writer's fault (wherever the library reports it) such an OSError, naming its path.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from torchnlq.errors import UserError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: What to do about each kind of environment fault.
_FIXES = {
    errno.ENOSPC: "the disk is full: free space there or write elsewhere",
    errno.EDQUOT: "the disk quota is exhausted: free space there or write elsewhere",
    errno.EROFS: "it is on a read-only file system: write elsewhere",
    errno.EACCES: "permission denied: change its permissions or write elsewhere",
    errno.EPERM: "operation not permitted: change its permissions or write elsewhere",
    errno.ENOTDIR: "a file stands where a folder is expected: move it away or choose another path",
    errno.EISDIR: "a folder stands where a file is expected: move it away or choose another path",
    errno.ELOOP: "it is a symbolic link, and torchnlq never writes through links: remove the link",
    errno.ENAMETOOLONG: "the name is too long for the file system: choose a shorter path",
    errno.EEXIST: "it already exists and torchnlq did not write it: move it away or choose another path",
}


def os_error_line(error: OSError) -> str | None:
    """One line for an environment fault, naming where it happened (None for an OSError that is not one, e.g. a
    bug). A write's OSError often carries no file name (``f.write`` on a full disk): the file is then found in the
    frames the error passed through (:func:`_path_in_traceback`), else the folder of a full or read-only disk."""
    fix = _FIXES.get(error.errno)
    if fix is None:
        return None
    path = error.filename if error.filename is not None else _path_in_traceback(error)
    where = f"'{os.fsdecode(path)}'" if path is not None else "a file its writer did not name"
    return f"{where}: {fix} ({error.strerror})"


def _path_in_traceback(error: OSError) -> str | None:
    """The file an OSError without a file name was about: a file object's name or a path among the local values of
    the frames it passed through, innermost first, preferring one on a file system that is full or read-only now
    (for those faults); else the working directory, when its file system is."""
    found: list[str] = []
    frame_tb = error.__traceback__
    frames = []
    while frame_tb is not None:
        frames.append(frame_tb.tb_frame)
        frame_tb = frame_tb.tb_next
    for frame in reversed(frames):
        for value in list(frame.f_locals.values()):
            name = getattr(value, "name", None) if isinstance(value, io.IOBase) else value
            if isinstance(name, os.PathLike):
                name = os.fspath(name)
            if isinstance(name, str) and 0 < len(name) < 4096 and os.path.lexists(name) and name not in found:
                found.append(name)
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        full = [p for p in found if _full_or_read_only(Path(p)) is not None]
        if full or not found:
            return full[0] if full else (os.getcwd() if _full_or_read_only(Path.cwd()) is not None else None)
    return found[0] if found else None


#: A file system with less than this free is full: some writers lose the errno of a failed write (torch's zip
#: writer says "unexpected pos"), but a write that ran out of space always leaves its disk (nearly) full.
FULL_BELOW_BYTES = 2**20
# An errno a library wrote into its message ("os error 28", Rust's io::Error; "[Errno 28]", Python's).
_ERRNO_IN_TEXT = re.compile(r"(?:os error|Errno) (\d+)")


def _causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps: causes, contexts and DCP's per-rank failures (CheckpointException)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):  # {rank: (exception, stack summary)}
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values() if f is not None]
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


def _full_or_read_only(path: Path) -> int | None:
    """ENOSPC or EROFS when the file system holding ``path`` (or its nearest existing folder) is full or
    read-only now; None otherwise or when it cannot be asked."""
    folder = path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    if stat.f_flag & os.ST_RDONLY:
        return errno.EROFS
    return errno.ENOSPC if stat.f_bavail * stat.f_frsize < FULL_BELOW_BYTES else None


def environment_fault(error: BaseException, path: str | Path) -> OSError | None:
    """The environment fault behind ``error``, raised while writing under ``path``, as an OSError that names a
    path (``path`` when the writer did not), or None when ``error`` is not one (a bug, a user mistake).

    Found in what ``error`` wraps (an OSError, or an errno in a library's message), else, when a writer lost the
    errno, in the file system itself: full or read-only right after the failed write.
    """
    if isinstance(error, (KeyboardInterrupt, SystemExit, UserError)):
        return None
    for e in _causes(error):
        if isinstance(e, OSError) and e.errno in _FIXES:
            return e if e.filename is not None else OSError(e.errno, e.strerror, str(path))
        match = _ERRNO_IN_TEXT.search(str(e))
        if match and int(match.group(1)) in _FIXES:
            code = int(match.group(1))
            return OSError(code, os.strerror(code), str(path))
    code = _full_or_read_only(Path(path))
    return OSError(code, os.strerror(code), str(path)) if code is not None else None


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Around writes under ``path`` (a file or a folder): an environment fault leaves as one OSError naming a path
    (:func:`environment_fault`), which entry points print as one line; anything else passes unchanged."""
    try:
        yield
    except BaseException as e:
        fault = environment_fault(e, path)
        if fault is None or fault is e:
            raise
        raise fault from e


def _check_not_link(path: Path) -> None:
    if path.is_symlink():
        raise UserError(f"'{path}' is a symbolic link, and torchnlq never writes through links; remove the link")


def make_folder(path: str | Path) -> Path:
    """``mkdir -p`` that names the first file standing where a folder is expected (one UserError line).

    A link to a folder is a folder here (an outputs folder on another disk is a common set-up).
    """
    path = Path(path)
    for folder in reversed([path, *path.parents]):
        if folder.is_dir():
            continue
        if folder.exists() or folder.is_symlink():
            raise UserError(f"'{folder}' is a file where a folder is expected; move it away or choose another path")
        folder.mkdir(exist_ok=True)
    return path


@contextlib.contextmanager
def no_folder_left_on_failure(path: str | Path) -> Iterator[None]:
    """Around a block that may create ``path`` (and its missing parents) before it can still refuse: when the block
    fails, the folders it created are removed again if they hold no file, so a refusal leaves nothing behind.

    Only folders that did not exist before and hold nothing but (empty) folders are removed: never a file.
    """
    path = Path(path).expanduser()
    first_missing = next((p for p in reversed((path, *path.parents)) if not (p.exists() or p.is_symlink())), None)
    try:
        yield
    except BaseException:
        if first_missing is not None and first_missing.is_dir() and not first_missing.is_symlink():
            for folder, _, _ in os.walk(first_missing, topdown=False):
                with contextlib.suppress(OSError):  # a folder that holds anything stays (rmdir refuses it)
                    os.rmdir(folder)
        raise


def replace_file(path: str | Path, data: bytes | str) -> None:
    """Replace (or create) a file torchnlq owns, atomically: readers see the old or the new file, never half.

    A link at ``path`` is refused (its target is someone else's file), as is a folder.
    """
    path = Path(path)
    _check_not_link(path)
    if path.is_dir():
        raise UserError(f"'{path}' is a folder where a file is expected; move it away or choose another path")
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with writing(path):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_append(path: str | Path, encoding: str = "utf-8"):  # noqa: ANN201 - a text file object
    """Open a log for appending (created if missing); a link or a folder at ``path`` is refused."""
    path = Path(path)
    _check_not_link(path)
    if path.is_dir():
        raise UserError(f"'{path}' is a folder where a file is expected; move it away or choose another path")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW, 0o644)
    return os.fdopen(fd, "a", encoding=encoding)


def move_into_new_folder(parent: str | Path, names: tuple[str, ...], stem: str) -> Path | None:
    """Move the entries ``names`` of ``parent`` that exist (a link moves as the link) into a new folder
    ``parent/<stem>-N``, the lowest N not taken, in the order given; return it (None: none existed).
    Renames within one folder: nothing is copied or deleted."""
    parent = Path(parent)
    present = [name for name in names if (parent / name).exists() or (parent / name).is_symlink()]
    if not present:
        return None
    n = 1
    while (parent / f"{stem}-{n}").exists() or (parent / f"{stem}-{n}").is_symlink():
        n += 1
    target = parent / f"{stem}-{n}"
    target.mkdir()  # raises if another process took the name meanwhile: nothing moved yet
    for name in present:
        os.rename(parent / name, target / name)
    return target


class OwnedFolder:
    """An output folder that may also hold the user's files: torchnlq replaces only the files it wrote there.

    A manifest (:data:`MANIFEST`) lists them; :meth:`check` refuses, before anything is written, a
    name that exists but is not on it (the user's own ``comparison.md``, say).
    """

    MANIFEST = ".torchnlq-files.json"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.owned: set[str] = set()
        try:
            listed = json.loads((self.folder / self.MANIFEST).read_text(encoding="utf-8"))
            if isinstance(listed, list):
                self.owned = {n for n in listed if isinstance(n, str) and n == Path(n).name}
        except (OSError, ValueError):
            pass

    def check(self, names: list[str]) -> None:
        """UserError for the first of ``names`` that exists and torchnlq did not write."""
        for name in names:
            path = self.folder / name
            if (path.exists() or path.is_symlink()) and (name not in self.owned or path.is_symlink()):
                raise UserError(
                    f"'{path}' exists and was not written by torchnlq; it is left as it is: choose another output "
                    "folder or move that file away"
                )

    def write(self, name: str, data: bytes | str) -> Path:
        """Replace (or create) ``name`` atomically and record it in the manifest."""
        self.check([name])
        make_folder(self.folder)
        replace_file(self.folder / name, data)
        self.owned.add(name)
        replace_file(self.folder / self.MANIFEST, json.dumps(sorted(self.owned)))
        return self.folder / name


#: What a JSON or TOML file a user or a stranger hands over may cost to parse.
MAX_DOCUMENT_BYTES = 64 * 2**20


def read_json(path: str | Path, what: str, fix: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> object:
    """Parse a JSON file someone handed over: bounded in size and nesting; never unpickled; one line when bad."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise UserError(f"{what} '{path}' is {size:,} bytes, more than the {max_bytes:,} torchnlq reads; it is not one")
    raw = path.read_bytes()
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"'{path}' is corrupt ({e}); {fix}") from None
    except RecursionError:
        raise UserError(f"'{path}' is nested too deeply to be {what}; {fix}") from None
