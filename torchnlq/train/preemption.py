"""SIGTERM/SIGINT: finish the current step, save, exit cleanly.

The handler only sets a flag, checked between steps. A second signal of the same kind kills a stuck run (not
under torchrun: its agent echoes the first signal to every worker and kills them itself on a timeout), except
while a checkpoint is being written (:meth:`PreemptionFlag.deferred`): then it waits until the save is complete,
and the run stops as the first signal asked. Any number of signals thus never cut a save in half.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import torch
import torch.distributed as dist


class PreemptionFlag:
    """Installs the handlers on creation (main thread only); ``requested()`` is checked per step."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._escalate = "TORCHELASTIC_RUN_ID" not in os.environ  # under torchrun, the agent escalates
        self._previous: dict[int, object] = {}
        self._received: set[int] = set()
        self._holding = 0  # deferred() blocks in progress
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = self.signal_name or signal.Signals(signum).name  # the stop is the first signal's
        self._received.add(signum)
        if not self._holding:
            self._arm(signum)

    def _arm(self, signum: int) -> None:
        """After a first signal: the next one of its kind stops the process at once (the default actions)."""
        if self._escalate and signum in self._previous:
            signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """While a checkpoint is written: signals only set the flag; the escalation of a second one waits."""
        self._holding += 1
        for sig in self._previous:
            signal.signal(sig, self._handle)
        try:
            yield
        finally:
            self._holding -= 1
            if not self._holding:
                for sig in self._received:
                    self._arm(sig)

    def requested(self, device: torch.device) -> bool:
        """True when any rank received a signal (an all-reduce when distributed, so all ranks agree)."""
        local = self.signal_name is not None
        if dist.is_available() and dist.is_initialized():
            t = torch.tensor([1.0 if local else 0.0], device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return bool(t.item() > 0)
        return local

    def restore(self) -> None:
        """Put back the handlers that were installed before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
