"""The training loop, readable top to bottom.

``Trainer(cfg)`` builds everything and resumes when it can (writing nothing before the run is known to start);
``Trainer.train()`` runs step -> log -> validate -> diagnostics -> checkpoint, each on its ``due(step, last)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from torchnlq.checkpoint.checkpointer import Checkpointer
from torchnlq.checkpoint.record import DataRecord, RunRecord, ValidationRecord
from torchnlq.cli import tell_launcher
from torchnlq.config.job_config import JobConfig, loss_chunk_tokens
from torchnlq.config.manager import load_job_config
from torchnlq.config.render import to_toml
from torchnlq.data.loader import MicroBatchSource, RunData, build_data
from torchnlq.data.token_file import DataFileChanged
from torchnlq.data.tokenizer import build_tokenizer
from torchnlq.errors import UserError
from torchnlq.files import make_folder, move_into_new_folder, os_error_line, replace_file
from torchnlq.models import build_model
from torchnlq.models.counts import active_params, flops_per_token, num_params
from torchnlq.models.family import describe_family, get_family
from torchnlq.models.lm_loss import loss_path
from torchnlq.parallel.device_figures import format_memory, memory_label, peak_tflops, resident_bytes
from torchnlq.parallel.device_memory import check_fits_device, device_memory_bytes
from torchnlq.parallel.dist import build_mesh, init_distributed
from torchnlq.parallel.parallelize import clip_grad_norm, materialize_and_init, parallelize_model, set_gradient_sync
from torchnlq.pause_points import pause_point
from torchnlq.train.cpu_allocator import keep_freed_memory
from torchnlq.train.diagnostics import QueryDiagnostics
from torchnlq.train.downstream import Downstream
from torchnlq.train.lr_schedule import describe_schedule, lr_at
from torchnlq.train.memory_estimate import estimate_memory, fit_warning
from torchnlq.train.metrics import (
    HParam,
    MetricsLogger,
    RunEnd,
    ValidationPlan,
    run_hparams,
    setup_logging,
)
from torchnlq.train.optim import build_optimizer, group_label, group_names, is_paper_split, plan_groups, set_lr
from torchnlq.train.preemption import PreemptionFlag
from torchnlq.train.preflight import (
    check_data_fits_model,
    check_job_config,
    config_warnings,
    resolved_config,
    resume_changes,
)
from torchnlq.train.profiling import Profiler
from torchnlq.train.run_lock import RunLock, check_run_folder
from torchnlq.train.run_start import (
    EARLIER_RUN_ENTRIES,
    RunStart,
    checkpoint_files,
    initial_query_weights,
    must_set_aside,
    start_run,
)
from torchnlq.train.validate import Validator
from torchnlq.train.weight_dynamics import WeightDynamics, with_means

if TYPE_CHECKING:
    from torchnlq.train.wandb_logger import WandbLogger


class TrainingDiverged(UserError):
    """A non-finite loss or gradient norm with ``training.on_nonfinite = "stop"``."""


def make_deterministic(device: torch.device) -> None:
    """``debug.deterministic``: deterministic kernels for the rest of the process (the seeds are always fixed)."""
    if device.type == "cuda":  # cuBLAS reads it when its first handle is made: before any matmul
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    import torch._inductor.config as inductor_config  # compiled kernels: no timing-based autotuning choices

    inductor_config.deterministic = True


class Trainer:
    """Owns the run: its folder, data, model, optimizer, checkpoints and metrics."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        tcfg = cfg.training
        self.model_args = check_job_config(cfg)  # before anything is created
        self.run_dir = Path(cfg.job.dump_folder) / cfg.job.name
        check_run_folder(self.run_dir)
        self.dist = init_distributed(tcfg.device)
        self.device, self.rank, self.world_size = self.dist.device, self.dist.rank, self.dist.world_size
        check_fits_device(self.model_args, self.device, self.world_size)  # before anything is allocated
        if self.device.type == "cpu":
            keep_freed_memory()  # before the model and the first step allocate (docs/performance.md)
        self.is_main = self.rank == 0
        if cfg.debug.deterministic:
            make_deterministic(self.device)
        if self.device.type == "cuda" and tcfg.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        self.data: RunData = build_data(cfg.data, tcfg, cfg.validation, self.rank, self.world_size)
        check_data_fits_model(self.data.meta, self.model_args)
        #: What train_step reads; a benchmark may wrap it (same ``micro_batches`` method).
        self.loader: MicroBatchSource = self.data.loader
        self.tokens_per_step = self.data.loader.tokens_per_step
        self._build_model()
        #: The optimizer's parameter groups as planned (the header, the record and lr/<name> read them).
        self.group_plans = plan_groups(cfg.optimizer, self.model)
        self.optimizer = build_optimizer(cfg.optimizer, self.model, self.device.type, self.group_plans)
        #: The name of each of the optimizer's parameter groups, in its order (logged as lr/<name>).
        self.group_names = group_names(self.group_plans)
        self.record = self._new_record()
        # The tasks are read now: a missing or malformed file is one line before the run folder exists.
        tokenizer = (build_tokenizer(cfg.data.tokenizer, cfg.data.tiktoken_file, tokenizer_file=cfg.data.tokenizer_file,
                                     eot_token=cfg.data.eot_token) if cfg.downstream.tasks else None)
        self.downstream = Downstream(cfg.downstream, cfg.validation.interval, tokenizer, self.autocast)
        self._consecutive_skips = 0
        self._first_nonfinite = torch.zeros((), dtype=torch.long, device=self.device)  # 0: none (stop mode)

        self.checkpointer = Checkpointer(cfg.checkpoint, self.run_dir, self.rank, logging.getLogger("torchnlq"),
                                         extra_files=self._checkpoint_files)
        self.start: RunStart = start_run(cfg.checkpoint, self.checkpointer, self.model, self.optimizer, self.record)
        changes = self._resume_changes() if self.start.line else []
        # Rank 0 alone looks for an earlier run: the others could see the run_info.json it is about to write.
        set_aside = must_set_aside(self.run_dir, self.start, cfg.job.rerun, cfg.checkpoint) if self.is_main else None
        # The run can start: only now does it get a folder, its lock (before any file: one trainer per
        # folder, rank 0 holds it for the whole run), its resolved config and its log.
        self.run_lock: RunLock | None = None
        self.earlier_run: Path | None = None  # where job.rerun moved an earlier run's files
        try:
            self._open_run(set_aside, changes)
        except BaseException:
            self.close()  # the run folder is free again for the corrected command (a trainer built in a process)
            if getattr(self, "metrics", None) is not None:
                self.metrics.close("failure")
            raise

    def _open_run(self, set_aside: str | None, changes: list[str]) -> None:
        """Create and lock the run folder, write its config and log, build the pieces that log; ``set_aside``: why
        an earlier run's files move into ``previous-N/`` first (None: they stay)."""
        cfg, tcfg = self.cfg, self.cfg.training
        abandoned: list[Path] = []  # step-N.partial folders a killed process left
        # A finished run met again (its command run once more: a job script, a suite's --dry-run line): its record,
        # checkpoints, log and events are read-only to this start, which only says so (train(): nothing to do).
        self.read_only = self.start.kind == "resume" and self.step >= tcfg.steps
        if self.is_main and self.read_only:
            RunLock(self.run_dir).check_free()  # a trainer still in it: say that (nothing is written either way)
        elif self.is_main:
            make_folder(self.run_dir)
            self.run_lock = RunLock(self.run_dir).acquire()
            self._check_resume_point_unchanged()
            abandoned = self.checkpointer.remove_abandoned_saves()  # the lock is held: no save is in flight
            if set_aside:  # the earlier run's files go into run_dir/previous-N/ (the lowest free N)
                self.earlier_run = move_into_new_folder(self.run_dir, EARLIER_RUN_ENTRIES, "previous")
            replace_file(self.run_dir / "config.toml", to_toml(resolved_config(cfg, self.model_args)))
        self.logger = setup_logging(self.run_dir if self.is_main and not self.read_only else None,
                                    quiet=not self.is_main)

        self.validator = Validator(
            cfg.validation, self.data.validation, self.device, self.autocast, self.rank, self.world_size
        )
        if self.is_main:
            self.validator.report = self.logger.info
        self.diagnostics = QueryDiagnostics(cfg.metrics.query_diagnostics_interval,
                                            self.data.validation.batches_at(0)[0][0])
        self.weight_dynamics = WeightDynamics(cfg.metrics.weight_dynamics_interval, None)
        self.profiler = Profiler(cfg.profiling, self.run_dir / "profiler", self.rank, self.device, self.logger.info)
        self._weights_reference_missing = False  # a start from a DCP checkpoint: no drift (initial_query_weights)
        hparams = run_hparams(
            cfg, self.model_args, world_size=self.world_size, global_batch=self.data.schedule.global_batch,
            tokens_per_step=self.tokens_per_step, precision=self.record.mixed_precision,
        )
        self.metrics = MetricsLogger(
            self.logger,
            self.run_dir / "tb" if cfg.metrics.tensorboard and self.is_main and not self.read_only else None,
            self.device,
            flops_per_token(self.model_args, tcfg.seq_len),
            peak_tflops(self.device, cfg.metrics.peak_tflops),
            tcfg.steps,
            start_step=self.step,
            log_interval=cfg.metrics.log_interval,
            sink=self._start_wandb(hparams),
        )
        if self.is_main and not self.read_only:
            self.metrics.log_config(to_toml(resolved_config(cfg, self.model_args)), hparams, changes)
        if cfg.validation.enabled:
            forwards = -(-len(self.data.validation) // self.world_size)  # this rank's share of the micro-batches
            self.metrics.validation_plan = ValidationPlan(cfg.validation.interval, tcfg.steps, forwards,
                                                          tcfg.grad_accum_steps)
        self._log_header()
        lock_warnings = [self.run_lock.warning] if self.run_lock and self.run_lock.warning else []
        for warning in config_warnings(cfg, self.model_args) + changes + lock_warnings:
            self.logger.warning(f"warning: {warning}")
        if self.start.line:
            self.logger.info(self.start.line)
        for path in abandoned:
            self.logger.info(f"removed {path}: a save that a stopped or killed process did not finish")
        if self.earlier_run is not None:
            self.logger.info(f"started again from step 0 ({set_aside}); the earlier run is in {self.earlier_run}")
        if not self.read_only:
            self.write_run_info(finished=self.step >= tcfg.steps)

    # ----- building ---------------------------------------------------------------------------

    def _build_model(self) -> None:
        cfg, tcfg = self.cfg, self.cfg.training
        self.mesh = build_mesh(self.dist, cfg.parallelism)
        random.seed(tcfg.seed)
        np.random.seed(tcfg.seed % 2**32)
        torch.manual_seed(tcfg.seed)
        # Built on meta, wrapped, then materialised: a sharded model never exists whole on one device,
        # and materialize_and_init gives the same weights as build_model(args) on one device with this seed.
        with torch.device("meta"):
            model = build_model(self.model_args)
        self.model = parallelize_model(
            model, training=tcfg, ac=cfg.activation_checkpoint, float8=cfg.float8,
            parallelism=cfg.parallelism, mesh=self.mesh, device=self.device,
        )
        materialize_and_init(self.model, self.device, tcfg.seed, self.mesh)
        #: The family's hooks around each step (models/runtime.py: an MoE's routers).
        self.family_runtime = get_family(self.model_args.family).runtime
        # Losses the model adds itself join the gradient as the loss does: divided by the accumulation steps.
        self.family_runtime.set_loss_scale(self.model, 1.0 / tcfg.grad_accum_steps)
        # Under FSDP its MixedPrecisionPolicy casts; autocast is for the unsharded CUDA model.
        use_autocast = self.device.type == "cuda" and tcfg.mixed_precision == "bf16" and self.mesh is None
        self.autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_autocast
                         else contextlib.nullcontext)
        #: Tokens of logits the head's loss forms at a time (0: all of them); the model computes the loss.
        self.loss_chunk_tokens = loss_chunk_tokens(tcfg, self.device.type)

    def _start_wandb(self, hparams: dict[str, HParam]) -> WandbLogger | None:
        """The Weights & Biases sink of the metrics (rank 0, ``metrics.wandb = true``), else None."""
        if not (self.cfg.metrics.wandb and self.is_main) or self.step >= self.cfg.training.steps:
            return None  # a finished run trains nothing: no W&B run to resume for it
        from torchnlq.train.wandb_logger import WandbLogger, wandb_config  # imports wandb: only when asked

        try:
            return WandbLogger.start(self.cfg.metrics, self.run_dir, self.cfg.job.name,
                                     wandb_config(self.cfg, hparams), self.logger, start_step=self.step)
        except BaseException:
            self.close()  # the run folder is free again for the corrected command
            raise

    def _new_record(self) -> RunRecord:
        """This run's metadata at step 0 (see torchnlq/checkpoint/record.py)."""
        cfg, tcfg, data = self.cfg, self.cfg.training, self.data
        meta = data.meta
        tokenizer = ({k: meta[k] for k in ("tokenizer", "vocab_size", "eot_id") if k in meta}
                     | {"name": meta["tokenizer"]})
        info = meta.get("tokenizer_info") or {}
        # Which .tiktoken ranks or tokenizer.json the data was made with (checkpoints carry that file), and an hf
        # tokenizer's end-of-text text (its id alone does not say which token it is).
        tokenizer |= {key: info[key] for key in ("tiktoken_sha256", "tokenizer_sha256", "eot_token")
                      if isinstance(info.get(key), str)}
        # What the model computes in: bf16 on CUDA (autocast, or FSDP's bf16 parameters), fp32 on a CPU.
        precision = "bf16" if self.device.type == "cuda" and tcfg.mixed_precision == "bf16" else "fp32"
        return RunRecord(
            model_args=self.model_args,
            tokenizer=tokenizer,
            seq_len=tcfg.seq_len,
            data=DataRecord(
                path=str(cfg.data.path) if not cfg.data.sources else "+".join(d["path"] for d in data.sources),
                train_tokens=data.train_tokens, seed=cfg.data.seed,
                global_batch=data.schedule.global_batch, batch_fingerprint=data.schedule.fingerprint(),
                content_fingerprint=data.content_fingerprint, content_sha256=data.content_sha256,
                sources=data.sources,
            ),
            validation=ValidationRecord(
                seed=cfg.validation.seed, sequences=cfg.validation.sequences,
                micro_batch_size=data.validation_micro_batch_size, fingerprint=data.validation_fingerprint,
                protocol=cfg.validation.protocol, interval=cfg.validation.interval,
            ),
            name=cfg.job.name,
            steps=tcfg.steps,
            world_size=self.world_size,
            mixed_precision=precision,
            # What steps each group (the AdamW-kind groups by optimizer.name's optimizer: another state).
            optimizer_groups={plan.name: f"{group_label(cfg.optimizer, plan)}, {len(plan.params)} tensors"
                              for plan in self.group_plans},
        )

    @property
    def step(self) -> int:
        """Optimizer updates done so far (including skipped ones)."""
        return self.record.step

    @property
    def skipped_steps(self) -> int:
        """Updates skipped for a non-finite loss or gradient (``training.on_nonfinite = "skip"``)."""
        return self.record.skipped_steps

    @property
    def last_val_loss(self) -> float | None:
        """The latest validation loss of this process's run (None before the first validation)."""
        return self.record.last_val_loss

    def _checkpoint_files(self) -> dict[str, bytes]:
        """What every checkpoint carries besides its state: the tokenizer ranks (from where the weights came, too)."""
        return checkpoint_files(self.record.tokenizer, self.start.weights_from, self.cfg.data.tiktoken_file,
                               self.checkpointer.logger, self.cfg.data.tokenizer_file)

    def _check_resume_point_unchanged(self) -> None:
        """With the run lock held: refuse a resume point that another trainer moved on while this one was building."""
        now = self.checkpointer.resume_path() if self.cfg.checkpoint.enabled else None
        if now != self.start.resume_point:
            read = self.start.resume_point.name if self.start.resume_point else "no checkpoint"
            raise UserError(
                f"run folder {self.run_dir} changed while this trainer was starting (it read {read}, now the "
                f"latest is {now.name if now else 'none'}): another trainer used it; run the command again"
            )

    def close(self) -> None:
        """Release the run folder's lock (``train()`` does at its end; for a Trainer built but not trained)."""
        if getattr(self, "run_lock", None) is not None:
            self.run_lock.release()

    def _resume_changes(self) -> list[str]:
        """Options that differ from the run's saved config.toml (read before it is rewritten)."""
        saved = self.run_dir / "config.toml"
        if not saved.is_file():
            return []
        try:
            return resume_changes(load_job_config([str(saved)]), resolved_config(self.cfg, self.model_args))
        except UserError as e:  # a hand-edited or older config.toml: say so, the resume itself is checked
            return [f"could not compare with the saved {saved} ({e})"]

    def _model_source(self) -> str:
        """Where the model's shape comes from: its flavor, or the folder of ``model.from_checkpoint`` (whose model
        is not the flavor's: the flavor only fills what neither the folder nor the config gives)."""
        if self.cfg.model.from_checkpoint:
            return f"from {self.cfg.checkpoint.initial_load_path}"
        return self.cfg.model.flavor

    def _log_header(self) -> None:
        """The run's lines before its first step: what it trains, on what, how."""
        a, cfg, t, s = self.model_args, self.cfg, self.cfg.training, self.cfg.lr_schedule
        self.logger.info(
            f"run {self.run_dir} | {self.world_size} process(es) on {self.device.type} | model {self._model_source()} "
            f"({a.family}{describe_family(a)}, query {a.query.type}, "
            f"{a.n_layers}L d{a.dim} {a.n_heads}h/{a.n_kv_heads}kv, "
            f"positions {a.positions}) | params {num_params(a):,} (non-embedding {num_params(a, non_embedding=True):,}"
            f"{active_params(a)}) "
            f"| {self.tokens_per_step:,} tokens/step | data {self.data.train_tokens:,} train tokens, "
            f"batch fingerprint {self.data.schedule.fingerprint()}"
        )
        if self.data.sources:  # a mixture: what each source is and how much of every batch it gives
            total = sum(d["weight"] for d in self.data.sources)
            self.logger.info("data mixture: " + " | ".join(
                f"{d['name']} ({d['path']}): {d['weight'] / total:.1%} of the sequences" for d in self.data.sources))
        # The settings that decide whether a run can work: schedule, precision, compile, checkpointing.
        compiled = "per block + head loss" if t.compile else "off"
        head = loss_path(self.loss_chunk_tokens).describe(self.loss_chunk_tokens)
        validation = (f"every {cfg.validation.interval} steps ({self.validator.describe()})"
                      if cfg.validation.enabled else "off")
        schedule = describe_schedule(s, t.steps)
        self.logger.info(
            f"steps {t.steps:,} | lr {cfg.optimizer.lr:g} -> {s.min_lr:g}, warmup "
            f"{s.warmup_steps:,} steps, {schedule} | {cfg.optimizer.name} wd "
            f"{cfg.optimizer.weight_decay:g} | "
            f"precision {t.mixed_precision if self.device.type == 'cuda' else 'fp32 (cpu)'} | compile {compiled} | "
            f"head loss {head} | "
            f"activation checkpointing {cfg.activation_checkpoint.mode} | validation {validation}"
        )
        if self.downstream.tasks:
            self.logger.info(f"downstream tasks {self.downstream.describe()}")
        groups = " | ".join(plan.describe() for plan in self.group_plans)
        self.logger.info(f"optimizer groups: {groups}")
        self._log_memory_estimate()

    def _log_memory_estimate(self) -> None:
        """The estimated peak memory per process; on CUDA, a warning when it does not fit the device."""
        try:
            estimate = estimate_memory(self.cfg, self.model_args, self.world_size, self.device.type)
        except Exception as e:  # noqa: BLE001 - an estimate must never stop a run that may well fit
            self.logger.info(f"memory estimate unavailable ({type(e).__name__}: {e})")
            return
        # One line that says what each figure counts, so the estimate and the step lines' figure compare like with like.
        measured = ("the CUDA allocator's peak, the figure the estimate predicts" if self.device.type == "cuda" else
                    f"the whole process: Python, torch and data too, {format_memory(resident_bytes())} resident "
                    "before the first step")
        self.logger.info(f"memory estimate {estimate.describe()} for the training step; "
                         f"the step lines' \"{memory_label(self.device)}\" is {measured}")
        if self.device.type == "cuda":
            warning = fit_warning(estimate, device_memory_bytes(self.device), torch.cuda.get_device_name(self.device))
            if warning:
                self.logger.warning(f"warning: {warning}")

    def _group_lrs(self) -> dict[str, float] | None:
        """Each named group's LR when the groups differ from the paper's two (whose LR is the one ``lr``)."""
        if is_paper_split(self.group_plans):
            return None
        return {name: float(group["lr"]) for name, group in zip(self.group_names, self.optimizer.param_groups)}

    def write_run_info(self, finished: bool) -> None:
        """``<run>/run_info.json`` (rank 0): what suites and comparisons read without TensorBoard."""
        if self.is_main:
            self.record.write_run_info(self.run_dir, finished)

    # ----- the loop ---------------------------------------------------------------------------

    def micro_batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The token-mean cross-entropy of one micro-batch (the seam tests use to inject a loss)."""
        return self.model(x, targets=y, loss_chunk_tokens=self.loss_chunk_tokens)

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer update over ``grad_accum_steps`` micro-batches; returns (loss, grad_norm) as device scalars.

        Each micro-batch loss is its token mean / the accumulation steps and FSDP averages over ranks: the
        global batch's mean. Only ``on_nonfinite = skip`` waits for the device here (:meth:`_raise_if_diverged`).
        """
        tcfg, record = self.cfg.training, self.record
        set_lr(self.optimizer, lr_at(record.step, self.cfg.optimizer.lr, self.cfg.lr_schedule, tcfg.steps))
        self.family_runtime.start_step(self.model)
        loss_sum = torch.zeros((), device=self.device)
        for micro, (x, y) in enumerate(self.loader.micro_batches(record.step)):
            set_gradient_sync(self.model, micro == tcfg.grad_accum_steps - 1)  # reduce once per step
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.autocast():
                loss = self.micro_batch_loss(x, y) / tcfg.grad_accum_steps
            loss.backward()
            loss_sum += loss.detach()
        grad_norm = clip_grad_norm(self.model.parameters(), tcfg.max_norm)  # 0: measure only
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(loss_sum)  # gloo has no AVG: divided by the world size below
        loss = loss_sum / self.world_size
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        if tcfg.on_nonfinite == "skip":
            updated = self._skip_or_update(bool(finite.item()))
        else:  # stop: remember the first bad step on the device; the loop checks before anything reads the state
            self._first_nonfinite = torch.where(finite | (self._first_nonfinite > 0), self._first_nonfinite,
                                                record.step + 1)
            self.optimizer.step()
            updated = True
        if updated:  # what the family counted this step summed over the processes, then used (an MoE's bias)
            self.family_runtime.finish_step(self.model, dist.all_reduce if dist.is_available() and dist.is_initialized()
                                            else None)
        self.optimizer.zero_grad(set_to_none=True)
        record.step += 1
        record.tokens_seen += self.tokens_per_step
        return loss, grad_norm

    def _skip_or_update(self, finite: bool) -> bool:
        """on_nonfinite = skip: step the optimizer (True), or skip this update and stop after too many in a row."""
        if finite:
            self._consecutive_skips = 0
            self.optimizer.step()
            return True
        step = self.record.step + 1
        self.record.skipped_steps += 1
        self._consecutive_skips += 1
        if self._consecutive_skips >= self.cfg.training.max_consecutive_skips:
            raise TrainingDiverged(
                f"{self._consecutive_skips} updates in a row had a non-finite loss or grad norm (up to step {step}); "
                "stopped without saving (the last checkpoint is intact): lower optimizer.lr or raise "
                "training.max_consecutive_skips"
            )
        self.logger.warning(f"step {step}: non-finite loss/grad norm, update skipped")
        return False

    @property
    def periodic(self) -> list[tuple[Any, Callable[[int, torch.Tensor, torch.Tensor], Any]]]:
        """The loop's periodic pieces, in the order they run after a step: each decides when (its ``schedule``),
        the loop only asks. The checkpoint, which a signal may bring forward, is the loop's own last piece."""
        return [
            (self.metrics, self._log_step),
            (self.validator, lambda step, loss, grad_norm: self.validate()),
            (self.diagnostics, lambda step, loss, grad_norm: self.log_query_diagnostics()),
            (self.weight_dynamics, lambda step, loss, grad_norm: self.log_weight_dynamics()),
            (self.downstream, lambda step, loss, grad_norm: self.log_downstream()),
        ]

    def _log_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """The step's line and scalars (loss, LRs, gradient norm, tokens, skipped steps)."""
        self.metrics.log_step(step, loss.item(), self.optimizer.param_groups[0]["lr"], grad_norm.item(),
                              self.record.tokens_seen, self._group_lrs())
        self.metrics.scalar("skipped_steps", self.skipped_steps, step)
        runtime = self.family_runtime
        for tag, value in with_means(runtime.statistics_tag, runtime.step_statistics(self.model)).items():
            self.metrics.scalar(tag, value, step)

    def _raise_if_diverged(self) -> None:
        """on_nonfinite = stop: raise for a non-finite loss or grad norm so far, before anything logs or saves it."""
        bad_step = int(self._first_nonfinite.item())
        if bad_step:
            raise TrainingDiverged(
                f"non-finite loss or grad norm at step {bad_step}; stopped without saving it (the last checkpoint is "
                "intact): lower optimizer.lr, or set training.on_nonfinite=skip"
            )

    def validate(self) -> float:
        """Evaluate on the validation batches (and the paper protocol's eval_train row), log it, return the mean
        loss."""
        result = self.validator.run(self.model, self.step)
        self.metrics.log_validation(self.step, result.mean, result.std, result.seconds, result.eval_train,
                                    result.per_source)
        self.record.last_val_loss = result.mean
        return result.mean

    def log_downstream(self) -> None:
        """Score the multiple-choice tasks (all ranks: FSDP's forwards) and log acc, acc_norm per task."""
        figures = self.downstream.run(self.model)
        for tag, value in figures.items():
            self.metrics.scalar(tag, value, self.step)
        scores = ", ".join(f"{tag.split('/')[1]} {value:.4f}" for tag, value in figures.items()
                           if tag.endswith("acc_norm"))
        self.logger.info(f"step {self.step:>6}/{self.cfg.training.steps}  downstream acc_norm: {scores}  "
                         f"({figures['downstream/seconds']:.1f}s)")

    def log_query_diagnostics(self) -> None:
        """Per-layer query statistics on the first validation batch (all ranks run it: FSDP needs them)."""
        for tag, value in self.diagnostics.run(self.model, self.device, self.autocast).items():
            self.metrics.scalar(tag, value, self.step)

    def log_weight_dynamics(self) -> None:
        """Per-layer summaries of the query matrices (all ranks run it: FSDP all-gathers each matrix)."""
        if self.weight_dynamics.initial is None and not self._weights_reference_missing:
            self.weight_dynamics.initial, missing = initial_query_weights(self.cfg.checkpoint, self.model_args,
                                                                          self.cfg.training.seed)
            if self.weight_dynamics.initial is None:  # no step-0 weights to compare with
                self._weights_reference_missing = True
                self.logger.info(f"weights/.../drift not logged: {missing}")
        for tag, value in self.weight_dynamics.run(self.model).items():
            self.metrics.scalar(tag, value, self.step)

    def save_checkpoint(self) -> None:
        """Save ``step-N`` (if checkpoints are enabled), after checking the weights are finite."""
        if not self.cfg.checkpoint.enabled:
            return
        self._raise_if_diverged()
        # Never save weights an update made non-finite (a finite loss does not guarantee finite weights).
        finite = torch.ones((), device=self.device)
        for p in self.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP shard: each rank checks its own
            finite = finite * torch.isfinite(local).all()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # every rank stops together
        if not bool(finite.item()):
            raise TrainingDiverged(
                f"the weights are non-finite after step {self.step}; not saved (the last checkpoint is intact): "
                "lower optimizer.lr or tighten training.max_norm"
            )
        self.checkpointer.save(self.record, self.model, self.optimizer)
        self.metrics.scalar("checkpoint/blocked_s", self.checkpointer.last_save_blocked_s, self.step)

    def _resume_note(self) -> str:
        """What the same command does after this start failed: resume its last complete checkpoint, or start again."""
        if self.cfg.checkpoint.enabled:
            return self.checkpointer.resume_note()
        return ("checkpoints are off (checkpoint.enabled = false), so nothing was saved: add --job.rerun=true to the "
                "same command to start again from step 0")

    def export_final(self) -> None:
        """Write ``<run>/export`` (safetensors, checkpoint.export_dtype) from the final checkpoint."""
        from torchnlq.interop.export import export_safetensors

        pause_point("export", self.step)  # fault tests: a signal here stops the export, the next start does it
        out = export_safetensors(
            self.checkpointer.folder / f"step-{self.step}", self.run_dir / "export",
            dtype=self.cfg.checkpoint.export_dtype, overwrite=True,
        )
        self.logger.info(f"exported {out} ({self.cfg.checkpoint.export_dtype})")

    def _stop_for_changed_data(self, fault: DataFileChanged) -> UserError:
        """A token file changed under the run: save the last complete step (one process: the ranks of a larger run
        need not meet the fault at one step, so none waits in a save for the others), then one line saying so."""
        saved = self.checkpointer.folder / f"step-{self.step}"
        if self.cfg.checkpoint.enabled and self.world_size == 1 and self.step > 0 and not saved.exists():
            self.optimizer.zero_grad(set_to_none=True)  # a step's half-accumulated gradients are not its state
            self.save_checkpoint()
            self.checkpointer.wait()
        return UserError(f"{fault}; training stopped at step {self.step}; {self._resume_note()} once the file is "
                         "back as it was (data of other content is refused on resume: a new run trains on it)")

    def _stop_message(self, signal_name: str | None, step: int) -> str:
        """What a user can do after a preemption: resume only when there is a checkpoint to resume from."""
        stopped = f"stopped by {signal_name or 'a signal on another rank'} at step {step}"
        if self.cfg.checkpoint.enabled:
            return f"{stopped}; saved step-{step}: run the same command to resume"
        return (
            f"{stopped}; checkpoints are off (checkpoint.enabled = false), so nothing was saved: add --job.rerun=true "
            "to the same command to start again from step 0 (turn checkpoints on to be able to resume)"
        )

    def train(self) -> None:
        """Run until ``training.steps`` or a preemption signal; each piece validates/saves on its own schedule.

        An environment fault on the way (a full disk under train.log, tb/ or run_info.json) is one line that says
        where the same command goes on from (a failed save says so itself).
        """
        try:
            self._train()
        except OSError as e:
            line = os_error_line(e)
            if line is None:
                raise
            raise UserError(f"{line}; training stopped at step {self.step}; {self._resume_note()}") from e
        finally:
            self.close()  # the run folder is free for the next trainer

    def _train(self) -> None:
        steps = self.cfg.training.steps
        if self.step >= steps:
            self.logger.info(
                f"nothing to do: the run is complete at step {self.step} ({self.run_dir}), and its files are left as "
                "they are; raise training.steps to train on, or use a new job.name to start again"
            )
            self.metrics.close("success")  # nothing was logged: closes TensorBoard, writes no session end
            if self.cfg.checkpoint.export_at_end and self.is_main and not (self.run_dir / "export").exists():
                self.export_final()  # the export of the finishing start was interrupted
            return
        self.model.train()
        preemption = PreemptionFlag()
        start, start_tokens = time.perf_counter(), self.record.tokens_seen
        end: RunEnd = "failure"  # how this start ends, for the metrics (MetricsLogger.close), unless the loop says
        try:
            self.profiler.start(self.step)
            # The paper's evaluation at iteration 0; a branch's at its branch point (the trunk's weights there).
            if self.validator.due_before_training(self.step, branch=self.start.kind == "initial" and self.step > 0):
                self.validate()
            while self.step < steps:
                loss, grad_norm = self.train_step()
                step, last = self.step, self.step == steps
                pause_point("step", step)  # fault tests: a step done, nothing of it logged or saved
                self.metrics.count_tokens(self.tokens_per_step)
                due = [work for piece, work in self.periodic if piece.schedule.due(step, last)]
                saved = self.checkpointer.schedule.due(step, last)
                if due or saved:
                    self._raise_if_diverged()  # the only wait for the device in most steps
                for work in due:
                    work(step, loss, grad_norm)
                if saved:
                    with preemption.deferred():  # a signal during a save waits until it is written
                        self.save_checkpoint()
                if not last and preemption.requested(self.device):
                    if not saved:  # a signal on a checkpoint step stops right after that save
                        with preemption.deferred():
                            self.save_checkpoint()
                    message = self._stop_message(preemption.signal_name, step)
                    self.logger.info(message)
                    if self.is_main:
                        tell_launcher("stopped", message)
                    break
                self.profiler.step_done(last)
            end = "success" if self.step >= steps else "stopped"
        except DataFileChanged as e:  # a token file truncated or rewritten under the run (docs/reliability.md)
            raise self._stop_for_changed_data(e) from None
        except torch.OutOfMemoryError:
            try:
                self.profiler.out_of_memory(self.step)
            except Exception as e:  # noqa: BLE001 - the out-of-memory error is what the user must see
                self.logger.warning(f"the memory snapshot after the out-of-memory error failed: {e}")
            raise
        finally:
            try:
                self.profiler.stop()  # saves a window the end cut short; stops CUDA's memory history
            finally:
                try:
                    with preemption.deferred():  # a background save is written before a signal may stop it
                        self.checkpointer.close()
                finally:
                    preemption.restore()
                    self.metrics.close(end)  # after a failure, its own faults do not hide the failure
        finished = self.step >= steps
        self.write_run_info(finished=finished)
        if finished and self.cfg.checkpoint.export_at_end and self.is_main:
            self.export_final()
        wall = time.perf_counter() - start
        tokens = self.record.tokens_seen - start_tokens
        self.logger.info(f"done: step {self.step}, {tokens:,} tokens in {wall:.1f}s "
                         f"({tokens / max(wall, 1e-9):,.0f} tok/s incl. validation)")
