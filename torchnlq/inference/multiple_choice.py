"""Multiple-choice evaluation of a saved model in the HellaSwag format (library code behind ``evaluate.py
--multiple-choice``). The reading and the scoring are :mod:`torchnlq.train.downstream`'s, which a run also uses in
its loop (``[downstream]``): the same numbers for the same weights.
"""

from __future__ import annotations

from pathlib import Path

from torchnlq.errors import UserError
from torchnlq.inference.sampling import model_tokenizer
from torchnlq.interop.load import LoadedModel, as_loaded
from torchnlq.train.downstream import (  # noqa: F401 - the names evaluate.py and the lm-eval adapter use
    DEFAULT_BATCH_SIZE,
    ChoiceRow,
    ContinuationScore,
    MultipleChoiceResult,
    encode_row,
    pick,
    read_rows,
    score_continuations,
    score_rows,
)


def evaluate_multiple_choice(
    source: str | Path | LoadedModel,
    path: str | Path,
    limit: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "cpu",
    tiktoken_file: str | None = None,
) -> MultipleChoiceResult:
    """Accuracy (raw and length-normalised) of a checkpoint or export on a HellaSwag-format file (read first)."""
    if batch_size < 1:
        raise UserError(f"--batch-size={batch_size} must be at least 1")
    rows = read_rows(path, limit)
    loaded = as_loaded(source, device)
    tokenizer = model_tokenizer(loaded, tiktoken_file)
    return score_rows(loaded.model, tokenizer, rows, batch_size)
