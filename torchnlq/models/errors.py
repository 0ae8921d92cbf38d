"""The errors a user can cause, defined at the bottom of the package.

They live in the self-contained model package so that the model's own checks raise the same
classes in torchnlq (``torchnlq.errors`` re-exports them) and inside a Hugging Face export.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence


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
