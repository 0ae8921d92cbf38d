"""What the trainer reads: :func:`build_data` (a run's :class:`RunData`) and a loader of a step's micro-batches.

The trainer asks its loader for ``micro_batches(step)`` and never sees offsets or files; a
benchmark times the reads by wrapping the loader (any :class:`MicroBatchSource`).
"""

from __future__ import annotations

import hashlib

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from torchnlq.config.job_config import Data, Training, Validation
from torchnlq.data.batches import (Batch, BatchSchedule, PaperValidationRows, ValidationSet, build_batch_schedule,
                                   build_validation_set, open_token_files)
from torchnlq.data.budget import check_data_fits_ram
from torchnlq.data.mixture import MixtureSchedule, MixtureValidation, open_sources, read_mixed_batch
from torchnlq.data.token_file import TokenFile, read_batch


class MicroBatchSource(Protocol):
    """Anything that yields one step's micro-batches: a :class:`TrainLoader` or a wrapper of one."""

    def micro_batches(self, step: int) -> Iterator[Batch]:
        """Yield the (inputs, targets) micro-batches of optimizer step ``step`` (0-based) for this rank."""
        ...


class TrainLoader:
    """This rank's micro-batches of every step, read from the pre-drawn :class:`BatchSchedule` (a mixture's
    :class:`~torchnlq.data.mixture.MixtureSchedule`, with one token file per source)."""

    def __init__(
        self, tokens: TokenFile | list[TokenFile], schedule: BatchSchedule, rank: int, world_size: int,
        micro_batch_size: int, grad_accum_steps: int,
    ) -> None:
        schedule.check_layout(world_size, micro_batch_size, grad_accum_steps)
        self.tokens, self.schedule = tokens, schedule
        self.rank, self.world_size = rank, world_size
        self.micro_batch_size, self.grad_accum_steps = micro_batch_size, grad_accum_steps

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all ranks."""
        return self.schedule.global_batch * self.schedule.seq_len

    def micro_batches(self, step: int) -> Iterator[Batch]:
        """Yield ``grad_accum_steps`` (x, y) CPU LongTensor pairs of ``[micro_batch_size, seq_len]``."""
        for micro in range(self.grad_accum_steps):
            where = (step, micro, self.rank, self.world_size, self.micro_batch_size, self.grad_accum_steps)
            offsets = self.schedule.offsets_for(*where)
            if isinstance(self.schedule, MixtureSchedule):
                yield read_mixed_batch(self.tokens, self.schedule.sources_for(*where), offsets, self.schedule.seq_len)
            else:
                yield read_batch(self.tokens, offsets, self.schedule.seq_len)


@dataclass
class RunData:
    """A run's data: the training loader, the fixed validation batches and the token files' metadata."""

    loader: TrainLoader
    #: ``batches_at(step)``: what to evaluate after a step (fixed, the paper's row of that step, or per source).
    validation: ValidationSet | PaperValidationRows | MixtureValidation
    meta: dict[str, Any]
    #: Hash of sampled windows of train.bin and val.bin: another corpus of the same size differs.
    content_fingerprint: str
    #: The whole files' sha256 as meta.json records them (checked when the folder was opened); None before.
    content_sha256: str | None = None
    #: A mixture's sources: name, path, weight and content fingerprint of each ([[data.sources]]); None for one folder.
    sources: list[dict[str, Any]] | None = None

    @property
    def schedule(self) -> BatchSchedule:
        """The pre-drawn schedule behind the loader."""
        return self.loader.schedule

    @property
    def validation_fingerprint(self) -> str:
        """Short hash of every validation offset the run may evaluate."""
        return self.validation.fingerprint()

    @property
    def validation_micro_batch_size(self) -> int:
        """Sequences per validation forward."""
        return self.validation.micro_batch_size

    @property
    def train_tokens(self) -> int:
        """Length of the training split in tokens (all sources' of a mixture)."""
        tokens = self.loader.tokens
        return sum(map(len, tokens)) if isinstance(tokens, list) else len(tokens)


def build_data(data: Data, training: Training, validation: Validation, rank: int, world_size: int) -> RunData:
    """Open ``data.path`` (or ``data.sources``) and draw the schedule and validation set of a run on ``world_size``
    processes; what they will take is bounded by the RAM first (nothing drawn, read or written before)."""
    check_data_fits_ram(data, training, validation, world_size)
    if data.sources:
        return _build_mixture(data, training, validation, rank, world_size)
    train, val, meta = open_token_files(data, training.seq_len)
    schedule = build_batch_schedule(train, training, data, world_size)
    loader = TrainLoader(train, schedule, rank, world_size, training.micro_batch_size, training.grad_accum_steps)
    val_set = build_validation_set(val, validation, training.seq_len, training.micro_batch_size, train)
    content = f"{train.content_fingerprint()}-{val.content_fingerprint()}"
    # The recorded sha256 of both token files, short (None for a folder prepared before meta.json had them).
    digests = [(meta.get("files") or {}).get(split, {}).get("sha256") for split in ("train", "val")]
    sha256 = "-".join(d[:16] for d in digests) if all(isinstance(d, str) for d in digests) else None
    return RunData(loader, val_set, meta, content, sha256)


def data_meta(data: Data, seq_len: int) -> dict[str, Any]:
    """The meta.json of the run's data (a mixture's first source: they share a tokenizer, checked), each folder
    opened and checked as a run opens it."""
    return open_sources(data, seq_len)[0].meta if data.sources else open_token_files(data, seq_len)[2]


def _build_mixture(data: Data, training: Training, validation: Validation, rank: int, world_size: int) -> RunData:
    """A mixture's RunData: every source opened and checked, one schedule over them, a validation set per source."""
    sources = open_sources(data, training.seq_len)
    global_batch = training.global_batch(world_size)
    schedule = MixtureSchedule([len(s.train) for s in sources], [s.weight for s in sources], training.seq_len,
                               training.steps, global_batch, data.seed)
    loader = TrainLoader([s.train for s in sources], schedule, rank, world_size, training.micro_batch_size,
                         training.grad_accum_steps)
    val_set = MixtureValidation(sources, validation, training.seq_len,
                                validation.micro_batch_size or training.micro_batch_size)
    described = [{"name": s.name, "path": str(entry.path), "weight": s.weight,
                  "content": f"{s.train.content_fingerprint()}-{s.val.content_fingerprint()}"}
                 for s, entry in zip(sources, data.sources)]
    content = hashlib.sha256(repr([(d["name"], d["weight"], d["content"]) for d in described]).encode()).hexdigest()
    return RunData(loader, val_set, sources[0].meta, content[:16], None, described)
