"""Pieces of the training-step benchmark that are not about timing: random data, the read timer, memory, logs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchnlq.data import token_format as fmt
from torchnlq.data.loader import MicroBatchSource
from torchnlq.data.tokenizer import BASE_VOCAB_SIZE

RANDOM_CORPUS_TOKENS = {"train": 4_000_000, "val": 100_000}


def write_random_corpus(folder: Path, tokenizer: str) -> Path:
    """A data folder of uniformly random tokens for ``tokenizer`` (what the model sees is irrelevant for speed)."""
    vocab = BASE_VOCAB_SIZE[tokenizer]
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    temps = {}
    for split, n in RANDOM_CORPUS_TOKENS.items():
        temps[split] = fmt.temp_name(fmt.split_file(folder, split))
        fmt.write_tokens(temps[split], n, [rng.integers(0, vocab, n, dtype=np.uint16)])
    info = {"name": tokenizer, "vocab_size": vocab, "eot_id": vocab - 1}
    fmt.commit(folder, temps, fmt.make_meta(info, RANDOM_CORPUS_TOKENS, {s: 1 for s in temps}, {"kind": "bench"}))
    return folder


class TimedLoader:
    """Wraps a trainer's loader: times each micro-batch's read and its host-to-device copy.

    The wrapper does the copy (timed with CUDA events), so the trainer's own ``.to(device)`` is a no-op.
    """

    def __init__(self, inner: MicroBatchSource, device: torch.device) -> None:
        self.inner, self.device = inner, device
        self.seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def reset(self) -> None:
        """Forget what was timed so far (call before each step)."""
        self.seconds, self._events = 0.0, []

    def total(self) -> float:
        """Seconds of reading and copying since :meth:`reset` (call after the step has synchronized)."""
        return self.seconds + sum(a.elapsed_time(b) for a, b in self._events) / 1000.0

    def micro_batches(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The inner loader's micro-batches, each read (and copied) under the timer."""
        batches = iter(self.inner.micro_batches(step))
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                return
            self.seconds += time.perf_counter() - t0
            if self.device.type == "cuda":
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                end.record()
                self._events.append((begin, end))
            yield x, y


def tensor_bytes(tensors: Any) -> int:
    """Bytes held by tensors, counting a tensor subclass (torchao's 8-bit states) by its inner tensors."""
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if hasattr(t, "__tensor_flatten__") and type(t) is not torch.nn.Parameter:
            names, _ = t.__tensor_flatten__()
            total += tensor_bytes(getattr(t, name) for name in names)
        else:
            total += t.numel() * t.element_size()
    return total


def quiet_trainer_logs() -> None:
    """Keep only warnings of the ``torchnlq`` logger, on stderr: the benchmark prints one table."""
    logger = logging.getLogger("torchnlq")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
