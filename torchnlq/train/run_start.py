"""Where a run starts, decided and loaded in one place: :func:`start_run`.

**Resume** this run's own checkpoint (bit for bit), else an **initial load** (``checkpoint.initial_load_path``:
a DCP checkpoint, an export or a Hugging Face folder), else **fresh**. In ``train``: it needs checkpoint and interop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from torchnlq.checkpoint.checkpointer import (
    Checkpointer,
    CorruptCheckpoint,
    Optimizers,
    compare_fingerprints,
    list_checkpoints,
    step_folders,
)
from torchnlq.checkpoint.metadata import MODEL_KEY, read_meta
from torchnlq.checkpoint.record import RUN_INFO_FILE, RunRecord, read_run_info
from torchnlq.checkpoint.safe_reader import DCPReadError, load_dcp
from torchnlq.config.job_config import Checkpoint
from torchnlq.errors import UserError
from torchnlq.interop.hf_folder import hf_model_type
from torchnlq.interop.load import is_export
from torchnlq.interop.tokenizer_files import TOKENIZER_RANKS_FILE, find_gpt2_ranks, hf_tokenizer_files
from torchnlq.interop.upcycle import anchored_from_linear, query_tensors, replaced_query_note, weights_for
from torchnlq.models import build_model
from torchnlq.models.args import ModelArgs
from torchnlq.parallel.parallelize import reference_state_dict
from torchnlq.train.run_lock import RunLock
from torchnlq.train.weight_dynamics import initial_matrices


@dataclass(frozen=True)
class RunStart:
    """What :func:`start_run` decided and loaded."""

    #: "resume" (this run's checkpoint), "initial" (checkpoint.initial_load_path) or "fresh".
    kind: Literal["fresh", "resume", "initial"] = "fresh"
    #: The line the trainer logs ("resumed from ...", "initialised from ..."); None for a fresh run.
    line: str | None = None
    #: The step the run goes on from (0 unless it continues a checkpoint's progress).
    step: int = 0
    #: This run's checkpoint it resumed from, read before the run lock is taken (checked again under it).
    resume_point: Path | None = None
    #: Where the weights came from (None: fresh): the tokenizer ranks it carries go on into this run's checkpoints.
    weights_from: Path | None = None


def is_pretrained(path: str | Path) -> bool:
    """An initial load of weights from another format: a safetensors export or a Hugging Face GPT-2/Llama folder."""
    return is_export(path) or hf_model_type(path) is not None


def start_run(
    cfg: Checkpoint, checkpointer: Checkpointer, model: nn.Module, optimizer: Optimizers,
    record: RunRecord,
) -> RunStart:
    """Decide where the run starts and load it into ``model`` and ``optimizer``; ``record`` (at step 0) refuses,
    by its fingerprint, another model shape (or data order, for a resume) and takes over a continued run's progress."""
    fingerprint = record.resume_fingerprint()
    # A run folder with checkpoints is never trained from step 0 beside them: new saves would mix two runs
    # and keep_latest_k would prune the old run's checkpoints.
    steps = [] if cfg.enabled and cfg.resume else step_folders(checkpointer.folder)
    if steps:
        why = "checkpoint.resume = false" if cfg.enabled else "checkpoint.enabled = false"
        raise UserError(
            f"{checkpointer.folder} already holds checkpoints (step-{steps[-1]} the latest) and {why} would train "
            "from step 0 beside them; use a new --job.name to start over (or move that folder away), or resume them"
        )
    path = checkpointer.resume_path() if cfg.enabled else None
    if path is not None:
        _check_initial_load_is_this_runs(cfg.initial_load_path, path)
        try:
            saved = checkpointer.load(path, model, optimizer, fingerprint)
        except CorruptCheckpoint as e:  # a damaged latest checkpoint: name the previous complete one
            earlier = [s for s in list_checkpoints(checkpointer.folder) if f"step-{s}" != path.name]
            if cfg.load_step >= 0 or not earlier:
                raise
            raise UserError(
                f"{e}; resume from the previous complete checkpoint with --checkpoint.load_step={earlier[-1]} "
                f"(or move {path} away)"
            ) from None
        _continue(record, saved)
        record.resumed_from = str(path)
        line = f"resumed from {path} (step {record.step}, {record.tokens_seen:,} tokens seen)"
        if cfg.initial_load_path:
            line += (f"; checkpoint.initial_load_path {cfg.initial_load_path} is not used: "
                     "the run has its own checkpoints")
        return RunStart("resume", line, record.step, resume_point=path, weights_from=path)
    src = cfg.initial_load_path
    if not src:
        return RunStart()
    if not cfg.initial_load_model_only:
        if is_export(src):
            raise UserError(
                f"checkpoint.initial_load_path '{src}' is an export: it holds weights, no optimizer state or "
                "step; set checkpoint.initial_load_model_only = true"
            )
        _continue(record, checkpointer.load(Path(src), model, optimizer, fingerprint))
        record.initialized_from = str(src)
        return RunStart("initial", f"initialised from {src} (step {record.step})", record.step, weights_from=Path(src))
    model_fingerprint = {"model": fingerprint["model"]}  # the shapes must match, the data may differ
    note = (_load_pretrained if is_pretrained(src) else _load_weights)(src, model, model_fingerprint)
    record.initialized_from = str(src)
    line = f"initialised from {src} (step 0{'; ' + note if note else ''})"
    return RunStart("initial", line, 0, weights_from=Path(src))


