"""What a run's data will hold in memory, bounded before any of it is allocated.

Each option is checked on its own (``training.steps >= 1``, ``validation.sequences >= 1``, ...), but together they
can ask for more than any machine has: the batch schedule holds every step's offsets (``steps x global batch``
int64), the validation set keeps its batches, the paper protocol two tables. Drawn as asked, such a run dies of a
``MemoryError`` (or the allocator's ``RuntimeError``) deep inside the schedule; :func:`check_data_fits_ram` says
which figure is too large and what to change instead, before anything is drawn or written, as
``models.config.LIMITS`` and ``parallel.device_memory.check_fits_device`` do for model shapes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from torchnlq.config.job_config import Data, Training, Validation
from torchnlq.errors import UserError

GIB = 2**30
#: int64 offsets, int32 source indices (a mixture), and the float64 pair per sequence a mixture draws from.
OFFSET_BYTES, SOURCE_BYTES, MIXTURE_DRAW_BYTES = 8, 4, 16
#: The paper protocol's tables have this many rows (data/batches.py: PAPER_EVALUATION_ROWS; not imported: batches
#: imports this module).
PAPER_ROWS = 600


@dataclass(frozen=True)
class Allocation:
    """One thing the data side allocates: what it is, its size, and the options that decide it."""

    what: str
    nbytes: int
    fix: str


def machine_ram_bytes() -> int | None:
    """The machine's physical memory (None when the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def planned_allocations(data: Data, training: Training, validation: Validation, world_size: int) -> list[Allocation]:
    """What :func:`torchnlq.data.loader.build_data` will allocate in one process, from the config alone."""
    global_batch = training.global_batch(world_size)
    sequences = training.steps * global_batch
    sources = max(1, len(data.sources))
    mixture = len(data.sources) > 0
    per_sequence = OFFSET_BYTES + (SOURCE_BYTES if mixture else 0)
    draw = min(sequences, 2**20) * MIXTURE_DRAW_BYTES if mixture else 0  # drawn in chunks (data/mixture.py)
    layout = (f"training.steps={training.steps:,} x {global_batch:,} sequences per step (micro_batch_size "
              f"{training.micro_batch_size} x grad_accum_steps {training.grad_accum_steps} x {world_size} "
              "processes)")
    window = training.seq_len + 1
    # read_batch: the window buffer (at most 4 bytes a token) and the int64 windows, then x and y copied out.
    micro = training.micro_batch_size * window * (4 + 8) + 2 * training.micro_batch_size * training.seq_len * 8
    val_micro = validation.micro_batch_size or training.micro_batch_size
    kept = validation.sequences * training.seq_len * 16 + validation.sequences * OFFSET_BYTES  # x, y int64 + offsets
    if validation.protocol == "paper":  # two tables of a row per validation, read again at each
        kept = 2 * PAPER_ROWS * validation.sequences * OFFSET_BYTES + val_micro * window * 12
    return [
        Allocation(f"the batch schedule ({layout})", sequences * per_sequence + draw,
                   "lower training.steps, or the batch (training.micro_batch_size, training.grad_accum_steps)"),
        Allocation(f"a training micro-batch ({training.micro_batch_size:,} sequences of {window:,} tokens)", micro,
                   "lower training.micro_batch_size (and raise training.grad_accum_steps to keep the batch)"),
        Allocation(f"the validation set ({validation.sequences:,} sequences of {training.seq_len:,} tokens"
                   + (f", for each of {sources} sources" if mixture else "") + ")", kept * sources,
                   "lower validation.sequences"),
    ]


def check_data_fits_ram(data: Data, training: Training, validation: Validation, world_size: int) -> None:
    """UserError naming the largest allocation and its options when the data side alone would not fit the RAM."""
    ram = machine_ram_bytes()
    planned = planned_allocations(data, training, validation, world_size)
    total = sum(a.nbytes for a in planned)
    if ram is None or total <= ram:
        return
    largest = max(planned, key=lambda a: a.nbytes)
    raise UserError(f"{largest.what} takes {largest.nbytes / GIB:,.1f} GiB of memory ({total / GIB:,.1f} GiB for the "
                    f"data in all), more than this machine's {ram / GIB:,.1f} GiB; {largest.fix}")
