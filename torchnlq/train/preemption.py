"""SIGTERM/SIGINT: finish the current step, save, exit cleanly.

The handler only sets a flag, checked between steps. A second signal kills a stuck run (not under torchrun:
its agent echoes the first signal to every worker and kills them itself on a timeout).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

import torch
import torch.distributed as dist


class PreemptionFlag:
    """Installs the handlers on creation (main thread only); ``requested()`` is checked per step."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._escalate = "TORCHELASTIC_RUN_ID" not in os.environ  # under torchrun, the agent escalates
        self._previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name
        if self._escalate:
            signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler)

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
