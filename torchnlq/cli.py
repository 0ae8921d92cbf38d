"""Shared entry-point behaviour: user errors become one line and exit code 2.

Under ``torchnlq.train.launch``, a worker leaves its ``error:`` line, traceback or clean stop in
the launcher's folder (``TORCHNLQ_LAUNCH_DIR``) instead: the launcher shows the first, since the
other ranks then fail in their collectives with tracebacks that say nothing about the cause.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

from torchnlq.errors import UserError

LAUNCH_DIR_ENV = "TORCHNLQ_LAUNCH_DIR"


def tell_launcher(kind: str, text: str) -> bool:
    """Leave ``text`` for the launcher as ``<kind>-rank<RANK>.txt``; False when not under the launcher."""
    folder = os.environ.get(LAUNCH_DIR_ENV)
    if not folder or not Path(folder).is_dir():
        return False
    path = Path(folder) / f"{kind}-rank{os.environ.get('RANK', '0')}.txt"
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # the launcher never reads half a line
    except OSError:
        return False
    return True


class ArgumentParser(argparse.ArgumentParser):
    """argparse with torchnlq's one-line mistakes: a bad command line raises :class:`UserError` (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help)")


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Call ``main(argv)``; a :class:`UserError` prints ``error: ...`` to stderr and returns 2."""
    args = sys.argv[1:] if argv is None else argv
    try:
        return main(args) or 0
    except UserError as e:
        if not tell_launcher("error", str(e)):
            print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:
        if tell_launcher("crash", traceback.format_exc()):
            return 1
        raise
