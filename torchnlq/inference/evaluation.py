"""Validation loss of a checkpoint or export (library code behind ``scripts/evaluate.py``).

The windows are those the run validated on (its ``seq_len`` and ``validation`` settings) and the
loss is the trainer's own, so on the same data folder it equals the ``val_loss`` the run logged.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from torchnlq.checkpoint.record import RunRecord, ValidationRecord
from torchnlq.config.job_config import SEED_MAX, Data, Validation
from torchnlq.data import token_format as fmt
from torchnlq.data.batches import PAPER_EVALUATION_ROWS, PaperValidationRows, ValidationSet, open_token_files
from torchnlq.errors import UserError
from torchnlq.interop.load import LoadedModel, as_loaded
from torchnlq.train.validate import evaluate

# Used only when the source records no validation settings (e.g. a hand-made export).
FALLBACK_MICRO_BATCH_SIZE = 8


@dataclass
class ValidationSettings:
    """The four numbers that fix the validation windows and their grouping."""

    seq_len: int
    sequences: int
    micro_batch_size: int
    seed: int


@dataclass
class EvalResult(ValidationSettings):
    """Mean and std of the micro-batch losses, perplexity = exp(mean), and what was evaluated."""

    val_loss: float
    val_loss_std: float
    perplexity: float
    tokens: int

    def lines(self) -> list[str]:
        """The report, one ``name: value`` per line."""
        return [
            f"val_loss: {self.val_loss:.6f}",
            f"val_loss_std: {self.val_loss_std:.6f}" if math.isfinite(self.val_loss_std)
            else "val_loss_std: n/a (one micro-batch)",
            f"perplexity: {self.perplexity:.6f}",
            f"sequences: {self.sequences}",
            f"tokens: {self.tokens}",
        ]


def resolve_settings(
    loaded: LoadedModel,
    sequences: int | None = None,
    micro_batch_size: int | None = None,
    seed: int | None = None,
    seq_len: int | None = None,
) -> ValidationSettings:
    """Explicit values win; otherwise the run's recorded ``seq_len`` and ``validation`` settings."""
    record = loaded.record
    recorded = record.validation or ValidationRecord(seed=None, sequences=None, micro_batch_size=None)
    seq_len = seq_len if seq_len is not None else (record.seq_len or loaded.args.max_seq_len)
    sequences = sequences if sequences is not None else recorded.sequences
    if sequences is None:
        raise UserError(f"'{loaded.path}' records no validation settings; pass --sequences N")
    # An explicit 0 is a mistake to report, not "unset": test for None, not for truth.
    micro = micro_batch_size if micro_batch_size is not None else (
        recorded.micro_batch_size or min(sequences, FALLBACK_MICRO_BATCH_SIZE)
    )
    seed = seed if seed is not None else (recorded.seed if recorded.seed is not None else Validation().seed)
    for name, value in (("--seq-len", seq_len), ("--sequences", sequences), ("--micro-batch-size", micro)):
        if value < 1:
            raise UserError(f"{name}={value} must be at least 1")
    if not 0 <= seed <= SEED_MAX:
        raise UserError(f"--seed={seed} must be in 0..{SEED_MAX} (what torch's generators take)")
    if seq_len > loaded.args.max_seq_len:
        raise UserError(f"--seq-len={seq_len} exceeds the model's max_seq_len={loaded.args.max_seq_len}")
    # evaluate_source builds every batch (inputs and targets, int64) before the first forward, and the paper
    # protocol's two tables of offsets (int64, a row per validation): bounded by the RAM.
    from torchnlq.parallel.device_memory import device_memory_bytes

    tables = 16 * PAPER_EVALUATION_ROWS * sequences if recorded.protocol == "paper" else 0
    needed, ram = 16 * sequences * seq_len + tables, device_memory_bytes(torch.device("cpu"))
    if ram is not None and needed > ram:
        raise UserError(f"--sequences={sequences} of {seq_len} tokens take {needed / 2**30:,.1f} GiB as validation "
                        f"batches, more than this machine's {ram / 2**30:,.1f} GiB of memory; lower --sequences")
    return ValidationSettings(int(seq_len), int(sequences), int(micro), int(seed))