#: What a start writes into its run folder besides checkpoints, set aside by ``job.rerun``. run_info.json moves last:
#: while it is there the folder still holds an earlier run, so an interrupted set-aside is finished by the next rerun.
EARLIER_RUN_ENTRIES = ("train.log", "config.toml", "tb", "wandb", "export", "profiler", RUN_INFO_FILE)


def must_set_aside(run_dir: Path, start: RunStart, rerun: bool, cfg: Checkpoint) -> str | None:
    """Why ``start`` must first move aside (:data:`EARLIER_RUN_ENTRIES`) an earlier run that left no checkpoint (a
    start from step 0 would append to its train.log and tb/), or None. ``rerun`` (``job.rerun``) asks for it; an
    unfinished earlier start that recorded no progress past where ``start`` begins (its run_info.json is the one
    written when it started) is set aside unasked when this start would have resumed a checkpoint (the same
    command again, after a stop before the first one); any other is a UserError."""
    if start.kind == "resume" or not (run_dir / RUN_INFO_FILE).exists():
        return None
    if rerun:
        return "job.rerun"
    RunLock(run_dir).check_free()  # a run still training there: say that, not that it stopped
    info = read_run_info(run_dir) or {}
    step, steps = info.get("step", "?"), info.get("steps", "?")
    finished = info.get("finished")
    if cfg.enabled and cfg.resume and not finished and step == start.step:  # written when it started, never after
        return "the earlier start recorded no progress: it stopped before its first complete checkpoint"
    what = f"a run finished at step {step}" if finished else f"an unfinished run (recorded at step {step} of {steps})"
    raise UserError(
        f"{run_dir} already holds {what} and no checkpoint to resume from: training again from step 0 would mix "
        "two runs in its train.log and tb/; use a new --job.name, or pass --job.rerun=true to start it again "
        f"(that run's files are moved into {run_dir}/previous-N/, nothing is deleted)"
    )


def _check_initial_load_is_this_runs(source: str | None, resume_point: Path) -> None:
    """A run that resumes its own checkpoint loads nothing from ``checkpoint.initial_load_path``: the option must
    name what the run started from (the same command again, e.g. a branched decay), else it would be dropped."""
    if not source:
        return
    started_from = read_meta(resume_point).get("initialized_from")
    if isinstance(started_from, str) and (started_from == source or Path(started_from).expanduser().resolve()
                                          == Path(source).expanduser().resolve()):
        return
    what = f"from {started_from}" if isinstance(started_from, str) else "without checkpoint.initial_load_path"
    raise UserError(
        f"checkpoint.initial_load_path {source} would not be loaded: {resume_point.parent.parent} resumes its own "
        f"checkpoint {resume_point.name}, and that run started {what}; drop the option to resume it, or use a new "
        "--job.name to start a run from it"
    )


def _continue(record: RunRecord, saved: RunRecord) -> None:
    """Take over the progress of the checkpoint the run continues (its data position is a function of the step)."""
    record.step, record.tokens_seen = saved.step, saved.tokens_seen
    record.skipped_steps = saved.skipped_steps
    record.initialized_from = saved.initialized_from  # the lineage goes on with the run


