"""Shared entry-point behaviour: user errors become one line and exit code 2.

Under ``torchnlq.train.launch`` (multi-process runs), a worker does not print its ``error:``
line: it leaves it in the launcher's folder (``TORCHNLQ_LAUNCH_DIR``), and the launcher prints
the first one once, instead of torchrun's multi-rank failure report. A worker's traceback is
handed over too, because when one rank stops, the others fail in their next collective with
tracebacks of their own that say nothing about the cause: the launcher shows the first. A clean
stop on a signal is handed over the same way, so the launcher can exit 0 with the resume hint.
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
    """argparse with torchnlq's one-line mistakes: a bad command line raises :class:`UserError`.

    argparse's own report is a usage block and a ``prog: error:`` line on stderr; under
    :func:`run_cli` this parser's mistakes are one ``error: ...`` line (naming ``--help``
    for the usage) and exit code 2 like every other mistake.
    """

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