def check_same_ranks(tokenizer: dict[str, Any], data_meta: dict[str, Any], data_dir: str | Path) -> None:
    """UserError when the model and the data both record their .tiktoken ranks' (gpt2) or tokenizer.json's (hf)
    sha256 and the two differ: ids of another vocabulary under the same name would give a meaningless loss."""
    info = data_meta.get("tokenizer_info")
    for key, what in (("tiktoken_sha256", ".tiktoken ranks"), ("tokenizer_sha256", "a tokenizer.json")):
        model_sha = tokenizer.get(key)
        data_sha = info.get(key) if isinstance(info, dict) else None
        if isinstance(model_sha, str) and isinstance(data_sha, str) and model_sha != data_sha:
            raise UserError(
                f"data '{data_dir}' was tokenized with {what} of sha256 {data_sha[:16]}... but the model with "
                f"{model_sha[:16]}...; evaluate on data prepared with the model's tokenizer"
            )


def check_ids_fit_model(batches: list[tuple[torch.Tensor, torch.Tensor]], vocab_size: int, data_dir: str | Path,
                        model: str | Path) -> None:
    """UserError when a token id of the batches (inputs or targets) has no row in the model's embedding of
    ``vocab_size`` rows: data of another vocabulary (a model that records no tokenizer, a hand-made export), which
    the embedding would meet as an IndexError. Checked once, on the very ids the model is about to see."""
    largest = max((int(torch.maximum(x.max(), y.max())) for x, y in batches if x.numel()), default=-1)
    if largest >= vocab_size:
        raise UserError(f"data '{data_dir}' holds token id {largest:,} but the model '{model}' has {vocab_size:,} "
                        "token ids (0 to {:,}): the data was tokenized for another vocabulary; evaluate on data "
                        "prepared with the model's tokenizer".format(vocab_size - 1))


def evaluation_autocast(record: RunRecord, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """The autocast the run validated under: bf16 on CUDA when it computed in bf16, else none (fp32, as on a CPU)."""
    if device.type == "cuda" and record.mixed_precision == "bf16":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def evaluate_source(
    source: str | Path | LoadedModel,
    data_dir: str | Path,
    sequences: int | None = None,
    micro_batch_size: int | None = None,
    seed: int | None = None,
    seq_len: int | None = None,
    device: str = "cpu",
) -> EvalResult:
    """Loss and perplexity of a checkpoint/export on ``data_dir``'s validation windows, as its run drew them."""
    loaded = as_loaded(source, device)
    settings = resolve_settings(loaded, sequences, micro_batch_size, seed, seq_len)
    folder = Path(data_dir).expanduser()
    tokenizer = loaded.tokenizer.get("name")
    data_tokenizer = fmt.read_meta(folder)["tokenizer"] if (folder / fmt.META_NAME).is_file() else None
    if tokenizer is None:
        tokenizer = data_tokenizer  # the model records none: trust the data
    elif data_tokenizer not in (None, tokenizer):  # said here: the data's own message names a training option
        raise UserError(f"'{data_dir}' was tokenized with '{data_tokenizer}' (meta.json) but the model uses the "
                        f"'{tokenizer}' tokenizer; evaluate on a data folder prepared with '{tokenizer}' "
                        f"(scripts/prepare_data.py --tokenizer {tokenizer})")
    # open_token_files checks the folder is complete and tokenized with the model's tokenizer.
    data_cfg = Data(path=str(data_dir), tokenizer=tokenizer or "gpt2")
    train, val, data_meta = open_token_files(data_cfg, settings.seq_len)
    check_same_ranks(loaded.tokenizer, data_meta, data_dir)
    recorded = loaded.record.validation
    if recorded is not None and recorded.protocol == "paper" and recorded.interval and loaded.record.step is not None:
        # The run validated on the paper's row of each step: evaluate the row of this checkpoint's step.
        rows = PaperValidationRows(len(train), val, settings.seq_len, settings.sequences, settings.micro_batch_size,
                                   settings.seed, recorded.interval)
        batches = rows.batches_at(loaded.record.step)
    else:
        batches = list(ValidationSet(val, settings.seq_len, settings.sequences, settings.micro_batch_size,
                                     settings.seed))
    check_ids_fit_model(batches, loaded.args.vocab_size, data_dir, loaded.path)
    model_device = loaded.model.tok_emb.weight.device
    mean, std = evaluate(loaded.model, batches, model_device, evaluation_autocast(loaded.record, model_device))
    return EvalResult(
        **asdict(settings),
        val_loss=mean,
        val_loss_std=std,
        perplexity=math.exp(mean) if mean < 700 else math.inf,  # exp overflows a float past ~709
        tokens=settings.sequences * settings.seq_len,
    )
