"""Time and memory of one training step under each activation-checkpointing mode, with and without compile.

    python -m benchmarks.activation_memory [--layers 4] [--dim 256] [--heads 4] [--vocab 512] [--query residual_mlp]
                                           [--batch 8] [--seq 256] [--steps 5] [--threads 1] [--no-compile]

On the CPU, fp32: a Markdown table, a row per mode (none, full, selective every 2nd block, op)
and compile setting (docs/parallelism.md). Memory is measured without CUDA, from the CPU
allocations ``torch.profiler`` records (process RSS only ever grows), relative to a window's
start: *held after forward* is what forward leaves for backward, *peak fwd+bwd* the highest
point of forward and backward.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.timing import interleave, markdown_table, measure_allocations
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.config.job_config import ActivationCheckpoint, Query
from torchnlq.errors import UserError
from torchnlq.models import ModelArgs, build_model
from torchnlq.parallel.activation_checkpoint import apply_activation_checkpointing, describe_checkpointing
from torchnlq.parallel.parallelize import apply_compile

MB = 2**20


@dataclass
class StepStats:
    """One configuration's figures: step wall time and CPU time in ms, memory in MiB."""

    ac: str
    compile: bool
    step_ms: float
    cpu_ms: float
    held_mb: float
    peak_mb: float


def _loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


class _Config:
    """One (AC mode, compile) configuration: its own seeded model, optimizer and batch."""

    def __init__(self, args: ModelArgs, ac: ActivationCheckpoint, compile: bool, micro_batch: int, seq_len: int,
                 seed: int) -> None:
        torch.manual_seed(seed)
        self.ac, self.compile = ac, compile
        self.model = apply_activation_checkpointing(build_model(args), ac)
        if compile:
            apply_compile(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, args.vocab_size, (micro_batch, seq_len + 1), generator=gen)
        self.times: list[float] = []
        self.cpu_times: list[float] = []

    def step(self) -> None:
        _loss(self.model, self.tokens).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed_step(self) -> float:
        """One step; records (and returns) its wall time, and records its process CPU time."""
        start, cpu_start = time.perf_counter(), time.process_time()
        self.step()
        self.times.append(time.perf_counter() - start)
        self.cpu_times.append(time.process_time() - cpu_start)
        return self.times[-1]

    def stats(self) -> StepStats:
        loss, held, fwd_peak = measure_allocations(lambda: _loss(self.model, self.tokens))
        _, _, bwd_peak = measure_allocations(loss.backward)
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(
            ac=describe_checkpointing(self.ac),
            compile=self.compile,
            step_ms=1000 * min(self.times),
            cpu_ms=1000 * min(self.cpu_times),
            held_mb=held / MB,
            peak_mb=max(fwd_peak, held + bwd_peak) / MB,
        )


def run_bench(
    args: ModelArgs,
    micro_batch: int,
    seq_len: int,
    modes: list[ActivationCheckpoint],
    compile_options: list[bool],
    *,
    steps: int = 5,
    warmup: int = 2,
    seed: int = 0,
) -> list[StepStats]:
    """Step time (the best of ``steps`` interleaved, the least disturbed figure) and memory per (compile, mode)."""
    configs = [_Config(args, ac, c, micro_batch, seq_len, seed) for c in compile_options for ac in modes]
    for config in configs:
        for _ in range(warmup):
            config.step()
    interleave([config.timed_step for config in configs], steps)
    return [config.stats() for config in configs]


def format_table(results: list[StepStats]) -> str:
    """A Markdown table of the results."""
    headers = ["AC mode", "compile", "step CPU time (ms)", "step wall time (ms)", "held after forward (MiB)",
               "peak fwd+bwd (MiB)"]
    rows = [[r.ac, "on" if r.compile else "off", f"{r.cpu_ms:.0f}", f"{r.step_ms:.0f}", f"{r.held_mb:.1f}",
             f"{r.peak_mb:.1f}"] for r in results]
    return markdown_table(headers, rows, right=[False, False, True, True, True, True])


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.activation_memory``: the options' model, a table of every AC mode."""
    parser = ArgumentParser(prog="python -m benchmarks.activation_memory", description=__doc__.splitlines()[0])
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
