"""The catalogue's rows of ``python -m benchmarks.batch_reads``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row, write
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.batch_reads"  # python -m benchmarks.batch_reads, from the repository root

IN_PROCESS = [
    row(ENTRY, "shapes-not-pairs", ["--shapes", "12by1024"], "--shapes: expected pairs like 12x1024,1x1024"),
    row(ENTRY, "zero-in-a-shape", ["--shapes", "0x64", "--tokens", "1000"], "every --shapes size must be at least 1"),
    row(ENTRY, "zero-iterations", ["--iters", "0", "--tokens", "1e5"], "--iters and every --shapes size must be at least 1 (got 0"),
    row(ENTRY, "file-missing", ["--file", "{tmp}/train.bin"], "--file: no such file"),
    row(ENTRY, "tokens-below-one-micro-batch", ["--tokens", "10"], "--tokens 10 is smaller than one micro-batch"),
    row(ENTRY, "tokens-nan", ["--tokens", "nan"], "--tokens must be a finite number of tokens, got nan"),
    row(ENTRY, "file-shorter-than-a-window", ["--file", "{tmp}/small.bin", "--shapes", "2x64"],
        "holds 10 tokens, fewer than one window", setup=write({"small.bin": b"\0\0" * 10})),
    row(ENTRY, "file-empty", ["--file", "{tmp}/empty.bin"], "holds 0 tokens", setup=write({"empty.bin": b""})),
    row(ENTRY, "file-of-odd-size", ["--file", "{tmp}/odd.bin", "--shapes", "1x2"], "has an odd size (3 bytes)",
        setup=write({"odd.bin": b"abc"})),
]

SUBPROCESS = [
    row(ENTRY, "tokens-infinite", ["--tokens", "inf"], "--tokens must be a finite number of tokens, got inf"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
