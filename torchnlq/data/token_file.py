"""A token file on disk (``train.bin`` / ``val.bin``) and reading windows of it."""

from __future__ import annotations

import hashlib
import mmap
from pathlib import Path

import numpy as np
import torch

from torchnlq.data import token_format as fmt
from torchnlq.errors import UserError


class TokenFile:
    """A read-only token file (``train.bin`` / ``val.bin``) of ``dtype`` ids (uint16 unless meta.json records
    uint32: :func:`torchnlq.data.token_format.token_dtype`), memory-mapped for random reads.

    The mapping is advised ``MADV_RANDOM``, not to read the kernel's readahead window at every page fault
    (docs/performance.md, "Data loader alone").
    """

    def __init__(self, path: str | Path, dtype: np.dtype = fmt.DTYPE):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        size = self.path.stat().st_size
        if size % self.dtype.itemsize:
            raise UserError(
                f"'{self.path}' has an odd size ({size} bytes), not {self.dtype.name} tokens; prepare it again"
            )
        self._mapping: mmap.mmap | None = None
        # mmap refuses empty files; an empty split is reported by the length checks.
        if size:
            with open(self.path, "rb") as f:
                self._mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.advise(getattr(mmap, "MADV_RANDOM", None))
            self.tokens: np.ndarray = np.frombuffer(self._mapping, dtype=self.dtype)
        else:
            self.tokens = np.zeros(0, dtype=self.dtype)

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
    """Inputs and targets (LongTensor[B, seq_len] each) of the windows at ``offsets``; ``y`` is ``x`` shifted by one."""
    # One gather of all [B, T+1] windows; numpy reads only the touched pages.
    idx = np.asarray(offsets, dtype=np.int64)[:, None] + np.arange(seq_len + 1, dtype=np.int64)
    windows = torch.from_numpy(tokens.tokens[idx].astype(np.int64))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
