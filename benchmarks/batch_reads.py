"""Throughput of the training data loader alone: ``read_batch`` on a large uint16 token file.

Reads at random offsets, *warm* (pages in the page cache) and *cold* (this file's pages evicted
with ``posix_fadvise(DONTNEED)`` before every read); "cold, readahead" undoes TokenFile's
``POSIX_FADV_RANDOM`` to show what that hint saves (docs/performance.md, "Data loader alone").

    python -m benchmarks.batch_reads [--file train.bin | --tokens 1e9] [--shapes 12x1024,1x1024] [--iters 200]
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from torchnlq.cli import ArgumentParser, run_cli
from benchmarks.timing import (
    describe_machine,
    machine_info,
    markdown_table,
    median,
)
from torchnlq.data import token_format as fmt
from torchnlq.data.token_file import TokenFile, read_batch
from torchnlq.errors import UserError

CHUNK = 64 * 2**20  # tokens per write while creating a random file (128 MiB)


def write_random_tokens(path: Path, tokens: int, vocab: int = 50257) -> Path:
    """A file of ``tokens`` uniformly random uint16 ids below ``vocab``, written in chunks."""
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        f.writelines(
            rng.integers(0, vocab, min(CHUNK, tokens - start), dtype=fmt.DTYPE).tobytes()
            for start in range(0, tokens, CHUNK)
        )
        # Written back to disk now: the page cache cannot evict dirty pages, so "cold" would stay warm.
        f.flush()
        os.fsync(f.fileno())
    return path


def _evict(path: Path) -> None:
    """Drop this file's pages from the page cache (Linux; a no-op where fadvise is missing)."""
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


MODES = ("warm", "cold", "cold, readahead")


def time_reads(path: Path, micro_batch: int, seq_len: int, iters: int, mode: str) -> list[float]:
    """Seconds of each of ``iters`` ``read_batch`` calls at random offsets, in one of :data:`MODES`."""
    tokens = TokenFile(path)
    gen = torch.Generator().manual_seed(0)
    offsets = torch.randint(len(tokens) - seq_len, (iters, micro_batch), generator=gen)
    times = []
    for row in offsets:
        if mode == "warm":
            read_batch(tokens, row, seq_len)
        else:
            del tokens  # a fresh file each time: its pages evicted, nothing of it mapped
            _evict(path)
            tokens = TokenFile(path)
            if mode == "cold, readahead":
                tokens.readahead(True)  # undo TokenFile's POSIX_FADV_RANDOM
        start = time.perf_counter()
        read_batch(tokens, row, seq_len)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.batch_reads``: one table, warm and cold, per micro-batch shape."""
    parser = ArgumentParser(prog="python -m benchmarks.batch_reads",
                            description="Time read_batch on a large token memmap.")
    parser.add_argument("--file", help="an existing train.bin (default: a random file in a temporary folder)")
    parser.add_argument("--tokens", type=float, default=1e9, help="size of the random file in tokens (2 bytes each)")
    parser.add_argument("--shapes", default="12x1024,1x1024", help="micro-batch x seq_len pairs, comma-separated")
    parser.add_argument("--iters", type=int, default=200)
    opts = parser.parse_args(argv)
    try:
        shapes = [(int(b), int(t)) for b, t in (s.split("x") for s in opts.shapes.split(","))]
    except ValueError:
        raise UserError(f"--shapes: expected pairs like 12x1024,1x1024, got {opts.shapes!r}") from None
    if opts.file and not Path(opts.file).is_file():
        raise UserError(f"--file: no such file {opts.file!r} (a train.bin written by scripts/prepare_data.py)")
    if opts.iters < 1 or min(min(shape) for shape in shapes) < 1:
        raise UserError(f"--iters and every --shapes size must be at least 1 (got {opts.iters}, {opts.shapes!r})")
    if not math.isfinite(opts.tokens):
        raise UserError(f"--tokens must be a finite number of tokens, got {opts.tokens}")
    longest = max(t for _, t in shapes)
    if opts.file:
        size = len(TokenFile(opts.file))  # an odd-sized file is a UserError here
        if size < longest + 1:
            raise UserError(f"--file {opts.file!r} holds {size:,} tokens, fewer than one window of the longest "
                            f"--shapes seq_len + 1 = {longest + 1}; use a larger file or shorter --shapes")
    elif opts.tokens < max(b * (t + 1) for b, t in shapes) + 1:
        raise UserError(f"--tokens {opts.tokens:g} is smaller than one micro-batch of --shapes {opts.shapes}; raise it")
    with tempfile.TemporaryDirectory(prefix="torchnlq-loader-") as tmp:
        path = Path(opts.file) if opts.file else write_random_tokens(Path(tmp) / "train.bin", int(opts.tokens))
        rows = []
        for micro_batch, seq_len in shapes:
            for mode in MODES:
                times = time_reads(path, micro_batch, seq_len, opts.iters, mode)
                ms = 1000 * median(times)
                rows.append([f"{micro_batch} x {seq_len}", mode, f"{ms:.3f}",
                             f"{1000 * max(times):.3f}", f"{micro_batch * seq_len / median(times) / 1e6:,.1f}"])
        size = len(TokenFile(path))
        print(f"# read_batch on {path.name}: {size:,} tokens ({2 * size / 2**30:.2f} GiB), "
              f"median of {opts.iters} random micro-batches")
        print(f"# {describe_machine(machine_info(torch.device('cpu')))}")
        print(markdown_table(["micro-batch", "page cache", "median (ms)", "max (ms)", "M tokens/s"], rows,
                             right=[False, False, True, True, True]))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
