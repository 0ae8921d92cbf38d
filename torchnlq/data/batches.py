"""Token files, the pre-drawn batch schedule and the fixed validation set.

The paper draws all training offsets in advance from one seeded generator
(``randint(len(train) - 1024, (steps, 480))``, seed 42). :class:`BatchSchedule` is that
table, sliced per rank: a batch is a pure function of (step, micro_step, rank), so any
world size reads the same global batch and resuming needs only the step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from torchnlq.config.job_config import Data, Training, Validation
from torchnlq.data import token_format as fmt
from torchnlq.data.synthetic import ensure_synthetic_corpus
from torchnlq.data.token_file import TokenFile, read_batch
from torchnlq.data.tokenizer import read_tokenizer_json
from torchnlq.errors import UserError, script_command


#: The overrides that train on the seeded offline corpus instead, whatever the config's tokenizer and data.path.
SYNTHETIC_OVERRIDES = "--data.synthetic=true --data.tokenizer=byte --data.path=./outputs/data/synthetic"


def _prepare_hint(folder: Path, tokenizer: str) -> str:
    args = (f"--out {folder} --files YOUR_TEXT.txt --text-split paragraph --val-fraction 0.1 --tokenizer {tokenizer}"
            + (" --tokenizer-file TOKENIZER.json" if tokenizer == "hf" else ""))
    return (
        f"prepare it with: {script_command(f'scripts/prepare_data.py {args}')} (any text file; the README's "
        f"quickstart; OpenWebText: docs/data.md), or train on the offline synthetic corpus: {SYNTHETIC_OVERRIDES}"
    )


def open_token_files(cfg: Data, seq_len: int) -> tuple[TokenFile, TokenFile, dict[str, Any]]:
    """Open ``cfg.path``'s train.bin and val.bin and check them against the config (UserError if they do not fit)."""
    folder = Path(cfg.path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UserError(
            f"data.path '{cfg.path}' is a file, not a data folder; point data.path at the folder that holds "
            "train.bin, val.bin and meta.json"
        )
    if cfg.synthetic:
        ensure_synthetic_corpus(folder)
    if not folder.is_dir():
        raise UserError(f"data.path '{cfg.path}' does not exist; {_prepare_hint(folder, cfg.tokenizer)}")
    missing = [n for n in (fmt.META_NAME, *(f"{s}.bin" for s in fmt.SPLITS)) if not (folder / n).is_file()]
    if missing:
        raise UserError(
            f"data.path '{cfg.path}' lacks {', '.join(missing)} (not prepared, or interrupted); "
            + _prepare_hint(folder, cfg.tokenizer)
        )
    meta = fmt.read_meta(folder)
    if meta["tokenizer"] != cfg.tokenizer:
        raise UserError(
            f"data.path '{cfg.path}' was tokenized with '{meta['tokenizer']}' (meta.json) but data.tokenizer is "
            f"'{cfg.tokenizer}'; set data.tokenizer = \"{meta['tokenizer']}\" or prepare the data again"
        )
    dtype = fmt.token_dtype(meta, folder / fmt.META_NAME)
    check_same_tokenizer_file(cfg, meta)
    fmt.verify_files(folder, meta, full=cfg.verify_content)
    files = []
    for split in fmt.SPLITS:
        tf = TokenFile(fmt.split_file(folder, split), dtype)
        expected = meta.get("tokens", {}).get(split)
        if expected is not None and expected != len(tf):
            raise UserError(
                f"{tf.path} has {len(tf):,} tokens but meta.json says {expected:,}; the folder is inconsistent, "
                "prepare it again"
            )
        _check_token_ids(tf, meta)
        if len(tf) < seq_len + 1:
            raise UserError(
                f"{tf.path} has {len(tf):,} tokens, fewer than one sequence of seq_len+1={seq_len + 1}; "
                "use more data (e.g. a larger --val-fraction) or a smaller training.seq_len"
            )
        files.append(tf)
    return files[0], files[1], meta


def check_same_tokenizer_file(cfg: Data, meta: dict[str, Any]) -> None:
    """An ``hf`` data folder must have been tokenized with the tokenizer.json and end-of-text the config names.

    meta.json records the file's sha256 and the eot token; another file (or an edited one) gives other ids
    under the same name, and another eot other document boundaries: both are refused, not trained on.
    """
    if cfg.tokenizer != "hf":
        return
    info = meta.get("tokenizer_info") if isinstance(meta.get("tokenizer_info"), dict) else {}
    recorded = info.get("tokenizer_sha256")
    if cfg.tokenizer_file and isinstance(recorded, str):
        ours = hashlib.sha256(read_tokenizer_json(cfg.tokenizer_file, "data.tokenizer_file")).hexdigest()
        if ours != recorded:
            raise UserError(
                f"data.path '{cfg.path}' was tokenized with a tokenizer.json of sha256 {recorded[:16]}... (meta.json) "
                f"but data.tokenizer_file '{cfg.tokenizer_file}' has sha256 {ours[:16]}...; point data.tokenizer_file "
                "at the file the data was prepared with, or prepare the data again"
            )
    eot = info.get("eot_token")
    if cfg.eot_token is not None and isinstance(eot, str) and eot != cfg.eot_token:
        raise UserError(
            f"data.path '{cfg.path}' separates documents with {eot!r} (meta.json) but data.eot_token is "
            f"{cfg.eot_token!r}; set data.eot_token = {eot!r} (or leave it unset), or prepare the data again"
        )


def _check_token_ids(tokens: TokenFile, meta: dict[str, Any]) -> None:
    """Token ids (meta.json's largest, and a sample of the file) must be below the tokenizer's vocabulary."""
    vocab = meta["vocab_size"]
    split = tokens.path.stem
    recorded = (meta.get("max_token_id") or {}).get(split)
    largest = max(tokens.sampled_max(), recorded if isinstance(recorded, int) else -1)
    if largest >= vocab:
        raise UserError(
            f"{tokens.path} holds token id {largest}, but its tokenizer '{meta['tokenizer']}' has only {vocab} ids "
            "(meta.json): the file is damaged or was written with another tokenizer; prepare it again"
        )


Batch = tuple[torch.Tensor, torch.Tensor]


def _fingerprint(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


def _read_micro_batches(tokens: TokenFile, offsets: torch.Tensor, micro: int, seq_len: int) -> list[Batch]:
    return [read_batch(tokens, offsets[i : i + micro], seq_len) for i in range(0, len(offsets), micro)]


class BatchSchedule:
    """Every training batch's start offsets, drawn once from a seeded generator.

    ``offsets[s]`` (int64, ``global_batch`` entries) is step s's global batch. Extending
    ``steps`` keeps the earlier rows (torch fills the table in order).
    """

    def __init__(self, num_tokens: int, seq_len: int, steps: int, global_batch: int, seed: int):
        if num_tokens < seq_len + 1:
            raise UserError(f"{num_tokens:,} training tokens are fewer than one sequence of seq_len+1={seq_len + 1}")
        self.num_tokens, self.seq_len, self.steps = num_tokens, seq_len, steps
        self.global_batch, self.seed = global_batch, seed
        g = torch.Generator().manual_seed(seed)
        # high = num_tokens - seq_len: the window [o, o + seq_len + 1) always fits.
        self.offsets = torch.randint(num_tokens - seq_len, (steps, global_batch), generator=g)
        self._fingerprint: str | None = None

    def check_layout(self, world_size: int, micro_batch_size: int, grad_accum_steps: int) -> None:
        """Error unless micro_batch_size x grad_accum_steps x world_size equals the global batch."""
        n = micro_batch_size * grad_accum_steps * world_size
        if n != self.global_batch:
            raise UserError(
                f"micro_batch_size={micro_batch_size} x grad_accum_steps={grad_accum_steps} x world_size={world_size} "
                f"= {n} sequences, but the batch schedule draws {self.global_batch} per step; "
                "change training.micro_batch_size or training.grad_accum_steps so the product matches"
            )

    def offsets_for(
        self, step: int, micro_step: int, rank: int, world_size: int, micro_batch_size: int, grad_accum_steps: int
    ) -> torch.Tensor:
        """Start offsets (LongTensor[micro_batch_size]) of one rank's micro-batch: a slice of row ``step``."""
        self.check_layout(world_size, micro_batch_size, grad_accum_steps)
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} outside the schedule's 0..{self.steps - 1}")
        if not 0 <= micro_step < grad_accum_steps or not 0 <= rank < world_size:
            raise IndexError(f"micro_step {micro_step} / rank {rank} outside {grad_accum_steps} / {world_size}")
        start = (rank * grad_accum_steps + micro_step) * micro_batch_size
        return self.offsets[step, start : start + micro_batch_size].clone()

    def fingerprint(self) -> str:
        """Short sha256 of what decides every row of the table (the generator's seed, the draw's bound and the
        global batch) and of its first row: equal fingerprints mean identical data order, step for step, whatever
        each run's length (a longer run's table only adds rows: branched decays of different lengths share it)."""
        if self._fingerprint is None:
            drawn_by = f"{self.seed},{self.num_tokens - self.seq_len},{self.global_batch};".encode()
            first = self.offsets[0].contiguous().numpy().tobytes()
            self._fingerprint = hashlib.sha256(drawn_by + first).hexdigest()[:16]
        return self._fingerprint


def build_batch_schedule(train: TokenFile, training: Training, data: Data, world_size: int = 1) -> BatchSchedule:
    """The schedule for a run: global batch = micro_batch_size x grad_accum_steps x world_size."""
    global_batch = training.global_batch(world_size)
    return BatchSchedule(len(train), training.seq_len, training.steps, global_batch, data.seed)


# The paper's evaluation tables have 600000 // 1000 rows (Generate_Indices.ipynb). Fixed: the
# row count is part of the draw (the validation table follows the train one from one generator).
PAPER_EVALUATION_ROWS = 600


class ValidationSet:
    """A fixed set of validation windows drawn once from ``seed``, identical for every model and evaluation."""

    def __init__(self, val: TokenFile, seq_len: int, sequences: int, micro_batch_size: int, seed: int):
        self.val, self.seq_len, self.micro_batch_size, self.seed = val, seq_len, micro_batch_size, seed
        g = torch.Generator().manual_seed(seed)
        self.offsets = torch.randint(len(val) - seq_len, (sequences,), generator=g)
        self._batches: list[Batch] | None = None

    def __len__(self) -> int:
        """Number of micro-batches."""
        return -(-len(self.offsets) // self.micro_batch_size)

    def __iter__(self) -> Iterator[Batch]:
        return iter(_read_micro_batches(self.val, self.offsets, self.micro_batch_size, self.seq_len))

    def batches_at(self, step: int) -> list[Batch]:
        """The micro-batches to evaluate after ``step``: always the same ones (read once, kept in memory)."""
        if self._batches is None:
            self._batches = list(self)
        return self._batches

    def fingerprint(self) -> str:
        """Short sha256 of the validation offsets."""
        return _fingerprint(self.offsets)


class PaperValidationRows:
    """The paper's validation protocol: after step s, row s // interval of a seeded table.

    The paper's notebook draws two ``rows x sequences`` tables from one generator, the train
    split's first (its ``eval_train`` rows), then the validation split's. Both are evaluated on the
    same row; the train table's bound (``train_tokens``) decides how far it advances the generator.
    """

    def __init__(
        self, train_tokens: int, val: TokenFile, seq_len: int, sequences: int, micro_batch_size: int, seed: int,
        interval: int, rows: int = PAPER_EVALUATION_ROWS, train: TokenFile | None = None,
    ):
        self.val, self.train, self.seq_len, self.micro_batch_size = val, train, seq_len, micro_batch_size
        self.seed, self.interval, self.rows = seed, interval, rows
        g = torch.Generator().manual_seed(seed)
        self.train_offsets = torch.randint(train_tokens - seq_len, (rows, sequences), generator=g)  # eval_train
        self.offsets = torch.randint(len(val) - seq_len, (rows, sequences), generator=g)

    def row_at(self, step: int) -> int:
        """The table row evaluated after ``step``; a step past the table is a UserError."""
        row = step // self.interval
        if row >= self.rows:
            raise UserError(
                f"validation.protocol = 'paper' has {self.rows} rows, one per validation.interval={self.interval} "
                f"steps, so it covers steps below {self.rows * self.interval:,} (step {step:,} needs row {row}); "
                "raise validation.interval or use validation.protocol = 'fixed'"
            )
        return row

    def batches_at(self, step: int) -> list[Batch]:
        """The micro-batches of the row evaluated after ``step`` (read from the token file each time)."""
        return _read_micro_batches(self.val, self.offsets[self.row_at(step)], self.micro_batch_size, self.seq_len)

    def train_batches_at(self, step: int) -> list[Batch]:
        """The same row of the eval_train table, read from the train split: the paper's train-loss estimate."""
        if self.train is None:
            raise ValueError("PaperValidationRows was built without the train split's file")
        return _read_micro_batches(self.train, self.train_offsets[self.row_at(step)], self.micro_batch_size,
                                   self.seq_len)

    def __len__(self) -> int:
        """Micro-batches per evaluation."""
        return -(-self.offsets.shape[1] // self.micro_batch_size)

    def fingerprint(self) -> str:
        """Short sha256 of the whole validation table (every row a run may evaluate)."""
        return _fingerprint(self.offsets)


def build_validation_set(
    val: TokenFile, cfg: Validation, seq_len: int, default_micro_batch_size: int, train: TokenFile | None = None,
) -> ValidationSet | PaperValidationRows:
    """The run's validation batches; ``cfg.protocol = "paper"`` needs ``train`` (the split of its eval_train rows)."""
    micro = cfg.micro_batch_size or default_micro_batch_size
    if cfg.protocol == "paper":
        return PaperValidationRows(len(train), val, seq_len, cfg.sequences, micro, cfg.seed, cfg.interval, train=train)
    return ValidationSet(val, seq_len, cfg.sequences, micro, cfg.seed)
