"""Time full training steps of a config, or of several variants of it interleaved in one process.

    python -m benchmarks.train_step CONFIG [--section.key=value ...] [--steps N] [--warmup N] [--json OUT]
                                    [--autocast config|bf16|fp32] [--real-data] [--compare "label: --k=v --k2=v2" ...]

Each variant is a real :class:`~torchnlq.train.trainer.Trainer` built from the config
(plus the variant's overrides), and a timed step is ``Trainer.train_step()``: the LR
update, every micro-batch's read, forward and backward, clipping, the optimizer step,
exactly what a run executes. Checkpoints, validation and TensorBoard are switched off,
the run folder is a temporary directory, and the data is a random-token corpus for
the config's tokenizer (``--real-data`` reads ``data.path`` instead).

After ``--warmup`` steps per variant (compilation, optimizer state), ``--steps`` timed
steps run interleaved, one of each variant per round in a shuffled order (see
:func:`benchmarks.timing.interleave`); figures are medians, and the ratio to the
first variant is the median over rounds of the per-round ratio (paired: both steps of
a ratio ran in the same round). One more step per variant measures peak memory: the CUDA
allocator's peak on GPU; on CPU every allocation during the step, recorded by the
profiler (:func:`benchmarks.timing.measure_allocations`), since process RSS
never shrinks and is shared by all variants. Both add the variant's parameters and
optimizer state, which exist before the step. The data column is the time spent in
``read_batch`` plus the host-to-device copy, as a share of the step.

``--autocast`` overrides the trainer's choice (bf16 autocast on CUDA per
``training.mixed_precision``, none on CPU): ``bf16`` autocasts on any device (CPU
included), ``fp32`` never. It may also appear inside a ``--compare`` spec.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.timing import (
    DeviceTimer,
    describe_machine,
    interleave,
    machine_info,
    markdown_table,
    measure_allocations,
    median,
)
from benchmarks.train_step_args import (
    BenchOptions,
    parse_variant,
    split_bench_args,
)
from benchmarks.train_step_support import (
    TimedLoader,
    quiet_trainer_logs,
    tensor_bytes,
    write_random_corpus,
)
from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.data import token_format as fmt
from torchnlq.errors import UserError
from torchnlq.models.counts import flops_per_token
from torchnlq.parallel.device_figures import peak_tflops
from torchnlq.train.trainer import Trainer

# Overrides every benchmark run gets after the user's: no files worth keeping, nothing but steps.
BENCH_OVERRIDES = [
    "--checkpoint.enabled=false", "--checkpoint.initial_load_path=none", "--validation.enabled=false",
    "--validation.sequences=1", "--metrics.tensorboard=false", "--metrics.query_diagnostics_interval=0",
]


@dataclass
class VariantResult:
    """One variant's figures: times in ms, memory in MiB, shares and ratios as fractions."""

    label: str
    overrides: list[str]
    device: str
    compile: bool
    precision: str
    tokens_per_step: int
    flops_per_token: int
    step_ms: float
    step_ms_all: list[float]
    tokens_per_s: float
    tflops: float
    mfu: float | None
    peak_memory_mib: float
    data_ms: float
    data_share: float
    step_time_ratio: float = 1.0


class Variant:
    """One configuration under test: its own Trainer and its timings."""

    def __init__(self, label: str, config_args: list[str], overrides: list[str], autocast: str, opts: BenchOptions,
                 workdir: Path, index: int) -> None:
        self.label, self.overrides = label, overrides
        total_steps = opts.warmup + opts.steps + 1  # + 1: the memory measurement
        run_args = [f"--job.dump_folder={workdir / 'runs'}",
                    f"--job.name=v{index}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', label)}",
                    f"--training.steps={total_steps}", *BENCH_OVERRIDES]
        cfg = load_job_config([*config_args, *overrides, *run_args])
        if not opts.real_data:
            folder = workdir / f"data-{cfg.data.tokenizer}"
            if not fmt.is_complete(folder):
                write_random_corpus(folder, cfg.data.tokenizer)
            cfg.data.path, cfg.data.synthetic = str(folder), False
        # The trainer logs a header line on construction; the benchmark prints only its table.
        with contextlib.redirect_stdout(io.StringIO()):
            self.trainer = Trainer(cfg)
        quiet_trainer_logs()
        device = self.trainer.device
        if autocast == "bf16":
            self.trainer.autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)
        elif autocast == "fp32":
            self.trainer.autocast = contextlib.nullcontext
        self.precision = "fp32" if self.trainer.autocast is contextlib.nullcontext else "bf16 autocast"
        self.reads = TimedLoader(self.trainer.loader, device)
        self.trainer.loader = self.reads
        self.cfg, self.timer = cfg, DeviceTimer(device)
        self.times: list[float] = []
        self.data_times: list[float] = []

    def step(self) -> None:
        """One untimed training step (warm-up)."""
        self.reads.reset()
        self.trainer.train_step()

    def timed_step(self) -> float:
        """One timed training step; records its time and its data-loading time."""
        self.reads.reset()
        seconds = self.timer.time(self.trainer.train_step)
        self.times.append(seconds)
        self.data_times.append(self.reads.total())
        return seconds

    def peak_memory_bytes(self) -> int:
        """Parameters + optimizer state + the peak allocated above them during one more step."""
        trainer, device = self.trainer, self.trainer.device
        static = tensor_bytes(trainer.model.parameters())
        static += tensor_bytes(v for state in trainer.optimizer.state.values() for v in state.values())
        if device.type == "cuda":
            self.timer.synchronize()
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.step()
            self.timer.synchronize()
            return static + torch.cuda.max_memory_allocated(device) - base
        _, _, peak = measure_allocations(self.step)
        return static + peak

    def result(self) -> VariantResult:
        trainer = self.trainer
        step_s = median(self.times)
        data_s = median(self.data_times)
        tokens_per_s = trainer.tokens_per_step / step_s
        fpt = flops_per_token(trainer.model_args, self.cfg.training.seq_len)
        tflops = fpt * tokens_per_s / 1e12
        peak = peak_tflops(trainer.device, self.cfg.metrics.peak_tflops)
        return VariantResult(
            label=self.label, overrides=self.overrides, device=trainer.device.type, compile=self.cfg.training.compile,
            precision=self.precision, tokens_per_step=trainer.tokens_per_step, flops_per_token=fpt,
            step_ms=1000 * step_s, step_ms_all=[1000 * t for t in self.times], tokens_per_s=tokens_per_s,
            tflops=tflops, mfu=tflops / peak if peak else None, peak_memory_mib=self.peak_memory_bytes() / 2**20,
            data_ms=1000 * data_s, data_share=data_s / step_s,
        )

    def close(self) -> None:
        self.trainer.checkpointer.close()
        self.trainer.metrics.close()


