"""``[job] plugins``: the user's own modules, imported before a config is checked.

A plugin registers query types or flavors from outside the package. Only the modules the user names
are imported: torchnlq never imports a module named in a file it reads, so loading a model runs no code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from torchnlq.errors import ConfigError


_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def import_plugins(names: list[str], option: str = "job.plugins") -> None:
    """Import each module in ``names`` (the working directory is searched too); one ConfigError if one is missing."""
    if not names:
        return
    for name in names:
        if not _MODULE_NAME.fullmatch(name):
            raise ConfigError(f"{option}: {name!r} is not a module name (such as my_queries or pkg.my_queries)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # `python scripts/x.py` puts scripts/ first, not the working directory
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
                raise  # the plugin itself imports something missing: its own traceback says what
            raise ConfigError(
                f"{option}: cannot import {name!r} (no module of that name); put its folder on PYTHONPATH "
                "or run from the folder that holds it"
            ) from None


def add_plugins_option(parser: argparse.ArgumentParser) -> None:
    """``--plugins MODULE[,MODULE]`` for the tools that load a model whose query type a plugin registers."""
    parser.add_argument(
        "--plugins", default="", metavar="MODULES",
        help="comma-separated modules to import first: those that registered the model's query type or flavor "
             "([job] plugins of its run); a model never names code to run by itself",
    )


def import_plugins_option(value: str) -> None:
    """Import the modules of a ``--plugins`` value."""
    import_plugins([part.strip() for part in value.split(",") if part.strip()], option="--plugins")
