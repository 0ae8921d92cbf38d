"""A mixture of token folders (``[[data.sources]]``): their checks, the seeded schedule and the validation sets.

Every training sequence of every step is drawn from one source by weight, then at a uniform offset inside that
source's train split, from one generator seeded by ``data.seed``: the table is drawn in full up front as
:class:`~torchnlq.data.batches.BatchSchedule` draws its own, and each sequence's two draws (its source, its offset)
are the generator's numbers at that sequence's position, so a batch is a pure function of (step, micro-step, rank)
whatever ``training.steps`` is: a longer run only adds rows, every world size reads the same global batch, and a
resume needs only the step. Validation evaluates a fixed set of ``validation.sequences`` windows of each source's
val split; the mixture's loss is their mean weighted as the training draws them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchnlq.config.job_config import Data, Validation
from torchnlq.data.batches import Batch, BatchSchedule, ValidationSet, open_token_files
from torchnlq.data.token_file import TokenFile, read_batch
from torchnlq.errors import UserError

#: What must be equal in every source's meta.json: one tokenizer gives one meaning to the ids.
SAME_TOKENIZER_KEYS = ("tokenizer", "vocab_size", "eot_id")


@dataclass
class Source:
    """One opened source: its name, weight, splits and meta.json."""

    name: str
    weight: float
    train: TokenFile
    val: TokenFile
    meta: dict[str, Any]


def source_name(name: str | None, path: str, index: int) -> str:
    """The name a source's validation loss is logged under (``loss/val/<name>``): its own, else its folder's."""
    return name or Path(path).expanduser().name or f"source{index}"


def open_sources(cfg: Data, seq_len: int) -> list[Source]:
    """Open every ``[[data.sources]]`` folder as ``data.path`` would be opened, and check they share a tokenizer."""
    if cfg.synthetic:
        raise UserError("data.synthetic = true writes one corpus at data.path; a mixture ([[data.sources]]) reads "
                        "folders prepared with scripts/prepare_data.py: drop data.synthetic")
    sources, names = [], set()
    for index, entry in enumerate(cfg.sources):
        if not entry.path:
            raise UserError(f"data.sources[{index}] has no path; give each source its token folder")
        name = source_name(entry.name, entry.path, index)
        if name in names:
            raise UserError(f"data.sources[{index}] is named '{name}' like another source; give each its own name "
                            "(they name the per-source validation losses)")
        names.add(name)
        try:
            train, val, meta = open_token_files(dataclasses.replace(cfg, path=entry.path, sources=[]), seq_len)
        except UserError as e:
            raise UserError(f"data.sources[{index}] ({name}): {e}") from None
        sources.append(Source(name, entry.weight, train, val, meta))
    first = sources[0]
    for source in sources[1:]:
        for key in SAME_TOKENIZER_KEYS:
            if source.meta.get(key) != first.meta.get(key):
                raise UserError(f"data.sources '{source.name}' has {key} = {source.meta.get(key)!r} but '{first.name}' "
                                f"has {first.meta.get(key)!r}: a mixture is of folders prepared with one tokenizer")
        ours, theirs = (_tokenizer_file(s.meta) for s in (source, first))
        if ours != theirs:
            raise UserError(f"data.sources '{source.name}' was tokenized with another tokenizer file ({ours}) than "
                            f"'{first.name}' ({theirs}): prepare them with the same one")
    return sources


def _tokenizer_file(meta: dict[str, Any]) -> str | None:
    """The sha256 of the tokenizer file a folder was made with (an hf tokenizer.json, tiktoken ranks), if recorded."""
    info = meta.get("tokenizer_info") if isinstance(meta.get("tokenizer_info"), dict) else {}
    return info.get("tokenizer_sha256") or info.get("tiktoken_sha256")


class MixtureSchedule(BatchSchedule):
    """:class:`BatchSchedule` over several sources: ``sources[s]`` names the source of each of step s's sequences,
    ``offsets[s]`` their start in that source's train split.

    The generator's numbers are taken in order, two per sequence (a uniform for the source, chosen where it falls
    among the weights' cumulative shares, and a uniform for the offset): sequence j of step s uses the numbers at
    positions ``2 (s * global_batch + j)`` and the one after, so row s is the same for any ``steps`` (torch fills a
    table in order, as the single folder's ``randint`` does). Drawn :data:`DRAW_SEQUENCES` at a time: the
    generator's stream does not depend on how it is cut, and the temporary stays small.
    """

    #: Names the draw in the fingerprint: the draw of torchnlq before issue 40 took every source first, so its
    #: offsets depended on ``training.steps``; a checkpoint of that draw cannot be continued with this one.
    DRAW = "mixture-v2 (source, offset) per position"
    DRAW_SEQUENCES = 2**20

    def __init__(self, lengths: list[int], weights: list[float], seq_len: int, steps: int, global_batch: int,
                 seed: int) -> None:
        short = [i for i, n in enumerate(lengths) if n < seq_len + 1]
        if short:
            raise UserError(f"data.sources[{short[0]}] holds {lengths[short[0]]:,} training tokens, fewer than one "
                            f"sequence of seq_len+1={seq_len + 1}")
        self.num_tokens, self.seq_len, self.steps = sum(lengths), seq_len, steps
        self.global_batch, self.seed, self.lengths, self.weights = global_batch, seed, lengths, weights
        share = torch.tensor(weights, dtype=torch.float64)
        cumulative = torch.cumsum(share / share.sum(), 0)
        # A uniform start in [0, length - seq_len) of the chosen source: the window of seq_len + 1 always fits.
        bounds = torch.tensor([n - seq_len for n in lengths], dtype=torch.float64)
        self.sources = torch.empty(steps, global_batch, dtype=torch.int32)
        self.offsets = torch.empty(steps, global_batch, dtype=torch.int64)
        g = torch.Generator().manual_seed(seed)
        rows = max(1, self.DRAW_SEQUENCES // global_batch)
        for first in range(0, steps, rows):
            last = min(steps, first + rows)
            u = torch.rand(last - first, global_batch, 2, dtype=torch.float64, generator=g)
            which = torch.searchsorted(cumulative, u[..., 0].contiguous(), right=True).clamp_(max=len(lengths) - 1)
            self.sources[first:last] = which
            self.offsets[first:last] = (u[..., 1] * bounds[which]).long()
        self._fingerprint = None

    def sources_for(self, step: int, micro_step: int, rank: int, world_size: int, micro_batch_size: int,
                    grad_accum_steps: int) -> torch.Tensor:
        """The source index of each sequence of :meth:`offsets_for`'s micro-batch."""
        self.check_layout(world_size, micro_batch_size, grad_accum_steps)
        start = (rank * grad_accum_steps + micro_step) * micro_batch_size
        return self.sources[step, start : start + micro_batch_size].long()

    def fingerprint(self) -> str:
        """What decides every row (the draw, its seed, each source's bound and weight, the global batch) and the
        first row: equal fingerprints mean the same sequences at every step both runs have, whatever their lengths."""
        if self._fingerprint is None:
            bounds = [n - self.seq_len for n in self.lengths]
            drawn_by = f"{self.DRAW};{self.seed},{bounds},{self.weights},{self.global_batch};"
            first = torch.cat([self.sources[0].long(), self.offsets[0]]).numpy().tobytes()
            self._fingerprint = hashlib.sha256(drawn_by.encode() + first).hexdigest()[:16]
        return self._fingerprint


def read_mixed_batch(sources: list[TokenFile], which: torch.Tensor, offsets: torch.Tensor, seq_len: int) -> Batch:
    """(x, y) of sequences whose source index is ``which`` and start ``offsets``: each source's rows read together."""
    x = torch.empty(len(offsets), seq_len, dtype=torch.long)
    y = torch.empty(len(offsets), seq_len, dtype=torch.long)
    for index in which.unique().tolist():
        rows = (which == index).nonzero().flatten()
        x[rows], y[rows] = read_batch(sources[index], offsets[rows], seq_len)
    return x, y


class MixtureValidation:
    """A fixed :class:`ValidationSet` per source; :meth:`parts_at` gives each with its name and weight."""

    def __init__(self, sources: list[Source], cfg: Validation, seq_len: int, micro_batch_size: int) -> None:
        if cfg.protocol == "paper":
            raise UserError("validation.protocol = 'paper' reads the paper's rows of one corpus; a mixture "
                            "([[data.sources]]) validates with validation.protocol = 'fixed'")
        self.sets = [(s.name, s.weight, ValidationSet(s.val, seq_len, cfg.sequences, micro_batch_size, cfg.seed))
                     for s in sources]
        self.micro_batch_size = micro_batch_size

    def parts_at(self, step: int) -> list[tuple[str, float, list[Batch]]]:
        """(name, weight, micro-batches) of every source: the same at every step."""
        return [(name, weight, vs.batches_at(step)) for name, weight, vs in self.sets]

    def batches_at(self, step: int) -> list[Batch]:
        """Every source's micro-batches, one after the other."""
        return [batch for _, _, batches in self.parts_at(step) for batch in batches]

    def __len__(self) -> int:
        return sum(len(vs) for _, _, vs in self.sets)

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches_at(0))

    def fingerprint(self) -> str:
        """Short sha256 of every source's name, weight and validation offsets."""
        digest = hashlib.sha256()
        for name, weight, vs in self.sets:
            digest.update(f"{name},{weight};".encode() + vs.offsets.numpy().tobytes())
        return digest.hexdigest()[:16]
