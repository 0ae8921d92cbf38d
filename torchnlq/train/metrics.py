"""Console lines, the train.log file, TensorBoard (scalars, the resolved config, hparams); throughput, MFU, memory.

Every tag written here or through :meth:`MetricsLogger.scalar` is listed, with its unit, in docs/monitoring.md
(a test checks it). The optional W&B sink (:mod:`torchnlq.train.wandb_logger`) gets the same scalars.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from torchnlq.config.every import Every
from torchnlq.config.job_config import JobConfig
from torchnlq.files import environment_fault, open_append, writing
from torchnlq.models.args import ModelArgs
from torchnlq.models.counts import num_params
from torchnlq.models.query import get_query_class
from torchnlq.parallel.device_figures import format_memory, memory_label, peak_memory_gib

if TYPE_CHECKING:
    from torchnlq.train.wandb_logger import WandbLogger

#: The TensorBoard text tag of the resolved config (the run's config.toml, in a Markdown code block).
CONFIG_TEXT_TAG = "config/toml"
#: The text tag of the options a resume changed (written at the resumed step, with the new config.toml).
RESUME_CHANGES_TAG = "config/resume_changes"
#: How one start of a run ended: all its steps done, an error, or a preemption signal (a resume goes on).
RunEnd = Literal["success", "failure", "stopped"]

HParam = bool | int | float | str

def setup_logging(run_dir: Path | None, quiet: bool = False) -> logging.Logger:
    """Log to the console and, when given a run folder, to ``run_dir/train.log``; ``quiet``: warnings only."""
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
        file = RunLog(run_dir / "train.log")
        file.setFormatter(fmt)
        logger.addHandler(file)
    return logger


class RunLog(logging.Handler):
    """``train.log``, appended line by line without a buffer (never through a link). A line the environment
    refuses (a full disk) is raised where it was logged, as one OSError naming the file, instead of logging's
    "--- Logging error ---" traceback; the file then takes no more lines (the console still shows them)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.file = open_append(path)
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed:
            return
        data = (self.format(record) + "\n").encode("utf-8")
        try:
            while data:  # os.write may write part of it
                data = data[os.write(self.file.fileno(), data):]
        except Exception as e:
            fault = environment_fault(e, self.path)
            if fault is None:
                self.handleError(record)
                return
            self.failed = True
            raise fault from e

    def close(self) -> None:
        self.file.close()
        super().close()


def run_hparams(
    cfg: JobConfig, model_args: ModelArgs, *, world_size: int, global_batch: int, tokens_per_step: int,
    precision: str,
) -> dict[str, HParam]:
    """The settings runs are compared on, as flat ``{name: value}`` (TensorBoard's HParams tab, W&B).

    Dotted option names (``run.*``: derived), unset ones left out; seeds as strings (float64 is exact only to 2**53).
    """
    read = lambda names: {name: operator.attrgetter(name)(cfg) for name in names}  # noqa: E731
    s, q = cfg.lr_schedule, cfg.model.query
    hparams: dict[str, HParam | None] = {
        **read(("job.name", "model.flavor", "model.query.type")),
        **{f"model.query.{knob}": getattr(q, knob) for knob in get_query_class(q.type).knobs},
        **{f"model.{key}": getattr(model_args, key)  # the resolved flavor's
           for key in ("family", "n_layers", "dim", "n_heads", "n_kv_heads", "positions", "init")},
        **read(("optimizer.name", "optimizer.lr", "optimizer.weight_decay", "optimizer.beta1",
                "optimizer.beta2", "lr_schedule.warmup_steps", "lr_schedule.min_lr")),
        "lr_schedule.decay_steps": s.decay_steps if s.decay_steps is not None else cfg.training.steps,
        **read(("training.steps", "training.micro_batch_size", "training.grad_accum_steps", "training.seq_len",
                "training.max_norm", "training.mixed_precision", "data.path", "validation.protocol", "float8.enabled")),
        **{name: str(value) for name, value in read(("training.seed", "data.seed", "validation.seed")).items()},
        "run.world_size": world_size,
        "run.global_batch": global_batch,
        "run.tokens_per_step": tokens_per_step,
        "run.precision": precision,
        "run.params": num_params(model_args),
    }
    return {name: value for name, value in hparams.items() if value is not None}


