"""The root of a torchnlq checkout, not a package: Python imports it as ``torchnlq`` only when it runs in the folder
above a clone named ``torchnlq`` (the working directory comes first on sys.path).

Then every entry of the package (``import torchnlq``, ``torchnlq.load_pretrained``, ``import torchnlq.hf``,
``python -m torchnlq.train``) meets this file first. When the installed torchnlq is this checkout's own package
(``pip install -e`` of it), that package is imported in its place, so nothing is shadowed; when it is another copy,
or none is installed, the import ends in one line saying so, instead of a namespace package without attributes.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent


def _installed_spec() -> ModuleSpec | None:
    """The spec of the torchnlq package installed elsewhere (an editable finder's or a sys.path entry's), or None."""
    above = _CHECKOUT.parent
    for finder in sys.meta_path:
        if finder is PathFinder:  # the sys.path entries, but not the folder this checkout lies in
            spec = PathFinder.find_spec(__name__, [p for p in sys.path if Path(p or ".").resolve() != above])
        elif hasattr(finder, "find_spec"):
            spec = finder.find_spec(__name__, None)
        else:
            continue
        if spec is not None and spec.origin and Path(spec.origin).resolve() != Path(__file__).resolve():
            return spec
    return None


def _import_in_place() -> None:
    """Import the installed package as ``torchnlq`` when it is this checkout's own; else one ImportError line."""
    spec = _installed_spec()
    installed = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    if spec is None or spec.loader is None or installed != _CHECKOUT / "torchnlq":
        where = f"the installed torchnlq package ({installed})" if installed else "torchnlq (none is installed)"
        raise ImportError(f"a local folder '{_CHECKOUT}' shadows {where}: Python imports it as torchnlq; run Python "
                          "from another folder or rename that one")
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module  # the import statement returns what sys.modules holds once this file has run
    spec.loader.exec_module(module)


if __name__ == "torchnlq":
    _import_in_place()