def _load_weights(path: str, model: nn.Module, model_fingerprint: dict[str, Any]) -> str:
    """Load only the weights of another run's DCP checkpoint; returns a note for the log: "", or what a query type
    other than the checkpoint's left out (as for a pretrained model: :func:`~torchnlq.interop.upcycle.weights_for`;
    DCP reads only the tensors asked for)."""
    saved = read_meta(path).get("fingerprint", {})
    run = ModelArgs.from_dict(model_fingerprint["model"])
    source = _saved_model(saved)
    if source is not None and anchored_from_linear(source, run):
        raise UserError(f"checkpoint.initial_load_path {path} is a DCP checkpoint, and {run.query.type!r} upcycles "
                        f"an export or a Hugging Face folder: export it first (python scripts/convert_checkpoint.py "
                        f"{path} EXPORT_FOLDER) and start from the export")
    replaced = source is not None and source.query.type != run.query.type  # the run's queries keep their init
    expected = {"model": {**model_fingerprint["model"], "query": saved["model"].get("query")}} if replaced else \
        model_fingerprint
    compare_fingerprints(saved, expected, f"checkpoint.initial_load_path {path}", loading=True)
    model_sd, _ = get_state_dict(model, [])
    if replaced:  # the run's own queries keep their init
        model_sd = {key: value for key, value in model_sd.items() if key not in query_tensors(run)}
    state = {MODEL_KEY: model_sd}
    try:
        load_dcp(state, path)  # never unpickles beyond DCP's metadata classes (safe_reader.py)
    except DCPReadError as e:
        raise UserError(f"could not load weights from {path}: {e} (is the model shape the same?)") from None
    set_state_dict(model, [], model_state_dict=state[MODEL_KEY], optim_state_dict={},
                   options=StateDictOptions(strict=not replaced))
    return replaced_query_note(source, run) if replaced else ""


def _saved_model(fingerprint: dict[str, Any]) -> ModelArgs | None:
    """The model a DCP checkpoint's fingerprint describes, or None where it does not read as one (then the
    fingerprints' comparison names what differs)."""
    try:
        return ModelArgs.from_dict(fingerprint["model"])
    except Exception:  # noqa: BLE001 - an older or damaged record: compared key by key instead
        return None


def _load_pretrained(path: str, model: nn.Module, model_fingerprint: dict[str, Any]) -> str:
    """Load an export or a Hugging Face folder into ``model``; returns a note for the log (an upcycled or replaced
    query: :func:`~torchnlq.interop.upcycle.weights_for`)."""
    weights = weights_for(path, ModelArgs.from_dict(model_fingerprint["model"]))
    compare_fingerprints({"model": weights.source.to_dict()}, {"model": weights.fits.to_dict()},
                         f"checkpoint.initial_load_path {path}", loading=True)
    set_state_dict(model, [], model_state_dict=weights.state, optim_state_dict={},
                   options=StateDictOptions(full_state_dict=True, strict=not weights.note))
    return weights.note


def initial_query_weights(
    cfg: Checkpoint, args: ModelArgs, seed: int
) -> tuple[dict[tuple[int, str], torch.Tensor] | None, str]:
    """The query matrices at this run's step 0 (the ``drift`` reference), rebuilt from the seeded CPU init and the
    initial load so that a resumed run measures from the same point; or None and why there is none (a DCP load, or
    an initial load no longer where it was: a run from a folder resumes without it)."""
    source = cfg.initial_load_path
    if source and not Path(source).exists():
        return None, f"the run's initial load {source} is no longer there (moved or deleted since the run started)"
    if source and not is_pretrained(source):
        return None, f"the run started from the DCP checkpoint {source}"
    state = reference_state_dict(args, seed)
    if source:
        state.update(weights_for(source, args).state)  # a replaced query's left out: its init
    with torch.device("meta"):
        reference = build_model(args)
    reference.load_state_dict(state, assign=True)
    return initial_matrices(reference), ""


def checkpoint_files(
    tokenizer: Mapping[str, Any], weights_from: Path | None, tiktoken_file: str | None, logger: logging.Logger,
    tokenizer_file: str | None = None,
) -> dict[str, bytes]:
    """The tokenizer files every checkpoint of the run carries, so generate.py and exports need no --tiktoken-file.

    A gpt2 run's ranks (found offline), an hf run's tokenizer.json (checked against the recorded sha256) with the
    tokenizer_config.json, special_tokens_map.json and chat template beside it.
    Files found nowhere are a warning, never a failure: checkpoints are saved without them.
    """
    if tokenizer.get("name") == "hf":
        try:
            # tokenizer.json, and its special tokens and chat template where the source folder has them
            return hf_tokenizer_files(tokenizer, weights_from, tokenizer_file)
        except UserError as e:
            logger.warning(f"warning: checkpoints will not carry the tokenizer.json ({e}); generate.py and exports "
                           "of them will need it copied in")
            return {}
    if tokenizer.get("name") != "gpt2":
        return {}
    # A damaged copy where the weights came from must not hide a good file elsewhere: then look again without it.
    sources = [weights_from, None] if weights_from is not None else [None]
    for source in sources:
        try:
            return {TOKENIZER_RANKS_FILE: find_gpt2_ranks(tokenizer, source, tiktoken_file)[0]}
        except UserError as e:
            error = e
    logger.warning(
        f"warning: checkpoints will not carry the gpt2 tokenizer ({error}); generate.py and exports "
        "of them will need the ranks file"
    )
    return {}
