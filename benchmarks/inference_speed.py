"""Inference speed per query type: prefill and KV-cache decoding (the paper: "Inference speed has not been measured").

A decode step is small and launch/memory bound, so the nonlinear query's extra elementwise work
is not hidden there. Per variant, in interleaved rounds: a prefill into an empty cache, decode
steps against it, and the memory (weights, KV cache, peak above the weights). ``--compile``
uses dynamic shapes, so the growing cache position does not recompile every step.

    python -m benchmarks.inference_speed [--layers 12] [--dim 768] [--heads 12] [--batch 1] [--prompt 128]
                                         [--decode 32] [--rounds 12] [--compile] [--autocast fp32|bf16]
                                         [--device auto|cpu|cuda] [--variants ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.timing import measure_allocations
from benchmarks.timing import DeviceTimer, describe_machine, interleave, machine_info, markdown_table, median
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.models.args import ModelArgs
from torchnlq.models.layers import KVCache
from torchnlq.models import build_model

# The arrangements compared (label -> query config, extra ModelArgs); the first is the reference.
VARIANTS: dict[str, tuple[Query, dict]] = {
    "linear": (Query(type="linear"), {}),
    "identity": (Query(type="identity"), {}),
    "residual": (Query(type="residual"), {}),
    "residual_mlp": (Query(type="residual_mlp"), {}),
    "linear GQA": (Query(type="linear"), {"gqa": True}),
    "residual_mlp GQA": (Query(type="residual_mlp"), {"gqa": True}),
}


@dataclass
class InferenceResult:
    """One variant's figures: times in ms, rates in tokens/s, memory in MiB."""

    label: str
    params: int
    prefill_ms: float
    prefill_tokens_per_s: float
    decode_ms_per_step: float
    decode_tokens_per_s: float
    weights_mib: float
    kv_cache_mib: float
    peak_mib: float


