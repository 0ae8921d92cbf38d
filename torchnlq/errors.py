"""Errors a user can cause (config, paths, data, devices).

Entry points catch :class:`UserError` and print its message as one line with a
non-zero exit, no traceback: the message itself must say what is wrong and how
to fix it.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Sequence
from pathlib import Path


class UserError(Exception):
    """A mistake in the user's input, reported as one line without a traceback."""


class ConfigError(UserError):
    """An invalid configuration: unknown key, wrong type, out-of-range value."""


def closest(name: str, choices: Sequence[str]) -> str | None:
    """The choice most like ``name`` (for a "did you mean"), or None when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_choice(key: str, value: str, choices: Sequence[str]) -> ConfigError:
    """The ConfigError for a name that is not in its registry, with a did-you-mean when one is close."""
    match = closest(value, choices)
    hint = f"; did you mean {match!r}?" if match else ""
    return ConfigError(f"{key}: unknown {value!r}{hint} (choices: {', '.join(sorted(choices))})")


def script_command(args: str) -> str:
    """``python ARGS`` spelled so that it works when pasted into the user's shell.

    run_train.sh installs torchnlq into ``.venv`` without activating it in the user's
    shell, where a bare ``python scripts/...`` cannot import torchnlq. A hint printed
    from such an unactivated virtual environment therefore names its interpreter
    (``.venv/bin/python``, relative to the working directory when it lies below it).
    """
    in_venv = sys.prefix != sys.base_prefix
    activated = os.environ.get("VIRTUAL_ENV") and Path(os.environ["VIRTUAL_ENV"]).resolve() == Path(sys.prefix).resolve()
    if not in_venv or activated:
        return f"python {args}"
    python = Path(sys.prefix) / "bin" / "python"
    try:
        python = python.relative_to(Path.cwd())
    except ValueError:
        pass
    return f"{python} {args}"
