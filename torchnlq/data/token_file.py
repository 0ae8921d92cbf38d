"""A token file on disk (``train.bin`` / ``val.bin``) and reading windows of it."""

from __future__ import annotations

import hashlib
import mmap
import os
import weakref
from pathlib import Path

import numpy as np
import torch

from torchnlq.data import token_format as fmt
from torchnlq.errors import UserError


class DataFileChanged(UserError):
    """A token file changed under a running reader (truncated or rewritten in place by another program)."""


class TokenFile:
    """A read-only token file (``train.bin`` / ``val.bin``) of ``dtype`` ids (uint16 unless meta.json records
    uint32: :func:`torchnlq.data.token_format.token_dtype`), kept open for random reads.

    Batches are read with ``pread`` on the open file (:meth:`read_windows`), not through the memory map: a file
    another program truncates in place while a run reads it gives a short read, said as one line
    (:class:`DataFileChanged`), where a page of the map beyond the new end would kill the process with SIGBUS; its
    size and mtime are checked at every read too (an edit in place). The map (advised ``MADV_RANDOM``) serves the
    cheap checks when the file is opened (:meth:`sample_windows`).
    """

    def __init__(self, path: str | Path, dtype: np.dtype = fmt.DTYPE):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self._fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)
        stat = os.fstat(self._fd)
        size = stat.st_size
        self._identity = (size, stat.st_mtime_ns)
        if size % self.dtype.itemsize:
            raise UserError(
                f"'{self.path}' has an odd size ({size} bytes), not {self.dtype.name} tokens; prepare it again"
            )
        self.readahead(False)  # random windows: no readahead of the pages after each
        self._mapping: mmap.mmap | None = None
        # mmap refuses empty files; an empty split is reported by the length checks.
        if size:
            self._mapping = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            self.advise(getattr(mmap, "MADV_RANDOM", None))
            self.tokens: np.ndarray = np.frombuffer(self._mapping, dtype=self.dtype)
        else:
            self.tokens = np.zeros(0, dtype=self.dtype)

    def check_unchanged(self) -> None:
        """:class:`DataFileChanged` when the open file's size or mtime is no longer what it was when opened."""
        stat = os.fstat(self._fd)
        if (stat.st_size, stat.st_mtime_ns) != self._identity:
            was = self._identity[0] // self.dtype.itemsize
            raise DataFileChanged(self._changed(f"{was:,} tokens when the run opened it, {stat.st_size:,} bytes now"
                                                if stat.st_size != self._identity[0] else "its mtime changed"))

    def _changed(self, what: str) -> str:
        return (f"'{self.path}' changed while the run was reading it ({what}): another program truncated or "
                "rewrote it in place")

    def read_windows(self, offsets: np.ndarray, length: int) -> np.ndarray:
        """The ``[len(offsets), length]`` tokens at ``offsets`` (in tokens), read from the file itself."""
        self.check_unchanged()
        size = length * self.dtype.itemsize
        buffer = bytearray(len(offsets) * size)
        view = memoryview(buffer)
        for i, offset in enumerate(offsets.tolist()):
            if not 0 <= offset <= len(self.tokens) - length:
                raise IndexError(f"window [{offset}, {offset + length}) outside {self.path}'s "
                                 f"{len(self.tokens)} tokens")
            got = os.preadv(self._fd, [view[i * size:(i + 1) * size]], offset * self.dtype.itemsize)
            if got != size:
                raise DataFileChanged(self._changed(f"a read at token {offset:,} found the file ending before "
                                                    f"{len(self.tokens):,} tokens"))
        return np.frombuffer(buffer, dtype=self.dtype).reshape(len(offsets), length)

    def readahead(self, enabled: bool) -> None:
        """Let the kernel read ahead after each window read (off by default: the windows are random)."""
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_NORMAL if enabled else os.POSIX_FADV_RANDOM)

    def advise(self, advice: int | None) -> None:
        """``madvise`` the whole mapping (a no-op for an empty file or where the platform lacks it)."""
        if self._mapping is not None and advice is not None and hasattr(self._mapping, "madvise"):
            self._mapping.madvise(advice)

    def __len__(self) -> int:
        return len(self.tokens)

    def sample_windows(self, windows: int = 256, window_tokens: int = 512) -> list[np.ndarray]:
        """``windows`` evenly spaced windows of the tokens (the whole file when smaller): cheap at every start."""
        n = len(self.tokens)
        if n <= windows * window_tokens:
            return [self.tokens]
        span = n - window_tokens
        return [self.tokens[i * span // (windows - 1):][:window_tokens] for i in range(windows)]

    def content_fingerprint(self) -> str:
        """Short sha256 of the length and the sampled windows: another corpus of the same size differs."""
        digest = hashlib.sha256(str(len(self.tokens)).encode())
        for window in self.sample_windows():
            digest.update(window.tobytes())
        return digest.hexdigest()[:16]

    def sampled_max(self) -> int:
        """The largest token id in the sampled windows (-1 for an empty file)."""
        return max((int(w.max()) for w in self.sample_windows() if len(w)), default=-1)


def read_batch(tokens: TokenFile, offsets: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (LongTensor[B, seq_len] each) of the windows at ``offsets``; ``y`` is ``x`` shifted by one.

    A file changed since it was opened is :class:`DataFileChanged` (:meth:`TokenFile.read_windows`)."""
    windows = torch.from_numpy(tokens.read_windows(np.asarray(offsets, dtype=np.int64), seq_len + 1).astype(np.int64))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
