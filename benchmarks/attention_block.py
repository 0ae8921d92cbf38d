"""Micro-benchmark of one attention block (query, K,V, SDPA, out-projection) per query type.

The block alone isolates what the query type changes (a whole step dilutes it). Timings are
medians over interleaved rounds of a forward with autograd ("fwd") and forward + backward.

    python -m benchmarks.attention_block [--batch 1] [--seq 1024] [--dim 768] [--heads 12] [--kv-heads N]
                                         [--rope] [--steps 20] [--warmup 3] [--compile] [--autocast fp32|bf16]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchnlq.cli import ArgumentParser, run_cli
from benchmarks.timing import (
    DeviceTimer,
    describe_machine,
    interleave,
    machine_info,
    markdown_table,
    median,
)
from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.models.args import ModelArgs
from torchnlq.models.layers import Attention

# The arrangements compared (label -> query config); the first is the reference of the ratios.
VARIANTS: dict[str, Query] = {
    "linear": Query(type="linear"),
    "identity": Query(type="identity"),
    "residual": Query(type="residual"),
    "residual_mlp": Query(type="residual_mlp"),
}


@dataclass
class AttentionResult:
    """Median times (ms) of one variant and its parameter count."""

    label: str
    params: int
    fwd_ms: float
    fwd_bwd_ms: float


class _Case:
    """One variant: its attention module, input, RoPE tables and timings."""

    def __init__(self, label: str, query: Query, opts: argparse.Namespace, device: torch.device) -> None:
        args = ModelArgs(n_layers=1, dim=opts.dim, n_heads=opts.heads, n_kv_heads=opts.kv_heads, vocab_size=64,
                         max_seq_len=opts.seq, positions="rope" if opts.rope else "learned", query=query)
        torch.manual_seed(0)
        with torch.device(device):
            self.attn = Attention(args)
            self.attn.init_weights(args.init_std, args.init_std)
            self.x = torch.randn(opts.batch, opts.seq, opts.dim, requires_grad=True)
            self.rope = None
            if opts.rope:
                from torchnlq.models.rope import RotaryEmbedding

                rope = RotaryEmbedding(args.head_dim, args.max_seq_len, args.rope_theta)
                rope.init_weights()  # the tables (buffers are allocated empty)
                self.rope = rope.span(0, opts.seq)
        self.fn: Callable[..., torch.Tensor] = torch.compile(self.attn) if opts.compile else self.attn
        self.autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if opts.autocast == "bf16" \
            else contextlib.nullcontext
        self.label, self.timer = label, DeviceTimer(device)
        self.params = sum(p.numel() for p in self.attn.parameters())
        self.fwd: list[float] = []
        self.fwd_bwd: list[float] = []

    def forward(self) -> torch.Tensor:
        with self.autocast():
            return self.fn(self.x, self.rope)

    def forward_backward(self) -> None:
        self.forward().float().square().mean().backward()
        self.attn.zero_grad(set_to_none=True)
        self.x.grad = None

    def time_forward(self) -> float:
        seconds = self.timer.time(self.forward)
        self.fwd.append(seconds)
        return seconds

    def time_forward_backward(self) -> float:
        seconds = self.timer.time(self.forward_backward)
        self.fwd_bwd.append(seconds)
        return seconds


def run_attention_bench(opts: argparse.Namespace, device: torch.device) -> list[AttentionResult]:
    """Warm up every variant (compiling if asked), then time fwd and fwd+bwd interleaved."""
    cases = [_Case(label, query, opts, device) for label, query in VARIANTS.items()]
    for case in cases:
        for _ in range(opts.warmup):
            case.forward_backward()
    interleave([c.time_forward for c in cases], opts.steps)
    interleave([c.time_forward_backward for c in cases], opts.steps)
    return [AttentionResult(c.label, c.params, 1000 * median(c.fwd), 1000 * median(c.fwd_bwd)) for c in cases]


def format_attention_results(results: list[AttentionResult], opts: argparse.Namespace, info: dict) -> str:
    """Two comment lines and one Markdown table; ratios are to the first row (linear)."""
    ref = results[0]
    rows = [[r.label, f"{r.params:,}", f"{r.fwd_ms:.2f}", f"{r.fwd_ms / ref.fwd_ms:.3f}×", f"{r.fwd_bwd_ms:.2f}",
             f"{r.fwd_bwd_ms / ref.fwd_bwd_ms:.3f}×"] for r in results]
    kv = opts.kv_heads or opts.heads
    return "\n".join([
        (f"# attention block: d={opts.dim}, {opts.heads} heads / {kv} kv heads, {'RoPE' if opts.rope else 'no RoPE'}, "
         f"input {opts.batch} x {opts.seq}, {'bf16 autocast' if opts.autocast == 'bf16' else 'fp32'}, "
         f"{'compiled' if opts.compile else 'eager'}; median of {opts.steps} interleaved rounds after {opts.warmup} "
         "warm-up"),
        f"# {describe_machine(info)}",
        markdown_table(["query", "params", "fwd (ms)", "fwd vs linear", "fwd+bwd (ms)", "fwd+bwd vs linear"], rows,
                       right=[False] + [True] * 5),
    ])


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m benchmarks.attention_block",
                            description="Time one attention block per query type (fwd, fwd+bwd).")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=None, help="GQA/MQA key/value heads (default: heads)")
    parser.add_argument("--rope", action="store_true", help="rotary positions (default: none, as GPT-2)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="torch.compile each attention module")
    parser.add_argument("--autocast", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.attention_block``."""
    opts = build_parser().parse_args(argv)
    if min(opts.batch, opts.seq, opts.steps) < 1 or opts.warmup < 0:
        raise UserError(f"--batch, --seq and --steps must be at least 1 and --warmup at least 0 "
                        f"(got {opts.batch}, {opts.seq}, {opts.steps}, {opts.warmup})")
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for but no CUDA device is visible; use --device cpu or auto")
    want_cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if want_cuda else "cpu")
    info = machine_info(device)
    print(format_attention_results(run_attention_bench(opts, device), opts, info))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