def run_bench(config_args: list[str], opts: BenchOptions) -> tuple[list[VariantResult], dict[str, Any]]:
    """Build every variant, warm each up, time them interleaved; (results in order, machine info)."""
    specs = [parse_variant(spec, opts.autocast) for spec in opts.compare] or [("base", [], opts.autocast)]
    labels = [label for label, _, _ in specs]
    if len(set(labels)) != len(labels):
        raise UserError(f"--compare labels must differ, got {', '.join(labels)}")
    # Every variant's blocks share one code object; allow one compiled graph per variant at least.
    limit = max(torch._dynamo.config.recompile_limit, 8 * len(specs))
    with tempfile.TemporaryDirectory(prefix="torchnlq-bench-") as tmp, \
            torch._dynamo.config.patch(recompile_limit=limit):
        variants: list[Variant] = []
        try:
            for index, (label, args, autocast) in enumerate(specs):
                variants.append(Variant(label, config_args, args, autocast, opts, Path(tmp), index))
            info = machine_info(variants[0].trainer.device)
            for variant in variants:
                for _ in range(opts.warmup):
                    variant.step()
            interleave([v.timed_step for v in variants], opts.steps)
            results = [v.result() for v in variants]
        finally:
            for variant in variants:
                variant.close()
    info["load_avg_1m_end"] = machine_info(torch.device("cpu"))["load_avg_1m"]
    for r in results:
        # Paired: within a round the variants ran back to back under the same load, so the
        # median of the per-round ratios is steadier than the ratio of the medians.
        r.step_time_ratio = median([a / b for a, b in zip(r.step_ms_all, results[0].step_ms_all)])
    return results, info


def format_results(results: list[VariantResult], info: dict[str, Any], config_args: list[str],
                   opts: BenchOptions) -> str:
    """Two comment lines (what was run, on what machine) and the Markdown table."""
    end_load = info.get("load_avg_1m_end")
    rows = [
        [r.label, r.precision, "on" if r.compile else "off", f"{r.tokens_per_step:,}", f"{r.tokens_per_s:,.0f}",
         f"{r.step_ms:.1f}", f"{r.tflops:.3f}", f"{100 * r.mfu:.1f}%" if r.mfu is not None else "–",
         f"{r.peak_memory_mib:,.1f}", f"{100 * r.data_share:.2g}%", f"{r.step_time_ratio:.3f}×"]
        for r in results
    ]
    headers = ["variant", "precision", "compile", "tokens/step", "tokens/s", "step (ms)", "TFLOP/s", "MFU",
               "peak mem (MiB)", "data (%)", "step vs first"]
    return "\n".join([
        (f"# bench {' '.join(config_args) or '(defaults)'}: median of {opts.steps} steps after {opts.warmup} "
         f"warm-up, {len(results)} variant(s) interleaved"),
        f"# {describe_machine(info)}" + (f" -> {end_load:.2f} at the end" if end_load is not None else ""),
        markdown_table(headers, rows, right=[False, False, False] + [True] * 8),
    ])


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.train_step`` (wrapped by :func:`torchnlq.cli.run_cli`)."""
    opts, config_args = split_bench_args(argv)
    if opts.help:
        print(__doc__)
        return 0
    if opts.json:  # checked now, not after minutes of timing
        target = Path(opts.json).expanduser()
        if target.is_dir():
            raise UserError(f"--json {opts.json!r} is a folder; give a file name such as {target / 'bench.json'}")
        if not target.parent.is_dir():
            raise UserError(f"--json {opts.json!r}: folder '{target.parent}' does not exist; create it or choose "
                            "another path")
    results, info = run_bench(config_args, opts)
    print(format_results(results, info, config_args, opts))
    if opts.json:
        payload = {"config_args": config_args, "options": asdict(opts), "machine": info,
                   "variants": [asdict(r) for r in results]}
        Path(opts.json).expanduser().write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
