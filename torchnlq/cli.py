"""Shared entry-point behaviour: user errors become one line and exit code 2."""

from __future__ import annotations

import sys
from typing import Callable

from torchnlq.errors import UserError


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Call ``main(argv)``; a :class:`UserError` prints ``error: ...`` to stderr and returns 2."""
    args = sys.argv[1:] if argv is None else argv
    try:
        return main(args) or 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
