"""One typed record of a run's metadata, written into every checkpoint (``torchnlq.json``) and into
``<run>/run_info.json``; its JSON keys never change, so older checkpoints still load (missing fields read None).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from torchnlq.config.job_config import SEED_MAX
from torchnlq.errors import UserError
from torchnlq.files import replace_file
from torchnlq.models.args import MODEL_FIELDS, ModelArgs
from torchnlq.models.counts import flops_per_token, num_params
from torchnlq.models.recorded import Field, check_record, integer

RUN_INFO_FILE = "run_info.json"
# The fields of RunRecord written into a checkpoint's record as they are.
_PLAIN_KEYS = ("step", "tokens_seen", "skipped_steps", "world_size", "seq_len", "name", "steps", "mixed_precision")
_MAX = 2**63 - 1
_COUNT, _TEXT = integer(0, _MAX), Field(str, null=True)
#: A tokenizer's description (Tokenizer.describe(): torchnlq.json's "tokenizer", an old export's tokenizer_config.json).
TOKENIZER_FIELDS: dict[str, Field] = {
    "name": Field(str), "vocab_size": MODEL_FIELDS["vocab_size"], "eot_id": integer(0, 2**32), "eot_token": Field(str),
    "tiktoken_sha256": Field(str), "tokenizer_sha256": Field(str),
}
#: What a checkpoint's torchnlq.json or an export's config.json may hold (:meth:`RunRecord.from_meta`): the fields
#: every reader uses, each of its exact type and range; model_args is :meth:`ModelArgs.from_dict`'s to check.
META_FIELDS: dict[str, Field] = {
    "model_args": Field(dict, required=True),
    "tokenizer": Field(dict, null=True, fields=TOKENIZER_FIELDS),
    "step": _COUNT, "tokens_seen": _COUNT, "skipped_steps": _COUNT, "world_size": integer(1, 2**24, null=True),
    "seq_len": integer(1, MODEL_FIELDS["max_seq_len"].hi, null=True), "name": _TEXT, "steps": integer(0, null=True),
    "mixed_precision": _TEXT, "initialized_from": _TEXT, "data_path": Field(str), "data_fingerprint": Field(str),
    "data_sources": Field(list, null=True),
    "fingerprint": Field(dict, fields={
        "optimizer": Field(dict, null=True, values=Field(str)),
        "data": Field(dict, null=True, fields={
            "train_tokens": integer(0, _MAX, required=True), "seed": integer(0, SEED_MAX, required=True),
            "global_batch": integer(1, _MAX, required=True), "content": _TEXT, "content_sha256": _TEXT,
            "batches": _TEXT}),
    }),
    "validation": Field(dict, fields={
        "seed": integer(0, SEED_MAX, null=True), "sequences": integer(1, _MAX, null=True),
        "micro_batch_size": integer(1, _MAX, null=True), "fingerprint": _TEXT,
        "protocol": Field(str, null=True, choices=("fixed", "paper")), "interval": integer(1, _MAX, null=True)}),
}


@dataclass(frozen=True)
class DataRecord:
    """Which tokens the run trained on, and in which order (the batch schedule)."""

    path: str
    train_tokens: int
    seed: int
    global_batch: int
    batch_fingerprint: str
    #: Sampled-content hash of the token files (None in checkpoints older than the check).
    content_fingerprint: str | None = None
    #: The whole token files' sha256 from meta.json (None: a folder prepared, or a checkpoint written, before).
    content_sha256: str | None = None
    #: A mixture's sources ([[data.sources]]): name, path, weight and content fingerprint of each; None: one folder.
    sources: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ValidationRecord:
    """The validation set: enough to draw the same windows again (None: not recorded, evaluation asks)."""

    seed: int | None
    sequences: int | None
    micro_batch_size: int | None
    fingerprint: str | None = None
    #: "paper": a fresh row of the paper's table per validation, row = step // interval; None or "fixed": one set.
    protocol: str | None = None
    interval: int | None = None


@dataclass
class RunRecord:
    """A run's metadata: the model, its data and validation, its precision and progress."""

    model_args: ModelArgs
    tokenizer: dict[str, Any]
    seq_len: int | None = None
    data: DataRecord | None = None
    validation: ValidationRecord | None = None
    name: str | None = None
    steps: int | None = None
    world_size: int | None = None
    mixed_precision: str | None = None  # what the run computed in, not what the config asked for
    step: int = 0
    tokens_seen: int = 0
    skipped_steps: int = 0
    last_val_loss: float | None = None
    #: Lineage: the checkpoint or export the run's weights started from (kept across resumes; None: fresh)...
    initialized_from: str | None = None
    #: ...and the checkpoint this session resumed from (None: it did not resume).
    resumed_from: str | None = None
    #: The optimizer's parameter groups: name -> "optimizer, N tensors" (the state a checkpoint holds per group).
    optimizer_groups: dict[str, str] | None = None

    def resume_fingerprint(self) -> dict[str, Any]:
        """What must match for a resume: the model's shape, the data order and the optimizer's groups.

        One folder's order is decided by the seed, its length, seq_len and the global batch; a mixture's also by its
        sources' weights and lengths and by how the draw is made: its batch fingerprint goes in (``batches``), so
        a checkpoint of another draw (torchnlq's before issue 40) is refused, never continued with other batches.
        """
        assert self.data is not None and self.seq_len is not None, "a training run records its data"
        optimizer = {"optimizer": dict(self.optimizer_groups)} if self.optimizer_groups else {}
        return optimizer | {
            "model": self.model_args.to_dict(),
            "data": {
                "tokenizer": self.tokenizer.get("name"),
                "train_tokens": self.data.train_tokens,
                "seed": self.data.seed,
                "seq_len": self.seq_len,
                "global_batch": self.data.global_batch,
            }
            | ({"content": self.data.content_fingerprint} if self.data.content_fingerprint else {})
            | ({"content_sha256": self.data.content_sha256} if self.data.content_sha256 else {})
            | ({"batches": self.data.batch_fingerprint} if self.data.sources else {}),
        }

    def to_meta(self) -> dict[str, Any]:
        """The checkpoint's ``torchnlq.json`` (keys unchanged since the first torchnlq checkpoints)."""
        meta: dict[str, Any] = {k: getattr(self, k) for k in _PLAIN_KEYS}
        meta |= {"model_args": self.model_args.to_dict(), "tokenizer": dict(self.tokenizer)}
        if self.data is not None:
            meta["fingerprint"] = self.resume_fingerprint()
            meta["data_path"] = self.data.path
            meta["data_fingerprint"] = self.data.batch_fingerprint
            if self.data.sources:
                meta["data_sources"] = list(self.data.sources)
        if self.validation is not None:
            meta["validation"] = {k: v for k, v in asdict(self.validation).items() if v is not None}
        if self.initialized_from is not None:
            meta["initialized_from"] = self.initialized_from
        return meta

    @classmethod
    def from_meta(cls, meta: Any, where: str | Path) -> RunRecord:
        """Read a checkpoint's ``torchnlq.json`` or an export's ``config.json`` against :data:`META_FIELDS` and
        :data:`~torchnlq.models.args.MODEL_FIELDS`; a missing, mistyped or out-of-range entry is one UserError
        naming the file and the key."""
        if not isinstance(meta, dict) or "model_args" not in meta:
            raise UserError(f"'{where}' has no model_args; it was not written by this torchnlq, or is corrupt")
        try:
            values = check_record(meta, META_FIELDS, "")
        except UserError as e:
            raise UserError(f"'{where}': {e}; the file is damaged or was edited: use another copy of the model"
                            ) from None
        _check_query_type_registered(values["model_args"], where)
        try:
            args = ModelArgs.from_dict(values["model_args"])
        except UserError as e:
            raise UserError(f"'{where}': {e}; the file is damaged or was edited: use another copy of the model"
                            ) from None
        fingerprint = values.get("fingerprint") or {}
        return cls(
            model_args=args,
            tokenizer=dict(values.get("tokenizer") or {}),
            data=_data_record(values, fingerprint.get("data")),
            validation=_validation_record(values.get("validation")),
            optimizer_groups=fingerprint.get("optimizer"),  # None before they were recorded
            **{k: values[k] for k in (*_PLAIN_KEYS, "initialized_from") if k in values},  # absent: the default
        )

    def to_run_info(self, finished: bool) -> dict[str, Any]:
        """``run_info.json``: progress and the figures comparisons group and check runs by."""
        a = self.model_args
        return {
            "name": self.name,
            "step": self.step,
            "steps": self.steps,
            "finished": finished,
            # JSON has no NaN/Infinity: a diverged validation is recorded as null, never as a bare NaN.
            "last_val_loss": None if self.last_val_loss is None or not math.isfinite(self.last_val_loss)
            else self.last_val_loss,
            "query_type": a.query.type,
            "total_params": num_params(a),
            "non_embedding_params": num_params(a, non_embedding=True),
            # Those a token computes with (an MoE's routed share of its experts): the same as above for a dense model.
            "active_non_embedding_params": num_params(a, non_embedding=True, active=True),
            "flops_per_token": flops_per_token(a, self.seq_len or a.max_seq_len),
            "batch_fingerprint": self.data.batch_fingerprint if self.data else None,
            "validation_fingerprint": self.validation.fingerprint if self.validation else None,
            "world_size": self.world_size,
            "mixed_precision": self.mixed_precision,
            "initialized_from": self.initialized_from,
            "resumed_from": self.resumed_from,
            "data_sources": self.data.sources if self.data else None,
            # Which tokenizer file made the ids (an hf tokenizer.json, or tiktoken ranks): runs compare only on the
            # same.
            "tokenizer_sha256": self.tokenizer.get("tokenizer_sha256") or self.tokenizer.get("tiktoken_sha256"),
        }

    def write_run_info(self, run_dir: Path, finished: bool) -> None:
        """Write ``<run_dir>/run_info.json`` atomically (a reader never sees half a file)."""
        replace_file(run_dir / RUN_INFO_FILE, json.dumps(self.to_run_info(finished), indent=2, allow_nan=False))