def hparams_summary(hparams: dict[str, HParam] | None = None, *, end_status: RunEnd | None = None) -> Any:
    """A TensorBoard HParams-plugin summary: the session's start (its ``hparams``), or its end (``end_status``)."""
    # Built from the plugin's protos: TensorBoard's ready-made summary functions import TensorFlow.
    from google.protobuf import json_format, struct_pb2
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    now = time.time()
    if hparams is not None:
        # bool_value, number_value or string_value, by the value's type (a bool is a bool, not a number).
        values = {name: json_format.ParseDict(value, struct_pb2.Value()) for name, value in hparams.items()}
        data = plugin_data_pb2.HParamsPluginData(
            session_start_info=plugin_data_pb2.SessionStartInfo(hparams=values, start_time_secs=now))
        tag = metadata.SESSION_START_INFO_TAG
    else:
        status = api_pb2.Status.Value(f"STATUS_{(end_status or 'unknown').upper()}")
        data = plugin_data_pb2.HParamsPluginData(
            session_end_info=plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=now))
        tag = metadata.SESSION_END_INFO_TAG
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data),
                                        tensor=metadata.NULL_TENSOR)])


def _wait_for_a_later_second(tb_dir: str | Path) -> None:
    """Return once a new event file's name sorts after every one in ``tb_dir``.

    Readers (TensorBoard, ``EventAccumulator``) read a folder's event files in name order and drop events
    whose step goes back ("a restart"). A name is ``events.out.tfevents.<unix second>.<host>.<pid>.<n>``:
    two writers started in the same second sort by pid and counter as strings (``...10`` before ``...9``),
    so a resume in the same second could be read first and then purged by the older file. A start in a
    later second sorts last; waiting for it costs at most a second, and only when a file is that new.
    """
    newest = 0
    for path in Path(tb_dir).glob("events.out.tfevents.*"):
        stamp = path.name.split(".")[3]
        if stamp.isdigit():
            newest = max(newest, int(stamp))
    wait = newest + 1 - time.time()
    if 0 < wait <= 1.0:  # a clock that went back by more is not waited for
        time.sleep(wait)


def text_summary(tag: str, markdown: str) -> Any:
    """A TensorBoard text summary under exactly ``tag`` (``SummaryWriter.add_text`` appends ``/text_summary``)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.compat.proto.types_pb2 import DT_STRING
    from tensorboard.plugins.text.metadata import create_summary_metadata

    tensor = TensorProto(dtype=DT_STRING, string_val=[markdown.encode("utf-8")], tensor_shape=TensorShapeProto())
    return Summary(value=[Summary.Value(tag=tag, metadata=create_summary_metadata(tag, ""), tensor=tensor)])


@dataclass(frozen=True)
class ValidationPlan:
    """What the ETA needs to know of the run's validations (built by the trainer)."""

    interval: int
    total_steps: int
    forwards_per_validation: int  # this rank's micro-batch forwards in one validation
    train_forwards_per_step: int  # micro-batches per optimizer step (grad_accum_steps)

    def left_after(self, step: int) -> int:
        """Validations still to run after ``step``: every ``interval`` steps, and at the last step."""
        regular = self.total_steps // self.interval - step // self.interval
        last_extra = 1 if self.total_steps % self.interval and step < self.total_steps else 0
        return max(regular, 0) + last_extra


