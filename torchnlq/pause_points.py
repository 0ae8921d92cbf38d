"""Named moments where a fault test can hold a running trainer, to signal or kill it exactly there.

A test sets ``TORCHNLQ_PAUSE_AT=name:step`` (e.g. ``save:8``; several separated by commas: ``step:1,save:1``) and
``TORCHNLQ_PAUSE_DIR``; a process reaching that moment writes its pid to ``<dir>/<name>-<step>-rank<R>`` and
sleeps ``TORCHNLQ_PAUSE_SECONDS`` (default 3); with ``TORCHNLQ_PAUSE_ONCE=1`` a moment whose marker is already
there passes (a retry of a killed run goes by). In a real run a pause point is one environment lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def pause_point(name: str, step: int) -> None:
    """Hold here for a while if the environment asks for ``name`` at ``step`` (fault tests only)."""
    wanted = os.environ.get("TORCHNLQ_PAUSE_AT")
    if not wanted or f"{name}:{step}" not in wanted.split(","):
        return
    folder = Path(os.environ["TORCHNLQ_PAUSE_DIR"])
    marker = folder / f"{name}-{step}-rank{os.environ.get('RANK', '0')}"
    if os.environ.get("TORCHNLQ_PAUSE_ONCE") == "1" and marker.exists():
        return
    # Whole or absent: a test that sees the marker reads the pid at once (a plain write is empty for a moment).
    partial = folder.parent / f".{folder.name}-{marker.name}.partial"
    partial.write_text(str(os.getpid()))
    os.replace(partial, marker)
    time.sleep(float(os.environ.get("TORCHNLQ_PAUSE_SECONDS", "3")))
