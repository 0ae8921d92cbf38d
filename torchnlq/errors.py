"""Errors a user can cause (config, paths, data, devices).

Entry points print a :class:`UserError` as one line with a non-zero exit, no traceback: the message
itself must say what is wrong and how to fix it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Defined in the model package (the bottom layer, shipped inside exports); one class everywhere.
from torchnlq.models.errors import ConfigError, UserError, closest, unknown_choice

__all__ = ["ConfigError", "UserError", "closest", "script_command", "unknown_choice"]


def script_command(args: str) -> str:
    """``python ARGS`` spelled so that it works when pasted into the user's shell.

    run_train.sh installs torchnlq into ``.venv`` without activating it, where a bare ``python`` cannot
    import torchnlq: from such a venv the hint names its interpreter (``.venv/bin/python``).
    """
    in_venv = sys.prefix != sys.base_prefix
    activated = (os.environ.get("VIRTUAL_ENV")
                 and Path(os.environ["VIRTUAL_ENV"]).resolve() == Path(sys.prefix).resolve())
    if not in_venv or activated:
        return f"python {args}"
    python = Path(sys.prefix) / "bin" / "python"
    try:
        python = python.relative_to(Path.cwd())
    except ValueError:
        pass
    return f"{python} {args}"