def read_run_info(run_dir: Path) -> dict[str, Any] | None:
    """``run_info.json`` of a run folder as written by :meth:`RunRecord.write_run_info`; None if absent or
    unreadable."""
    try:
        info = json.loads((run_dir / RUN_INFO_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return info if isinstance(info, dict) else None


def _check_query_type_registered(model_args: dict[str, Any], where: str | Path) -> None:
    """A model whose query type no imported module registers was, as a rule, trained with a plugin: say to import it
    (the file is sound), rather than call the file damaged."""
    from torchnlq.errors import closest
    from torchnlq.models.query import QUERY_TYPES

    query = model_args.get("query")
    name = query.get("type") if isinstance(query, dict) else None
    if not isinstance(name, str) or name in QUERY_TYPES:
        return  # a registered type, or a malformed record: ModelArgs.from_dict names what is wrong
    match = closest(name, list(QUERY_TYPES))
    raise UserError(f"'{where}' holds a model of query type {name!r}, which no imported module registers: import the "
                    "plugin module that registered it for training, with --plugins MODULE (generate.py, evaluate.py, "
                    "convert_checkpoint.py) or --job.plugins MODULE (a run); the run's config.toml names it under "
                    f"[job] plugins (registered now: {', '.join(sorted(QUERY_TYPES))}"
                    + (f"; if the name was mistyped, did you mean '{match}'?)" if match else ")"))


def _data_record(meta: dict[str, Any], data: dict[str, Any] | None) -> DataRecord | None:
    if not data or "data_fingerprint" not in meta:
        return None
    return DataRecord(
        path=meta.get("data_path", ""), train_tokens=data["train_tokens"], seed=data["seed"],
        global_batch=data["global_batch"], batch_fingerprint=meta["data_fingerprint"],
        content_fingerprint=data.get("content"), content_sha256=data.get("content_sha256"),
        sources=meta.get("data_sources"),
    )


def _validation_record(validation: dict[str, Any] | None) -> ValidationRecord | None:
    if not validation:
        return None
    return ValidationRecord(**{f.name: validation.get(f.name) for f in fields(ValidationRecord)})
