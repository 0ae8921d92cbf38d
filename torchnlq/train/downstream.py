"""Multiple-choice tasks in the HellaSwag format: reading, scoring (nanoGPT's rule) and the in-loop evaluation.

A task is a local JSON-lines file with HellaSwag's fields (docs/checkpoints.md, "Multiple choice"). The scoring
here is the one ``evaluate.py --multiple-choice`` runs on a saved model (torchnlq/inference/multiple_choice.py)
and the one a run runs every ``downstream.interval`` steps (:class:`Downstream`): the same numbers for the same
weights.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from torchnlq.config.every import Every
from torchnlq.config.job_config import Downstream as DownstreamConfig
from torchnlq.data.tokenizer import Tokenizer
from torchnlq.errors import UserError
from torchnlq.models.decoder import Decoder

DEFAULT_BATCH_SIZE = 16  # sequences per forward; the logits take batch x seq x vocab x 4 bytes
_ASCII_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class ChoiceRow:
    """One multiple-choice question: its context, the candidate endings, the right one, its line."""

    context: str
    endings: list[str]
    label: int
    line: int


@dataclass(frozen=True)
class ContinuationScore:
    """The log-likelihood (sum over ``tokens``) of a continuation given its context."""

    logprob: float
    tokens: int
    greedy: bool  # every token is the model's argmax
    truncated: bool = False  # the context was cut from the left


@dataclass
class MultipleChoiceResult:
    """Accuracies over the rows, and what each row's endings scored."""

    acc: float
    acc_norm: float
    rows: int
    endings: int
    tokens: int
    truncated: int
    scores: list[list[ContinuationScore]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The report, one ``name: value`` per line."""
        counts = (f"{k}: {getattr(self, k)}" for k in ("rows", "endings", "tokens", "truncated"))
        return [f"acc: {self.acc:.6f}", f"acc_norm: {self.acc_norm:.6f}", *counts]


def _row_error(path: Path, line: int, what: str) -> UserError:
    return UserError(f"'{path}' line {line}: {what}")


def parse_row(obj: object, path: Path, line: int) -> ChoiceRow:
    """One decoded JSON value -> a :class:`ChoiceRow`; anything else is a UserError naming the line."""
    if not isinstance(obj, dict):
        raise _row_error(path, line, f"expected a JSON object, got {type(obj).__name__}")
    if "ctx" in obj:
        context = obj["ctx"]
        if not isinstance(context, str):
            raise _row_error(path, line, "'ctx' must be a string")
    elif "ctx_a" in obj:
        ctx_a, ctx_b = obj["ctx_a"], obj.get("ctx_b", "")
        if not isinstance(ctx_a, str) or not isinstance(ctx_b, str):
            raise _row_error(path, line, "'ctx_a' and 'ctx_b' must be strings")
        context = f"{ctx_a} {ctx_b}" if ctx_b else ctx_a
    else:
        raise _row_error(path, line, "no context: give 'ctx' (or 'ctx_a' and 'ctx_b')")
    endings = obj.get("endings")
    if not isinstance(endings, list) or len(endings) < 2 or not all(isinstance(e, str) for e in endings):
        raise _row_error(path, line, "'endings' must be a list of at least two strings")
    blank = next((i for i, e in enumerate(endings) if not e.strip()), None)
    if blank is not None:  # it would be scored as the lone space token before it
        raise _row_error(path, line, f"ending {blank} is {'empty' if not endings[blank] else 'only whitespace'}; "
                                     "every ending must hold text")
    if "label" not in obj:
        raise _row_error(path, line, "no 'label' (the index of the right ending)")
    label = obj["label"]
    # An integer, or a string of ASCII digits ("2", as some HellaSwag copies write it): not str.isdigit(), which
    # also takes "²" and other digits int() reads otherwise or not at all. bool is an int in Python; a label of
    # true is a mistake, not ending 1.
    if isinstance(label, str) and _ASCII_DIGITS.fullmatch(label.strip(" \t")):
        label = int(label.strip(" \t"))
    if isinstance(label, bool) or not isinstance(label, int):
        raise _row_error(path, line, f"'label' must be an integer, got {json.dumps(obj['label'])[:40]}")
    if not 0 <= label < len(endings):
        raise _row_error(path, line, f"'label' is {label} but the row has {len(endings)} endings "
                                     f"(0..{len(endings) - 1})")
    return ChoiceRow(context, list(endings), label, line)


def read_rows(path: str | Path, limit: int | None = None) -> list[ChoiceRow]:
    """The first ``limit`` rows (all when None) of a HellaSwag-format JSON-lines file; blank lines are skipped."""
    if limit is not None and limit < 1:
        raise UserError(f"--limit={limit} must be at least 1 (leave it unset for every row)")
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"multiple-choice file '{path}' does not exist")
    if not p.is_file():
        raise UserError(f"multiple-choice file '{path}' is not a file (give a .jsonl file)")
    rows: list[ChoiceRow] = []
    with p.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if limit is not None and len(rows) >= limit:
                break
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _row_error(p, number, "not UTF-8 text") from None
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise _row_error(p, number, f"not valid JSON ({e.msg}, column {e.colno})") from None
            rows.append(parse_row(obj, p, number))
    if not rows:
        raise UserError(f"multiple-choice file '{path}' holds no rows (one JSON object per line)")
    return rows


def encode_row(tokenizer: Tokenizer, row: ChoiceRow) -> tuple[list[int], list[list[int]]]:
    """The context's tokens (end-of-text when empty) and each ending's tokens, by the HellaSwag rule."""
    context = tokenizer.encode(row.context) or [tokenizer.eot_id]
    return context, [tokenizer.encode(" " + ending) for ending in row.endings]


def _prepare(context: Sequence[int], continuation: Sequence[int], max_len: int) -> tuple[list[int], bool]:
    """The model input for one request: context + continuation minus the last token, cut to max_len from the left."""
    if not context:
        raise ValueError("a continuation needs at least one context token (use end-of-text)")
    if len(continuation) > max_len:
        raise UserError(
            f"a continuation of {len(continuation)} tokens does not fit the model's context "
            f"(max_seq_len={max_len}); it needs at least one token before it"
        )
    whole = list(context) + list(continuation)
    truncated = len(whole) > max_len + 1
    # Keep the last max_len + 1 tokens: every continuation token keeps its prediction position.
    return whole[-(max_len + 1):][:-1], truncated


@torch.inference_mode()
def score_continuations(
    model: Decoder,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    batch_size: int = DEFAULT_BATCH_SIZE,
    vocab_limit: int | None = None,
) -> list[ContinuationScore]:
    """Log-likelihood of each ``(context ids, continuation ids)`` pair (context not empty), in request order.

    Batches are right-padded (the model is causal); ``vocab_limit`` bounds only the argmax behind ``greedy``.
    """
    if batch_size < 1:
        raise UserError(f"batch size {batch_size} must be at least 1")
    max_len = model.args.max_seq_len
    device = model.tok_emb.weight.device
    results: list[ContinuationScore | None] = [None] * len(requests)
    prepared: dict[int, tuple[list[int], bool]] = {}
    for i, (ctx, cont) in enumerate(requests):
        if cont:
            prepared[i] = _prepare(ctx, cont, max_len)
        else:  # nothing to score: probability 1, and nothing for greedy decoding to miss
            results[i] = ContinuationScore(0.0, 0, True)
    order = sorted(prepared, key=lambda i: -len(prepared[i][0]))
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            batch = pad_sequence([torch.tensor(prepared[i][0], dtype=torch.long) for i in chunk], batch_first=True)
            logits = model(batch.to(device))
            for b, i in enumerate(chunk):
                ids, truncated = prepared[i]
                cont = list(requests[i][1])
                # The continuation's tokens are the last len(cont) of ids[1:] + [last]: predicted at
                # input positions len(ids) - len(cont) .. len(ids) - 1.
                rows = logits[b, len(ids) - len(cont): len(ids)].float()
                target = torch.tensor(cont, device=rows.device)
                logprobs = F.log_softmax(rows, dim=-1).gather(1, target[:, None]).squeeze(1)
                best = rows[:, :vocab_limit].argmax(dim=-1) if vocab_limit else rows.argmax(dim=-1)
                results[i] = ContinuationScore(
                    float(logprobs.sum()), len(cont), bool((best == target).all()), truncated
                )
    finally:
        model.train(was_training)
    return [r for r in results if r is not None]


def pick(scores: Sequence[ContinuationScore], normalise: bool) -> int:
    """The index of the best ending: largest sum, or largest mean per token; the first of ties."""
    values = [s.logprob / s.tokens if normalise else s.logprob for s in scores]
    return max(range(len(values)), key=lambda i: (values[i], -i))


def score_rows(
    model: Decoder, tokenizer: Tokenizer, rows: Sequence[ChoiceRow], batch_size: int = DEFAULT_BATCH_SIZE
) -> MultipleChoiceResult:
    """Score every ending of every row (all in one batched pass) and count the right picks (``rows`` not empty)."""
    encoded = [encode_row(tokenizer, row) for row in rows]
    requests = [(context, ending) for context, endings in encoded for ending in endings]
    flat = score_continuations(model, requests, batch_size, vocab_limit=tokenizer.vocab_size)
    bounds = itertools.accumulate((len(row.endings) for row in rows), initial=0)
    scores = [flat[start:stop] for start, stop in itertools.pairwise(bounds)]
    return MultipleChoiceResult(
        acc=sum(pick(s, normalise=False) == r.label for s, r in zip(scores, rows)) / len(rows),
        acc_norm=sum(pick(s, normalise=True) == r.label for s, r in zip(scores, rows)) / len(rows),
        rows=len(rows),
        endings=len(flat),
        tokens=sum(s.tokens for s in flat),
        truncated=sum(any(s.truncated for s in row_scores) for row_scores in scores),
        scores=scores,
    )




class Downstream:
    """The run's multiple-choice tasks: read once (``downstream.max_examples`` rows each), scored when due; every
    rank scores every row (FSDP's forwards need all ranks), rank 0 logs."""

    def __init__(self, cfg: DownstreamConfig, validation_interval: int, tokenizer: Tokenizer | None,
                 autocast: Callable[[], contextlib.AbstractContextManager]) -> None:
        self.interval = cfg.interval or validation_interval
        self.batch_size, self.autocast, self.tokenizer = cfg.batch_size, autocast, tokenizer
        self.tasks = {task_name(path): read_rows(path, cfg.max_examples) for path in cfg.tasks}
        self.schedule = Every(self.interval if self.tasks else 0)

    def describe(self) -> str:
        """What one evaluation scores, for the run's header (its cost: the endings scored, one sequence each)."""
        endings = sum(len(row.endings) for rows in self.tasks.values() for row in rows)
        listed = ", ".join(f"{name} ({len(rows)} rows)" for name, rows in self.tasks.items())
        return f"every {self.interval} steps: {listed}; {endings:,} endings scored per evaluation"

    def run(self, model: Decoder) -> dict[str, float]:
        """``{"downstream/<task>/acc": ..., "downstream/<task>/acc_norm": ...}`` of ``model`` now, in eager mode (the
        compiled blocks would recompile for every batch shape)."""
        assert self.tokenizer is not None
        out: dict[str, float] = {}
        start = time.perf_counter()
        with self.autocast(), torch.compiler.set_stance("force_eager"):
            for name, rows in self.tasks.items():
                result = score_rows(model, self.tokenizer, rows, self.batch_size)
                out[f"downstream/{name}/acc"] = result.acc
                out[f"downstream/{name}/acc_norm"] = result.acc_norm
        out["downstream/seconds"] = time.perf_counter() - start
        return out


def task_name(path: str) -> str:
    """A task's name in the logs: its file name without the extension."""
    return Path(path).name.split(".")[0] or "task"