class _Case:
    """One variant: its model, prompt and timings."""

    def __init__(self, label: str, query: Query, extra: dict, opts: argparse.Namespace, device: torch.device) -> None:
        kv_heads = (opts.kv_heads or max(1, opts.heads // 4)) if extra.get("gqa") else opts.heads
        self.args = ModelArgs(n_layers=opts.layers, dim=opts.dim, n_heads=opts.heads, n_kv_heads=kv_heads,
                              vocab_size=opts.vocab, max_seq_len=opts.prompt + opts.decode, query=query)
        torch.manual_seed(0)
        with torch.device(device):
            self.model = build_model(self.args)
            self.model.init_weights()
        self.model.eval()
        if opts.autocast == "bf16":
            self.model.to(torch.bfloat16)  # inference weights in bf16, as an export with --dtype bf16
        self.fn: Callable[..., torch.Tensor] = (
            torch.compile(self.model, dynamic=True) if opts.compile else self.model
        )
        gen = torch.Generator().manual_seed(1)
        self.prompt = torch.randint(0, opts.vocab, (opts.batch, opts.prompt), generator=gen).to(device)
        self.next_token = torch.randint(0, opts.vocab, (opts.batch, 1), generator=gen).to(device)
        self.decode_steps, self.batch = opts.decode, opts.batch
        self.label, self.timer = label, DeviceTimer(device)
        self.cache = KVCache.for_model(self.model)
        self.prefill_s: list[float] = []
        self.decode_s: list[float] = []

    @torch.no_grad()
    def prefill(self) -> None:
        self.cache.reset()
        self.fn(self.prompt, cache=self.cache)

    @torch.no_grad()
    def decode(self) -> None:
        for _ in range(self.decode_steps):
            self.fn(self.next_token, cache=self.cache)

    def time_prefill(self) -> float:
        seconds = self.timer.time(self.prefill)
        self.prefill_s.append(seconds)
        return seconds

    def time_decode(self) -> float:
        """Prefill (untimed), then the decode steps (timed); returns their total."""
        self.prefill()
        seconds = self.timer.time(self.decode)
        self.decode_s.append(seconds / self.decode_steps)
        return seconds

    def memory(self, device: torch.device) -> tuple[float, float, float]:
        """(weights, KV cache, peak above the weights) in MiB over one prefill + decode."""
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.prefill()
            self.decode()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) - base
        else:
            self.cache = KVCache.for_model(self.model)  # a fresh cache, so its allocation is in the window
            _, _, peak = measure_allocations(lambda: (self.prefill(), self.decode()))
        cache = sum(t.numel() * t.element_size() for t in self.cache.keys + self.cache.values if t is not None)
        return weights / 2**20, cache / 2**20, peak / 2**20

    def result(self, device: torch.device) -> InferenceResult:
        prefill, step = median(self.prefill_s), median(self.decode_s)
        tokens = self.prompt.numel()
        weights, cache, peak = self.memory(device)
        return InferenceResult(
            self.label, sum(p.numel() for p in self.model.parameters()), 1000 * prefill, tokens / prefill,
            1000 * step, self.batch / step, weights, cache, peak,
        )


def run_inference_bench(opts: argparse.Namespace, device: torch.device) -> list[InferenceResult]:
    """Warm up every variant (compiling if asked), then time prefill and decode in interleaved rounds."""
    chosen = [v for v in VARIANTS if not opts.variants or v in opts.variants]
    cases = [_Case(label, *VARIANTS[label], opts, device) for label in chosen]
    # Compiled, the first prefill into an empty cache, a prefill into a reused one and the decode steps
    # are different graphs: two warm-up rounds compile all of them before anything is timed.
    warmup = max(opts.warmup, 2) if opts.compile else opts.warmup
    for case in cases:
        for _ in range(warmup):
            case.prefill()
            case.decode()
    interleave([c.time_prefill for c in cases], opts.rounds)
    interleave([c.time_decode for c in cases], opts.rounds)
    return [c.result(device) for c in cases]


def format_inference_results(results: list[InferenceResult], opts: argparse.Namespace, info: dict) -> str:
    """Two comment lines and one Markdown table; ratios are to the first row."""
    ref = results[0]
    rows = [[r.label, f"{r.params:,}", f"{r.prefill_tokens_per_s:,.0f}", f"{r.prefill_ms / ref.prefill_ms:.3f}×",
             f"{r.decode_ms_per_step:.2f}", f"{r.decode_tokens_per_s:,.0f}",
             f"{r.decode_ms_per_step / ref.decode_ms_per_step:.3f}×", f"{r.kv_cache_mib:,.1f}", f"{r.peak_mib:,.1f}"]
            for r in results]
    return "\n".join([
        (f"# inference: {opts.layers} layers, d={opts.dim}, {opts.heads} heads, vocab {opts.vocab}; "
         f"batch {opts.batch}, "
         f"prompt {opts.prompt}, {opts.decode} decode steps; {'bf16 weights' if opts.autocast == 'bf16' else 'fp32'}, "
         f"{'compiled (dynamic shapes)' if opts.compile else 'eager'}; median of {opts.rounds} interleaved rounds "
         f"after {opts.warmup} warm-up"),
        f"# {describe_machine(info)}",
        markdown_table(
            ["variant", "params", "prefill (tok/s)", "prefill vs first", "decode (ms/step)", "decode (tok/s)",
             "decode vs first", "KV cache (MiB)", "peak above weights (MiB)"],
            rows, right=[False] + [True] * 8,
        ),
    ])


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m benchmarks.inference_speed",
                            description="Prefill and KV-cache decoding speed per query type (eager or compiled).")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=None, help="KV heads of the GQA rows (default: heads / 4)")
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence (the prefill)")
    parser.add_argument("--decode", type=int, default=32, help="decode steps timed after each prefill")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=None, choices=list(VARIANTS), metavar="VARIANT",
                        help=f"a subset of: {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (dynamic shapes)")
    parser.add_argument("--autocast", choices=("fp32", "bf16"), default="fp32", help="bf16: the weights in bf16")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    return parser


def check_options(opts: argparse.Namespace) -> None:
    """One UserError line for options that cannot describe a run."""
    sizes = {"--layers": opts.layers, "--dim": opts.dim, "--heads": opts.heads, "--vocab": opts.vocab,
             "--batch": opts.batch, "--prompt": opts.prompt, "--decode": opts.decode, "--rounds": opts.rounds}
    for name, value in sizes.items():
        if value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")
    if opts.warmup < 0:
        raise UserError(f"--warmup must be at least 0, got {opts.warmup}")
    if opts.dim % opts.heads:
        raise UserError(f"--heads {opts.heads} must divide --dim {opts.dim}")
    kv = opts.kv_heads or max(1, opts.heads // 4)
    if kv < 1 or opts.heads % kv:
        raise UserError(f"--kv-heads {kv} must divide --heads {opts.heads}")
    if opts.json and Path(opts.json).is_dir():
        raise UserError(f"--json '{opts.json}' is a folder; name a file")
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for but no CUDA device is visible; use --device cpu or auto")


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.inference_speed``."""
    opts = build_parser().parse_args(argv)
    check_options(opts)
    want_cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if want_cuda else "cpu")
    info = machine_info(device)
    results = run_inference_bench(opts, device)
    print(format_inference_results(results, opts, info))
    if opts.json:
        Path(opts.json).write_text(json.dumps({"machine": info, "options": vars(opts),
                                               "results": [asdict(r) for r in results]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
