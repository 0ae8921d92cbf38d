"""An MoE training step against a dense one of the same active parameters, its expert paths, its memory.

    python -m benchmarks.moe_step [--dim 128] [--layers 4] [--experts 4] [--top-k 2] [--batch 16] [--seq 128]
                                  [--rounds 12] [--compile] [--device auto|cpu|cuda]

The dense model has a GELU MLP of 4·dim; the MoE model the moe family's block with ``experts`` SwiGLU experts,
``top-k`` per token, each of the width that gives a token the dense MLP's parameters (2·4·dim² = k·3·dim·h).
Every variant is one forward + backward + AdamW step of a batch, timed in interleaved rounds (CPU seconds on a
CPU, CUDA events on a GPU; medians):

- ``dense``: the dense model;
- ``moe grouped``: the experts as ``torch._grouped_mm`` (where the device and dtype have it; on a CPU in eager
  mode);
- ``moe looped``: one expert's rows at a time (the fallback elsewhere, and the compiled fp32 CPU path);
- ``moe all experts``: every expert on every token, weighted by the router (zero for the unchosen): the cost
  grouping avoids.

Then each model's peak memory of a step (the allocator's peak on a GPU; the profiler's allocations on a CPU)
against torchnlq's estimate of the same step (train/memory_estimate.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from unittest import mock

import torch
import torch.nn.functional as F

from benchmarks.timing import DeviceTimer, describe_machine, interleave, machine_info, markdown_table, \
    measure_allocations, median
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.models import build_model, num_params
from torchnlq.models.moe import experts as experts_module
from torchnlq.models.moe.experts import GroupedExperts
from torchnlq.train.memory_estimate import estimate_memory
from torchnlq.train.preflight import check_job_config

MIB = 2**20


def all_experts_forward(self: GroupedExperts, x: torch.Tensor, experts: torch.Tensor,
                        weights: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, the outputs weighted by the router's weights (0 where not chosen)."""
    dense_weights = torch.zeros(x.shape[0], self.n_experts, dtype=weights.dtype, device=x.device)
    dense_weights.scatter_(1, experts, weights)
    hidden = F.silu(torch.einsum("td,ehd->teh", x, self.gate_proj)) * torch.einsum("td,ehd->teh", x, self.up_proj)
    return torch.einsum("teh,edh,te->td", hidden, self.down_proj, dense_weights)


def config(opts: argparse.Namespace, moe: bool) -> list[str]:
    """The overrides of one of the two models (byte vocabulary, no data folder read: the step is synthetic)."""
    common = [f"--model.n_layers={opts.layers}", f"--model.dim={opts.dim}", "--model.n_heads=4",
              f"--model.max_seq_len={opts.seq}", f"--training.seq_len={opts.seq}", "--data.tokenizer=byte",
              f"--training.micro_batch_size={opts.batch}", f"--training.device={opts.device_type}"]
    if not moe:
        return ["--model.flavor=debug", *common]
    # k·3·d·h = 2·d·4d (the dense MLP's parameters per token), rounded to whole 16-byte rows (torch._grouped_mm's)
    hidden = 4 * round(8 * opts.dim / (3 * opts.top_k) / 4)
    return ["--model.flavor=moe_debug", *common, f"--model.moe.n_experts={opts.experts}",
            f"--model.moe.top_k={opts.top_k}", f"--model.moe.expert_hidden={hidden}"]


class Variant:
    """One model and path: a step's function and its times."""

    def __init__(self, label: str, overrides: list[str], opts: argparse.Namespace, device: torch.device,
                 patch: Callable[[], object] | None = None) -> None:
        self.label, self.patch, self.device = label, patch, device
        self.cfg = load_job_config(overrides)
        self.args = check_job_config(self.cfg)
        torch.manual_seed(0)
        with torch.device(device):
            self.model = build_model(self.args)
        if opts.compile:
            for block in self.model.layers:
                block.compile()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.tokens = torch.randint(0, self.args.vocab_size, (opts.batch, opts.seq), device=device)
        self.timer = DeviceTimer(device)
        self.times: list[float] = []

    def step(self) -> None:
        with self.patch() if self.patch else mock.patch.object(sys, "dont_write_bytecode", sys.dont_write_bytecode):
            self.model(self.tokens, targets=self.tokens).backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def time(self) -> float:
        if self.device.type == "cpu":
            start = time.process_time()
            self.step()
            self.times.append(time.process_time() - start)
        else:
            self.times.append(self.timer.time(self.step))
        return self.times[-1]

    def peak_mib(self) -> float:
        """The peak of one step above what the model held before it, in MiB."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            self.step()
            return (torch.cuda.max_memory_allocated() - before) / MIB
        _, _, peak = measure_allocations(self.step)
        return peak / MIB


def run(opts: argparse.Namespace, device: torch.device) -> str:
    opts.device_type = device.type
    loop = lambda: mock.patch.object(experts_module, "grouped_mm_supported", lambda x, hidden: False)  # noqa: E731
    naive = lambda: mock.patch.object(GroupedExperts, "forward", all_experts_forward)  # noqa: E731
    variants = [Variant("dense", config(opts, False), opts, device),
                Variant("moe grouped", config(opts, True), opts, device),
                Variant("moe looped", config(opts, True), opts, device, loop),
                Variant("moe all experts", config(opts, True), opts, device, naive)]
    for variant in variants:  # warm-up: allocations, first calls, compilation
        for _ in range(2):
            variant.step()
    interleave([v.time for v in variants], opts.rounds)
    dense_ms = 1000 * median(variants[0].times)
    rows = []
    for v in variants:
        estimate = estimate_memory(v.cfg, v.args, 1, device.type)
        rows.append([v.label, f"{num_params(v.args):,}", f"{num_params(v.args, active=True):,}",
                     f"{1000 * median(v.times):.1f}", f"{1000 * median(v.times) / dense_ms:.2f}×",
                     f"{v.peak_mib():.1f}", f"{(estimate.step + estimate.gradients) / MIB:.1f}"])
    mode = "compiled blocks" if opts.compile else "eager"
    return "\n".join([
        f"# one step (forward + backward + AdamW) of {opts.batch} x {opts.seq} tokens, {opts.layers} layers, d "
        f"{opts.dim}; MoE {opts.experts} experts top {opts.top_k}; fp32, {mode}; median of {opts.rounds} "
        "interleaved rounds; peak: a step's allocations above the weights and optimizer state",
        f"# {describe_machine(machine_info(device))}",
        markdown_table(["model / experts", "params", "active", "step (ms)", "vs dense", "peak (MiB)",
                        "estimate (MiB)"], rows, right=[False] + [True] * 6),
    ])


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m benchmarks.moe_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--compile", action="store_true", help="torch.compile each block")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.moe_step``."""
    opts = build_parser().parse_args(argv)
    if min(opts.dim, opts.layers, opts.experts, opts.top_k, opts.batch, opts.seq, opts.rounds) < 1:
        raise UserError("--dim, --layers, --experts, --top-k, --batch, --seq and --rounds must be at least 1")
    if opts.top_k > opts.experts:
        raise UserError(f"--top-k={opts.top_k} exceeds --experts={opts.experts}")
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for but no CUDA device is visible; use --device cpu or auto")
    cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    print(run(opts, torch.device("cuda" if cuda else "cpu")))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
