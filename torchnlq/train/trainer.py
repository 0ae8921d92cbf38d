"""The training loop, readable top to bottom.

``Trainer(cfg)`` builds everything from the config sections (processes and
device, data, model and its parallelisation, optimizer, checkpoints, metrics)
and resumes from the latest checkpoint when there is one; ``Trainer.train()``
runs batch -> forward/backward (accumulate) -> clip -> step -> log -> validate
-> checkpoint, until the last step or a preemption signal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torchnlq.config.job_config import JobConfig
from torchnlq.config.render import to_toml
from torchnlq.data.batches import BatchSchedule, ValidationSet, open_token_files, read_batch
from torchnlq.data.tokenizer import padded_vocab_size
from torchnlq.errors import ConfigError, UserError
from torchnlq.models import GPT, build_model_args
from torchnlq.parallel.dist import build_mesh, init_distributed
from torchnlq.parallel.parallelize import clip_grad_norm, materialize_and_init, parallelize_model, set_gradient_sync
from torchnlq.checkpoint.checkpointer import Checkpointer
from torchnlq.train.metrics import MetricsLogger, peak_tflops, setup_logging
from torchnlq.train.optim import build_optimizer, lr_at, set_lr
from torchnlq.train.preemption import PreemptionFlag
from torchnlq.train.validate import cross_entropy, evaluate


class TrainingDiverged(UserError):
    """A non-finite loss or gradient norm with ``training.on_nonfinite = "stop"``."""


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _sum_across_ranks(value: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(value)  # gloo has no AVG: callers divide by the world size
    return value


class Trainer:
    """Owns the run: its folder, data, model, optimizer, checkpoints and metrics."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        tcfg = cfg.training
        self.dist = init_distributed(tcfg.device)
        self.device, self.rank, self.world_size = self.dist.device, self.dist.rank, self.dist.world_size
        self.is_main = self.rank == 0
        if self.device.type == "cuda" and tcfg.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        self.run_dir = Path(cfg.job.dump_folder) / cfg.job.name
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.toml").write_text(to_toml(cfg))
        self.logger = setup_logging(self.run_dir if self.is_main else None, quiet=not self.is_main)

        self._build_data()
        self._build_model()
        self.optimizer = build_optimizer(cfg.optimizer, self.model, self.device.type)
        self.checkpointer = Checkpointer(cfg.checkpoint, self.run_dir, self.rank, self.logger)
        self.step = 0  # optimizer updates done so far (including skipped ones)
        self.tokens_seen = 0
        self.skipped_steps = 0
        self._restore()

        self.metrics = MetricsLogger(
            self.logger,
            self.run_dir / "tb" if cfg.metrics.tensorboard and self.is_main else None,
            self.device,
            self.model_args.flops_per_token(tcfg.seq_len),
            peak_tflops(self.device, cfg.metrics.peak_tflops),
            tcfg.steps,
            start_step=self.step,
        )
        self.last_val_loss: float | None = None
        self._log_header()
        self.write_run_info(finished=self.step >= tcfg.steps)

    # ----- building ---------------------------------------------------------------------------

    def _build_data(self) -> None:
        cfg, tcfg = self.cfg, self.cfg.training
        if cfg.data.synthetic and cfg.data.tokenizer != "byte":
            raise ConfigError('data.synthetic = true writes a byte-level corpus; set data.tokenizer = "byte"')
        self.train_tokens, self.val_tokens, self.data_meta = open_token_files(cfg.data, tcfg.seq_len)
        self.global_batch = tcfg.micro_batch_size * tcfg.grad_accum_steps * self.world_size
        self.tokens_per_step = self.global_batch * tcfg.seq_len
        self.schedule = BatchSchedule(len(self.train_tokens), tcfg.seq_len, tcfg.steps, self.global_batch, cfg.data.seed)
        vcfg = cfg.validation
        val_set = ValidationSet(
            self.val_tokens, tcfg.seq_len, vcfg.sequences, vcfg.micro_batch_size or tcfg.micro_batch_size, vcfg.seed
        )
        self.val_batches = list(val_set)  # read once; evaluated at every interval
        self.val_fingerprint = val_set.fingerprint()

    def _build_model(self) -> None:
        cfg, tcfg = self.cfg, self.cfg.training
        self.model_args = build_model_args(cfg.model, padded_vocab_size(cfg.data.tokenizer, cfg.model.vocab_multiple))
        if cfg.checkpoint.export_at_end and not cfg.checkpoint.enabled:
            raise ConfigError("checkpoint.export_at_end exports the final checkpoint; set checkpoint.enabled = true")
        if tcfg.seq_len > self.model_args.max_seq_len:
            raise ConfigError(
                f"training.seq_len={tcfg.seq_len} exceeds the model's max_seq_len={self.model_args.max_seq_len}; "
                "lower training.seq_len or raise model.max_seq_len"
            )
        if self.data_meta["vocab_size"] > self.model_args.vocab_size:
            raise ConfigError(
                f"model.vocab_size={self.model_args.vocab_size} is smaller than the data's "
                f"{self.data_meta['vocab_size']} tokens; unset model.vocab_size"
            )
        self.mesh = build_mesh(self.dist, cfg.parallelism)
        seed_everything(tcfg.seed)
        # Built on meta, wrapped, then materialised: a sharded model never exists whole on one device,
        # and materialize_and_init gives the same weights as GPT(args) on one device with this seed.
        with torch.device("meta"):
            model = GPT(self.model_args)
        self.model = parallelize_model(
            model, training=tcfg, ac=cfg.activation_checkpoint, float8=cfg.float8,
            parallelism=cfg.parallelism, mesh=self.mesh, device=self.device,
        )
        materialize_and_init(self.model, self.device, tcfg.seed, self.mesh)
        # Under FSDP its MixedPrecisionPolicy casts; autocast is for the unsharded CUDA model.
        use_autocast = self.device.type == "cuda" and tcfg.mixed_precision == "bf16" and self.mesh is None
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_autocast else contextlib.nullcontext
        self.loss_fn = torch.compile(cross_entropy) if tcfg.compile and tcfg.compile_loss else cross_entropy

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a resume: the model's shape and the data order."""
        tcfg = self.cfg.training
        return {
            "model": dataclasses.asdict(self.model_args),
            "data": {
                "tokenizer": self.data_meta["tokenizer"],
                "train_tokens": len(self.train_tokens),
                "seed": self.cfg.data.seed,
                "seq_len": tcfg.seq_len,
                "global_batch": self.global_batch,
            },
        }

    def checkpoint_meta(self) -> dict[str, Any]:
        """Metadata saved with each checkpoint (see torchnlq/checkpoint/metadata.py)."""
        vcfg, tcfg = self.cfg.validation, self.cfg.training
        return {
            "tokens_seen": self.tokens_seen,
            "skipped_steps": self.skipped_steps,
            "world_size": self.world_size,
            "fingerprint": self.fingerprint(),
            "model_args": dataclasses.asdict(self.model_args),
            "tokenizer": {k: self.data_meta[k] for k in ("tokenizer", "vocab_size", "eot_id") if k in self.data_meta}
            | {"name": self.data_meta["tokenizer"]},
            "seq_len": tcfg.seq_len,
            "validation": {
                "seed": vcfg.seed, "sequences": vcfg.sequences,
                "micro_batch_size": vcfg.micro_batch_size or tcfg.micro_batch_size,
            },
            "data_path": str(self.cfg.data.path),
            "data_fingerprint": self.schedule.fingerprint(),
        }

    def _restore(self) -> None:
        """Resume from this run's checkpoint, or start from another run's weights, or start fresh."""
        path = self.checkpointer.resume_path() if self.cfg.checkpoint.enabled else None
        if path is not None:
            meta = self.checkpointer.load(path, self.model, self.optimizer, self.fingerprint())
            self.step, self.tokens_seen = meta["step"], meta["tokens_seen"]
            self.skipped_steps = meta.get("skipped_steps", 0)
            self.logger.info(f"resumed from {path} (step {self.step}, {self.tokens_seen:,} tokens seen)")
        elif self.cfg.checkpoint.initial_load_path:
            src = self.cfg.checkpoint.initial_load_path
            if self.cfg.checkpoint.initial_load_model_only:
                self.checkpointer.load_model_only(src, self.model, {"model": self.fingerprint()["model"]})
            else:
                meta = self.checkpointer.load(Path(src), self.model, self.optimizer, self.fingerprint())
                self.step, self.tokens_seen = meta["step"], meta["tokens_seen"]
            self.logger.info(f"initialised from {src} (step {self.step})")

    def _log_header(self) -> None:
        a = self.model_args
        self.logger.info(
            f"run {self.run_dir} | {self.world_size} process(es) on {self.device.type} | model {self.cfg.model.flavor} "
            f"(query {a.query.type}, {a.n_layers}L d{a.dim} {a.n_heads}h/{a.n_kv_heads}kv, positions {a.positions}) "
            f"| params {a.num_params():,} (non-embedding {a.num_params(non_embedding=True):,}) "
            f"| {self.tokens_per_step:,} tokens/step | data {len(self.train_tokens):,} train tokens, "
            f"batch fingerprint {self.schedule.fingerprint()}"
        )

    def write_run_info(self, finished: bool) -> None:
        """``<run>/run_info.json``: what tools (suites, comparisons) need without reading TensorBoard."""
        if not self.is_main:
            return
        a = self.model_args
        info = {
            "name": self.cfg.job.name,
            "step": self.step,
            "steps": self.cfg.training.steps,
            "finished": finished,
            "last_val_loss": self.last_val_loss,
            "query_type": a.query.type,
            "total_params": a.num_params(),
            "non_embedding_params": a.num_params(non_embedding=True),
            "flops_per_token": a.flops_per_token(self.cfg.training.seq_len),
            "batch_fingerprint": self.schedule.fingerprint(),
            "validation_fingerprint": self.val_fingerprint,
            "world_size": self.world_size,
        }
        tmp = self.run_dir / "run_info.json.tmp"
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(self.run_dir / "run_info.json")

    # ----- the loop ---------------------------------------------------------------------------

    def train_step(self) -> tuple[float, float]:
        """One optimizer update over ``grad_accum_steps`` micro-batches; returns (loss, grad_norm).

        Each rank's micro-batch loss is its token mean divided by the accumulation
        steps, and FSDP averages gradients over ranks: with equal token counts
        everywhere, the gradient is the mean over the global batch at any world size.
        """
        tcfg = self.cfg.training
        set_lr(self.optimizer, lr_at(self.step, self.cfg.optimizer.lr, self.cfg.lr_schedule, tcfg.steps))
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(tcfg.grad_accum_steps):
            set_gradient_sync(self.model, micro == tcfg.grad_accum_steps - 1)  # reduce once per step
            offsets = self.schedule.offsets_for(
                self.step, micro, self.rank, self.world_size, tcfg.micro_batch_size, tcfg.grad_accum_steps
            )
            x, y = read_batch(self.train_tokens, offsets, tcfg.seq_len)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.autocast():
                loss = self.loss_fn(self.model(x), y) / tcfg.grad_accum_steps
            loss.backward()
            loss_sum += loss.detach()
        grad_norm = clip_grad_norm(self.model.parameters(), tcfg.max_norm)  # 0: measure only
        loss_value = _sum_across_ranks(loss_sum).item() / self.world_size
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
            if tcfg.on_nonfinite == "stop":
                raise TrainingDiverged(
                    f"non-finite loss {loss_value} / grad norm {grad_norm} at step {self.step + 1}; stopped without "
                    "saving it (the last checkpoint is intact): lower optimizer.lr, or set training.on_nonfinite=skip"
                )
            self.skipped_steps += 1
            self.logger.warning(f"step {self.step + 1}: non-finite loss/grad norm, update skipped")
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        return loss_value, grad_norm

    def validate(self) -> float:
        """Evaluate on the fixed validation set, log it, and return the mean loss."""
        start = time.perf_counter()
        mean, std = evaluate(self.model, self.val_batches, self.device, self.autocast, self.rank, self.world_size)
        self.metrics.log_validation(self.step, mean, std, time.perf_counter() - start)
        self.last_val_loss = mean
        return mean

    def log_query_diagnostics(self) -> None:
        """Per-layer query statistics on the first validation batch (all ranks run it: FSDP needs them)."""
        from torchnlq.train.diagnostics import query_diagnostics

        x = self.val_batches[0][0].to(self.device)
        with self.autocast():
            figures = query_diagnostics(self.model, x)
        for tag, value in figures.items():
            self.metrics.scalar(tag, value, self.step)

    def save_checkpoint(self) -> None:
        """Save ``step-N`` (if checkpoints are enabled)."""
        if self.cfg.checkpoint.enabled:
            self.checkpointer.save(self.step, self.model, self.optimizer, self.checkpoint_meta())
            self.metrics.scalar("checkpoint/blocked_s", self.checkpointer.last_save_blocked_s, self.step)

    def export_final(self) -> None:
        """Write ``<run>/export`` (safetensors, checkpoint.export_dtype) from the final checkpoint."""
        from torchnlq.checkpoint.export import export_safetensors

        out = export_safetensors(
            self.checkpointer.folder / f"step-{self.step}", self.run_dir / "export",
            dtype=self.cfg.checkpoint.export_dtype, overwrite=True,
        )
        self.logger.info(f"exported {out} ({self.cfg.checkpoint.export_dtype})")

    def train(self) -> None:
        """Run until ``training.steps`` or a preemption signal; validate and checkpoint on schedule."""
        cfg = self.cfg
        if self.step >= cfg.training.steps:
            self.logger.info(
                f"nothing to do: the run is complete at step {self.step} ({self.run_dir}); raise training.steps to "
                "train on, or use a new job.name (or --checkpoint.resume=false) to start again"
            )
            return
        self.model.train()
        preemption = PreemptionFlag()
        start, start_tokens = time.perf_counter(), self.tokens_seen
        try:
            while self.step < cfg.training.steps:
                loss, grad_norm = self.train_step()
                self.metrics.count_tokens(self.tokens_per_step)
                last = self.step == cfg.training.steps
                if self.step % cfg.metrics.log_interval == 0 or last:
                    lr = self.optimizer.param_groups[0]["lr"]
                    self.metrics.log_step(self.step, loss, lr, grad_norm, self.tokens_seen)
                    self.metrics.scalar("skipped_steps", self.skipped_steps, self.step)
                if cfg.validation.enabled and (self.step % cfg.validation.interval == 0 or last):
                    self.validate()
                every = cfg.metrics.query_diagnostics_interval
                if every and (self.step % every == 0 or last):
                    self.log_query_diagnostics()
                if last or self.step % cfg.checkpoint.interval == 0:
                    self.save_checkpoint()
                elif preemption.requested(self.device):
                    self.save_checkpoint()
                    self.logger.info(
                        f"stopped by {preemption.signal_name or 'a signal on another rank'} at step {self.step}; "
                        "run the same command to resume"
                    )
                    break
        finally:
            preemption.restore()
            self.checkpointer.close()
            self.metrics.close()
        finished = self.step >= cfg.training.steps
        self.write_run_info(finished=finished)
        if finished and cfg.checkpoint.export_at_end and self.is_main:
            self.export_final()
        wall = time.perf_counter() - start
        tokens = self.tokens_seen - start_tokens
        self.logger.info(f"done: step {self.step}, {tokens:,} tokens in {wall:.1f}s ({tokens / max(wall, 1e-9):,.0f} tok/s incl. validation)")
