"""Console lines, the train.log file and TensorBoard scalars; throughput, MFU, memory."""

from __future__ import annotations

import logging
import math
import resource
import sys
import time
from pathlib import Path

import torch

# Dense bf16 peak TFLOP/s (no sparsity) by a substring of torch.cuda.get_device_name().
# Order matters: the first match wins, so more specific names come first.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("RTX 5090", 209.5),
    ("RTX 4090", 165.2),
    ("A100", 312.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("B200", 2250.0),
]


def peak_tflops(device: torch.device, configured: float | None) -> float | None:
    """The peak for MFU: the configured value, else the table; None when unknown (no guess)."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_TFLOPS:
        if key in name:
            return value
    return None


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory so far: the CUDA allocator's on GPU, the process's max RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30


def setup_logging(run_dir: Path | None, quiet: bool = False) -> logging.Logger:
    """Log to the console and, when given a run folder, to ``run_dir/train.log``.

    ``quiet`` (ranks other than 0) shows warnings only, so a multi-process run prints one log.
    """
    logger = logging.getLogger("torchnlq")
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    logger.addHandler(console)
    if run_dir is not None:
        file = logging.FileHandler(run_dir / "train.log")
        file.setFormatter(fmt)
        logger.addHandler(file)
    return logger


def _fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class MetricsLogger:
    """Aggregates per-step figures and writes them every ``log_interval`` steps.

    Throughput is measured over the steps since the last log line, so a slow
    first (compiling) step only affects the first line.
    """

    def __init__(
        self,
        logger: logging.Logger,
        tb_dir: Path | None,
        device: torch.device,
        flops_per_token: int,
        peak: float | None,
        total_steps: int,
        start_step: int = 0,
        log_interval: int = 1,
    ) -> None:
        self.logger = logger
        self.log_interval = log_interval
        self.device = device
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.total_steps = total_steps
        self.writer = None
        if tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events a crashed earlier attempt logged after the step we resume from.
            self.writer = SummaryWriter(log_dir=str(tb_dir), purge_step=start_step + 1 if start_step else 0)
        self.start_step = start_step
        self._last_time = time.perf_counter()
        self._tokens_since = 0
        self._start = self._last_time

    def due(self, step: int, last: bool) -> bool:
        """Whether to write the step line after ``step``: every ``log_interval`` steps and at the last one."""
        return last or step % self.log_interval == 0

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Write one TensorBoard scalar (no-op without TensorBoard)."""
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    def count_tokens(self, tokens: int) -> None:
        """Add the tokens processed by one optimizer step."""
        self._tokens_since += tokens

    def log_step(self, step: int, loss: float, lr: float, grad_norm: float, tokens_seen: int) -> dict[str, float]:
        """Write the console line and the TensorBoard scalars for ``step``; return the figures."""
        now = time.perf_counter()
        elapsed = max(now - self._last_time, 1e-9)
        tps = self._tokens_since / elapsed
        self._last_time, self._tokens_since = now, 0
        mem = peak_memory_gib(self.device)
        figures = {"loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tps, "memory_gib": mem}
        mfu_text = ""
        if self.peak is not None:
            figures["mfu"] = self.flops_per_token * tps / (self.peak * 1e12)
            mfu_text = f"  mfu {100 * figures['mfu']:.1f}%"
        rate = (step - self.start_step) / max(now - self._start, 1e-9)
        eta = _fmt_duration((self.total_steps - step) / max(rate, 1e-9))
        self.logger.info(
            f"step {step:>6}/{self.total_steps}  loss {loss:.4f}  lr {lr:.3e}  grad_norm {grad_norm:.3f}"
            f"  tok/s {tps:,.0f}{mfu_text}  mem {mem:.2f}GiB  eta {eta}"
        )
        for tag, key in [("loss/train", "loss"), ("lr", "lr"), ("grad_norm", "grad_norm"),
                         ("throughput/tokens_per_s", "tokens_per_s"), ("throughput/mfu", "mfu"),
                         ("memory/peak_gib", "memory_gib")]:
            if key in figures:
                self.scalar(tag, figures[key], step)
        self.scalar("tokens_seen", tokens_seen, step)
        return figures

    def log_validation(self, step: int, mean: float, std: float, seconds: float) -> None:
        """Write the validation line and scalars."""
        spread = f" ± {std:.4f}" if math.isfinite(std) else ""  # one micro-batch has no spread to show
        self.logger.info(f"step {step:>6}/{self.total_steps}  val_loss {mean:.4f}{spread}  ({seconds:.1f}s)")
        self.scalar("loss/val", mean, step)
        if math.isfinite(std):
            self.scalar("loss/val_std", std, step)

    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
