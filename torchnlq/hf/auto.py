"""Register torchnlq's transformers classes with the Auto API, once transformers is imported.

After :func:`register`, ``AutoConfig`` knows ``model_type: "torchnlq"`` and
``AutoModelForCausalLM.from_pretrained(folder)`` builds a
:class:`~torchnlq.hf.modeling_torchnlq.TorchnlqForCausalLM` for a ``--format hf`` export, without
``trust_remote_code``: the classes are torchnlq's own installed code, not the folder's copy.

``import torchnlq`` calls :func:`register_when_transformers_loads`, which must not import
transformers itself (that costs seconds, and most uses of torchnlq never need it):

* transformers already imported: register now;
* transformers installed but not imported: a one-shot import hook (:class:`_RegisterAfterImport`)
  registers right after ``import transformers`` finishes, whoever imports it;
* transformers not installed: nothing.

A failure to register is a warning, never an error of ``import torchnlq`` or ``import transformers``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

_TRANSFORMERS = "transformers"


def register() -> None:
    """Register TorchnlqConfig (model_type "torchnlq") and TorchnlqForCausalLM with the Auto classes; idempotent."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from torchnlq.hf.modeling_torchnlq import TorchnlqConfig, TorchnlqForCausalLM

    # exist_ok: a second call (or a re-import) replaces the entry with the same classes.
    AutoConfig.register(TorchnlqConfig.model_type, TorchnlqConfig, exist_ok=True)
    AutoModelForCausalLM.register(TorchnlqConfig, TorchnlqForCausalLM, exist_ok=True)


def _register_or_warn() -> None:
    try:
        register()
    except Exception as e:  # noqa: BLE001 - any failure (an old transformers, a broken install) must not break imports
        warnings.warn(
            f"torchnlq could not register its Hugging Face classes with transformers ({type(e).__name__}: {e}); "
            "AutoModelForCausalLM will not know model_type 'torchnlq' (trust_remote_code=True still loads an export)",
            RuntimeWarning,
            stacklevel=2,
        )


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that lets ``transformers`` import as usual, then registers.

    Asked for the top-level ``transformers`` module, it finds the module's spec through the
    other finders and wraps only the spec's loader, so that registration runs right after the
    package's ``__init__`` has executed; the wrapper then removes this finder (one shot). A mere
    probe (``importlib.util.find_spec("transformers")``, as many libraries do to test for it)
    executes nothing, so the finder stays for the real import. Every other name, transformers'
    submodules included, is left to the normal finders.
    """

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TRANSFORMERS:
            return None
        for finder in sys.meta_path:  # what importlib would find without this finder
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenRegister(spec.loader, self)
                return spec
        return None

    def uninstall(self) -> None:
        """Leave ``sys.meta_path`` (no-op when already gone)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class _ThenRegister(importlib.abc.Loader):
    """Delegates to the real loader, then registers once the module has executed."""

    def __init__(self, loader: importlib.abc.Loader, finder: _RegisterAfterImport) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps the real loader (importlib.resources and friends ask it), not this wrapper.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.finder.uninstall()  # one shot: the package is being imported now
        self.loader.exec_module(module)
        _register_or_warn()


def register_when_transformers_loads() -> None:
    """Register now if transformers is imported, after its import if it is installed, else do nothing."""
    if _TRANSFORMERS in sys.modules:
        _register_or_warn()
        return
    if any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        return  # already waiting (torchnlq imported twice, e.g. after a reload)
    try:
        installed = importlib.util.find_spec(_TRANSFORMERS) is not None  # locates, imports nothing
    except (ImportError, ValueError):
        installed = False
    if installed:
        sys.meta_path.insert(0, _RegisterAfterImport())
