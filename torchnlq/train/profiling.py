"""torch.profiler traces of the steps ``[profiling]`` picks, and CUDA memory snapshots, in ``<run>/profiler/``.

Steps count as the logs do (from 1, across resumes): ``ProfilerStep#N`` is the step logged as N, and
``steps-A-B/`` holds the traces (one per rank) of steps A to B. How to read them: docs/performance.md, "Profiling".
"""

from __future__ import annotations

import pickle
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from torchnlq.config.job_config import Profiling
from torchnlq.files import make_folder, replace_file

#: Allocation events the memory history keeps (the oldest are dropped): a few steps of a large model.
MEMORY_HISTORY_ENTRIES = 100_000
MEMORY_VIEWER = "https://pytorch.org/memory_viz"


class Profiler:
    """The run's profiler: off unless ``profiling.enabled`` (traces) or ``memory_snapshot`` (CUDA) is set."""

    def __init__(self, cfg: Profiling, folder: Path, rank: int, device: torch.device,
                 report: Callable[[str], None]) -> None:
        self.cfg, self.folder, self.rank, self.report = cfg, folder, rank, report
        self.cuda = device.type == "cuda"
        self.memory = cfg.memory_snapshot and self.cuda  # preflight refuses it on a CPU
        self._profile: torch.profiler.profile | None = None
        self._first = 1  # the first step this session runs
        self._stepping = False  # inside profile.step(): its step counter is already one ahead

    def start(self, done: int) -> None:
        """Before the loop, ``done`` steps into the run: start the memory history and the trace schedule."""
        self._first = done + 1
        if self.memory:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        if not self.cfg.enabled:
            return
        c = self.cfg
        # skip_first=1: the schedule's step 0 is never run, its cycle starts at the run's step 1.
        schedule = torch.profiler.schedule(wait=c.wait, warmup=c.warmup, active=c.active, repeat=c.repeat, skip_first=1)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._profile = torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self._save_trace, record_shapes=True
        )
        # The step about to run is the run's step done + 1 (a resume starts mid-run), as torchtitan does.
        self._profile.step_num, self._profile.current_action = self._first, schedule(self._first)
        self._profile.start()

    def step_done(self, last: bool) -> None:
        """After each step: move the schedule on (not after the last step: it would mark a step never run)."""
        if self._profile is not None and not last:
            self._stepping = True
            try:
                with warnings.catch_warnings():  # about its in-memory tables, which a saved trace does not need
                    warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
                    self._profile.step()
            finally:
                self._stepping = False

    def stop(self) -> None:
        """After the loop, also on an error or a preemption: save a window cut short, stop the memory history."""
        if self._profile is not None:
            profile, self._profile = self._profile, None
            profile.stop()
        if self.memory:
            torch.cuda.memory._record_memory_history(enabled=None)

    def out_of_memory(self, done: int) -> None:
        """The step after ``done`` (or its validation, its checkpoint) ran out of memory: save the snapshot of why."""
        if self.memory:
            self._save_memory_snapshot(self.folder / f"oom-after-step-{done}", f"out of memory after step {done}")
        elif self.cuda:
            self.report(f"out of memory after step {done}: --profiling.memory_snapshot=true records what filled the "
                        "memory (docs/performance.md)")

    def _save_trace(self, profile: torch.profiler.profile) -> None:
        """on_trace_ready: ``steps-A-B/rank<R>.pt.trace.json``, the chrome trace of the window just recorded."""
        last = profile.step_num - 1 if self._stepping else profile.step_num
        c = self.cfg
        into_cycle = (last - 1) % (c.wait + c.warmup + c.active)
        first = max(last - (into_cycle - c.wait - c.warmup), self._first)
        folder = make_folder(self.folder / f"steps-{first}-{last}")
        trace = folder / f"rank{self.rank}.pt.trace.json"
        # torch writes the file itself: into a private folder, then through files.py (no link followed).
        with tempfile.TemporaryDirectory(prefix="torchnlq-trace-") as tmp:
            written = Path(tmp) / trace.name
            profile.export_chrome_trace(str(written))
            replace_file(trace, written.read_bytes())
        self.report(f"profiler trace of steps {first}-{last}: {trace} (open it in https://ui.perfetto.dev)")
        if self.memory:
            self._save_memory_snapshot(folder, f"steps {first}-{last}")

    def _save_memory_snapshot(self, folder: Path, what: str) -> None:
        """``rank<R>.memory.pickle``: the allocator's state and recent history (written, never read, by torchnlq)."""
        path = make_folder(folder) / f"rank{self.rank}.memory.pickle"
        replace_file(path, pickle.dumps(torch.cuda.memory._snapshot()))
        self.report(f"memory snapshot of {what}: {path} (drag it into {MEMORY_VIEWER})")
