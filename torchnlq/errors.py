"""Errors a user can cause (config, paths, data, devices).

Entry points catch :class:`UserError` and print its message as one line with a
non-zero exit, no traceback: the message itself must say what is wrong and how
to fix it.
"""


class UserError(Exception):
    """A mistake in the user's input, reported as one line without a traceback."""


class ConfigError(UserError):
    """An invalid configuration: unknown key, wrong type, out-of-range value."""
