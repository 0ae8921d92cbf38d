"""The training loop, readable top to bottom.

``Trainer(cfg)`` builds everything from the config sections (device, data,
model, optimizer, metrics); ``Trainer.train()`` runs the loop:
batch -> forward/backward (accumulate) -> clip -> step -> log -> validate.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from torchnlq.config.job_config import JobConfig, Training
from torchnlq.config.render import to_toml
from torchnlq.data.batches import BatchSchedule, ValidationSet, open_token_files, read_batch
from torchnlq.data.synthetic import ensure_synthetic_corpus
from torchnlq.data.tokenizer import BASE_VOCAB_SIZE
from torchnlq.errors import ConfigError, UserError
from torchnlq.models import GPT, build_model_args, resolve_vocab_size
from torchnlq.train.metrics import MetricsLogger, peak_tflops, setup_logging
from torchnlq.train.optim import build_optimizer, lr_at, set_lr
from torchnlq.train.validate import cross_entropy, evaluate


def pick_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; ``cuda`` without a GPU is a user error."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise UserError("training.device = 'cuda' but no CUDA device is visible; use --training.device=cpu or auto")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def autocast_for(cfg: Training, device: torch.device):
    """The autocast context factory: bf16 on CUDA when asked; CPU trains in fp32."""
    if device.type == "cuda" and cfg.mixed_precision == "bf16":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Owns the run: its folder, data, model, optimizer and metrics."""

    def __init__(self, cfg: JobConfig, world_size: int = 1, rank: int = 0) -> None:
        self.cfg = cfg
        self.world_size, self.rank = world_size, rank
        tcfg = cfg.training
        self.device = pick_device(tcfg.device)
        if self.device.type == "cuda" and tcfg.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.autocast = autocast_for(tcfg, self.device)

        self.run_dir = Path(cfg.job.dump_folder) / cfg.job.name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.toml").write_text(to_toml(cfg))
        self.logger = setup_logging(self.run_dir)

        # Data first: its errors (missing folder, too short) are the likeliest ones.
        if cfg.data.synthetic:
            if cfg.data.tokenizer != "byte":
                raise ConfigError("data.synthetic = true writes a byte-level corpus; set data.tokenizer = \"byte\"")
            ensure_synthetic_corpus(cfg.data.path, seed=cfg.data.seed)
        self.train_tokens, self.val_tokens, self.data_meta = open_token_files(cfg.data, tcfg.seq_len)

        vocab_size = resolve_vocab_size(cfg.model, cfg.data.tokenizer)
        self.model_args = build_model_args(cfg.model, vocab_size)
        if tcfg.seq_len > self.model_args.max_seq_len:
            raise ConfigError(
                f"training.seq_len={tcfg.seq_len} exceeds the model's max_seq_len={self.model_args.max_seq_len}; "
                f"lower training.seq_len or raise model.max_seq_len"
            )
        if BASE_VOCAB_SIZE[cfg.data.tokenizer] > self.model_args.vocab_size:
            raise ConfigError(
                f"model.vocab_size={self.model_args.vocab_size} is smaller than the {cfg.data.tokenizer} "
                f"tokenizer's {BASE_VOCAB_SIZE[cfg.data.tokenizer]} tokens; unset model.vocab_size"
            )

        seed_everything(tcfg.seed)
        with torch.device(self.device):
            self.model = GPT(self.model_args)
        self.step_fn_model = torch.compile(self.model) if tcfg.compile else self.model
        self.optimizer = build_optimizer(cfg.optimizer, self.model, self.device.type)

        self.global_batch = tcfg.micro_batch_size * tcfg.grad_accum_steps * world_size
        self.tokens_per_step = self.global_batch * tcfg.seq_len
        self.schedule = BatchSchedule(
            len(self.train_tokens), tcfg.seq_len, tcfg.steps, self.global_batch, seed=cfg.data.seed
        )
        vcfg = cfg.validation
        self.val_set = ValidationSet(
            self.val_tokens, tcfg.seq_len, vcfg.sequences,
            vcfg.micro_batch_size or tcfg.micro_batch_size, seed=vcfg.seed,
        )
        self.flops_per_token = self.model_args.flops_per_token(tcfg.seq_len)
        self.metrics = MetricsLogger(
            self.logger,
            self.run_dir / "tb" if cfg.metrics.tensorboard else None,
            self.device,
            self.flops_per_token,
            peak_tflops(self.device, cfg.metrics.peak_tflops),
            tcfg.steps,
        )
        self.step = 0  # optimizer updates done so far
        self.tokens_seen = 0
        self.last_val_loss: float | None = None
        self._log_header()

    def _log_header(self) -> None:
        a = self.model_args
        self.logger.info(
            f"run {self.run_dir} | device {self.device} | model {self.cfg.model.flavor} "
            f"(query {a.query.type}, {a.n_layers}L d{a.dim} {a.n_heads}h/{a.n_kv_heads}kv, positions {a.positions}) "
            f"| params {a.num_params():,} (non-embedding {a.num_params(non_embedding=True):,}) "
            f"| {self.tokens_per_step:,} tokens/step | data {len(self.train_tokens):,} train tokens, "
            f"batch fingerprint {self.schedule.fingerprint()}"
        )

    def train_step(self) -> tuple[float, float]:
        """One optimizer update over ``grad_accum_steps`` micro-batches; returns (loss, grad_norm)."""
        tcfg = self.cfg.training
        lr = lr_at(self.step, self.cfg.optimizer.lr, self.cfg.lr_schedule, tcfg.steps)
        set_lr(self.optimizer, lr)
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(tcfg.grad_accum_steps):
            offsets = self.schedule.offsets_for(
                self.step, micro, self.rank, self.world_size, tcfg.micro_batch_size, tcfg.grad_accum_steps
            )
            x, y = read_batch(self.train_tokens, offsets, tcfg.seq_len)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.autocast():
                # Every micro-batch has the same token count, so dividing the mean
                # by the accumulation steps gives the mean over the whole step.
                loss = cross_entropy(self.step_fn_model(x), y) / tcfg.grad_accum_steps
            loss.backward()
            loss_sum += loss.detach()
        max_norm = tcfg.max_norm if tcfg.max_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        return loss_sum.item(), grad_norm.item()

    def validate(self) -> float:
        """Evaluate on the fixed validation set, log it, and return the mean loss."""
        start = time.perf_counter()
        mean, std = evaluate(self.step_fn_model, self.val_set, self.device, self.autocast)
        self.metrics.log_validation(self.step, mean, std, time.perf_counter() - start)
        self.last_val_loss = mean
        return mean

    def train(self) -> None:
        """Run until ``training.steps``, validating every interval and at the end."""
        cfg = self.cfg
        self.model.train()
        start = time.perf_counter()
        try:
            while self.step < cfg.training.steps:
                loss, grad_norm = self.train_step()
                self.metrics.count_tokens(self.tokens_per_step)
                if not math.isfinite(loss):
                    raise UserError(f"loss is {loss} at step {self.step}; lower optimizer.lr or check the data")
                last = self.step == cfg.training.steps
                if self.step % cfg.metrics.log_interval == 0 or last:
                    lr = self.optimizer.param_groups[0]["lr"]
                    self.metrics.log_step(self.step, loss, lr, grad_norm, self.tokens_seen)
                if cfg.validation.enabled and (self.step % cfg.validation.interval == 0 or last):
                    self.validate()
        finally:
            self.metrics.close()
        wall = time.perf_counter() - start
        self.logger.info(
            f"done: {self.step} steps, {self.tokens_seen:,} tokens in {wall:.1f}s "
            f"({self.tokens_seen / max(wall, 1e-9):,.0f} tok/s incl. validation)"
        )
