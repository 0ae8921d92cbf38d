#!/usr/bin/env python
"""Time a training step and measure its activation memory for each activation-checkpointing
mode, with compile off and on (CPU, fp32). Prints a Markdown table (see docs/parallelism.md).

Usage: python scripts/bench_parallel.py [--layers 4] [--dim 256] [--heads 4] [--vocab 512]
                                        [--batch 8] [--seq 256] [--steps 5] [--threads 1] [--no-compile]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.activation_memory import format_table, run_bench
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.config.job_config import ActivationCheckpoint, Query
from torchnlq.errors import UserError
from torchnlq.models import ModelArgs


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--query", default="residual_mlp")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra-op CPU threads (1: CPU time = work done)")
    parser.add_argument("--no-compile", action="store_true", help="eager only")
    opts = parser.parse_args(argv)
    sizes = {"--layers": opts.layers, "--dim": opts.dim, "--heads": opts.heads, "--vocab": opts.vocab,
             "--batch": opts.batch, "--seq": opts.seq, "--steps": opts.steps, "--threads": opts.threads}
    for name, value in sizes.items():
        if value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")
    # ModelArgs checks the shapes and the query type (one-line ConfigErrors) before anything runs.
    args = ModelArgs(
        n_layers=opts.layers, dim=opts.dim, n_heads=opts.heads, vocab_size=opts.vocab,
        max_seq_len=opts.seq, query=Query(type=opts.query),
    )
    torch.set_num_threads(opts.threads)
    modes = [ActivationCheckpoint(mode="none"), ActivationCheckpoint(mode="full"),
             ActivationCheckpoint(mode="selective", every=2), ActivationCheckpoint(mode="op")]
    compile_options = [False] if opts.no_compile else [False, True]
    print(f"# {opts.layers} layers, d={opts.dim}, {opts.heads} heads, vocab {opts.vocab}, query {opts.query}, "
          f"micro-batch {opts.batch} x {opts.seq}, fp32, {torch.get_num_threads()} CPU threads, "
          f"torch {torch.__version__}")
    print(format_table(run_bench(args, opts.batch, opts.seq, modes, compile_options, steps=opts.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