class MetricsLogger:
    """Aggregates per-step figures and writes them every ``log_interval`` steps (throughput: since the last)."""

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
        sink: WandbLogger | None = None,
    ) -> None:
        self.logger = logger
        self.schedule = Every(log_interval)  # the step line
        self.device = device
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.total_steps = total_steps
        self.writer = None
        self.sink = sink
        # A tb/ folder with events already holds the first start's config and hparams: a resume adds only
        # what changed. A start at step 0 writes them again: its purge_step hides every earlier event.
        self.first_start = start_step == 0 or tb_dir is None or not any(Path(tb_dir).glob("events.out.tfevents.*"))
        self.tb_dir = tb_dir
        if tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events a crashed earlier attempt logged after the step we resume from.
            with writing(tb_dir):
                _wait_for_a_later_second(tb_dir)
                self.writer = SummaryWriter(log_dir=str(tb_dir), purge_step=start_step + 1 if start_step else 0)
        self.start_step = start_step
        self.last_step = start_step  # the step of the latest scalar (where the session's end is written)
        self._last_time = time.perf_counter()
        self._tokens_since = 0
        self._start = self._last_time
        # The ETA adds the validations still to come (set by the trainer).
        self.validation_plan: ValidationPlan | None = None
        self._validation_s = 0.0  # validation time of this start, left out of the training speed
        self._last_validation_s: float | None = None

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Write one scalar to TensorBoard and to the sink, when they exist (neither on ranks other than 0)."""
        self.last_step = step
        if self.writer is not None:
            with writing(self.tb_dir):  # its thread's fault (a full disk) is raised at the next call
                self.writer.add_scalar(tag, value, step)
        if self.sink is not None:
            self.sink.scalar(tag, value, step)

    def log_config(self, toml: str, hparams: dict[str, HParam], changes: Sequence[str] = ()) -> None:
        """The resolved config (Markdown TOML) and the hparams on a first start; a resume adds its ``changes``."""
        if self.writer is None:
            return
        step, add = self.start_step, self.writer.file_writer.add_summary
        with writing(self.tb_dir):
            if self.first_start or changes:
                add(text_summary(CONFIG_TEXT_TAG, "```toml\n" + toml.rstrip("\n") + "\n```"), step)
            if self.first_start:
                # Only the session start: an experiment summary in each run would make TensorBoard's HParams
                # table pick one run's list of hparams instead of joining every run's.
                add(hparams_summary(hparams), step)
            elif changes:
                add(text_summary(RESUME_CHANGES_TAG, "\n".join(f"- {line}" for line in changes)), step)
            self.writer.flush()  # a run that dies early still shows what it was

    def count_tokens(self, tokens: int) -> None:
        """Add the tokens processed by one optimizer step."""
        self._tokens_since += tokens

    def log_step(self, step: int, loss: float, lr: float, grad_norm: float, tokens_seen: int,
                 group_lrs: dict[str, float] | None = None) -> dict[str, float]:
        """Write the console line and scalars of ``step`` (``group_lrs`` as ``lr/<name>``); return the figures."""
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
        h, s = divmod(int(self.seconds_left(step, now)), 3600)
        eta = f"{h}h{s // 60:02d}m" if h else f"{s // 60}m{s % 60:02d}s"
        self.logger.info(
            f"step {step:>6}/{self.total_steps}  loss {loss:.4f}  lr {lr:.3e}  grad_norm {grad_norm:.3f}"
            f"  tok/s {tps:,.0f}{mfu_text}  {memory_label(self.device)} {format_memory(mem * 2**30)}  eta {eta}"
        )
        for tag, key in [("loss/train", "loss"), ("lr", "lr"), ("grad_norm", "grad_norm"),
                         ("throughput/tokens_per_s", "tokens_per_s"), ("throughput/mfu", "mfu"),
                         ("memory/peak_gib", "memory_gib")]:
            if key in figures:
                self.scalar(tag, figures[key], step)
        self.scalar("tokens_seen", tokens_seen, step)
        for name, value in (group_lrs or {}).items():
            self.scalar(f"lr/{name}", value, step)
        return figures

    def seconds_left(self, step: int, now: float) -> float:
        """The ETA after ``step``: the remaining steps at this start's training speed, plus the validations to come."""
        training_s = max(now - self._start - self._validation_s, 1e-9)
        step_s = training_s / max(step - self.start_step, 1)
        left = (self.total_steps - step) * step_s
        plan = self.validation_plan
        if plan is not None:
            per_validation = self._last_validation_s
            if per_validation is None:  # none measured yet: a forward is about a third of a training micro-step
                per_validation = step_s / plan.train_forwards_per_step / 3 * plan.forwards_per_validation
            left += plan.left_after(step) * per_validation
        return left

    def log_validation(self, step: int, mean: float, std: float, seconds: float,
                       eval_train: tuple[float, float] | None = None,
                       per_source: dict[str, float] | None = None) -> None:
        """Write the validation line and scalars; ``eval_train``: the paper protocol's train estimate (mean, std);
        ``per_source``: a mixture's loss per source (``loss/val/<name>``; ``mean`` is their weighted mean)."""
        self._validation_s += seconds
        self._last_validation_s = seconds
        figures = [("val", mean, std)] + ([("eval_train", *eval_train)] if eval_train is not None else [])
        text = ""
        for name, value, spread in figures:
            finite = math.isfinite(spread)  # one micro-batch has no spread to show
            text += f"  {name}_loss {value:.4f}" + (f" ± {spread:.4f}" if finite else "")
            self.scalar(f"loss/{name}", value, step)
            if finite:
                self.scalar(f"loss/{name}_std", spread, step)
        for source, value in (per_source or {}).items():
            text += f"  {source} {value:.4f}"
            self.scalar(f"loss/val/{source}", value, step)
        self.logger.info(f"step {step:>6}/{self.total_steps}{text}  ({seconds:.1f}s)")
        if self.writer is not None:  # on disk at once: a sweep's pruner reads each validation while the run goes on
            with writing(self.tb_dir):
                self.writer.flush()

    def close(self, end: RunEnd | None = None) -> None:
        """Flush and close TensorBoard and the sink; ``end`` says how the run ended. A fault of TensorBoard's
        writer (a full disk) is raised, unless the run is failing already (``end = "failure"``): its own error
        is the one line then."""
        try:
            if self.writer is not None:
                writer, self.writer = self.writer, None
                with writing(self.tb_dir):
                    # Only a success ends the hparams session: after a failure or a stop, a resume may still finish it.
                    if end == "success" and self.last_step > self.start_step:  # not a rerun of a finished run
                        writer.file_writer.add_summary(hparams_summary(end_status="success"), self.last_step)
                    try:
                        writer.flush()  # raises what its thread met
                    finally:
                        writer.close()
        except OSError:
            if end != "failure":
                raise
        finally:
            if self.sink is not None:
                self.sink.close(end)
