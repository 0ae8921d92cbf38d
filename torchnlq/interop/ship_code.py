"""The code a ``--format hf`` export carries: the model package's own files, the wrapper, and plugins.

``trust_remote_code`` loads ``modeling_torchnlq.py`` and the flat siblings it imports, so every file of
``torchnlq/models/`` is copied (``__init__.py`` as ``torchnlq_models.py``) and ``from torchnlq.models[.x]
import`` is rewritten to them. A plugin that registered the model's query type or block family travels too,
and may import only ``__future__``, the standard library, torch and ``torchnlq.models`` (else one refusal line).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import torchnlq.models as model_package
from torchnlq.errors import UserError
from torchnlq.models.config import PRENORM
from torchnlq.models.query import QUERY_TYPES
from torchnlq.models.registry import BLOCKS

MODELS_DIR = Path(model_package.__file__).parent
WRAPPER_SOURCE = Path(__file__).with_name("modeling_torchnlq.py")
#: The export's name of ``torchnlq/models/__init__.py`` (a flat folder has no packages).
PACKAGE_FILE = "torchnlq_models.py"
PLUGIN_MARKER = "# torchnlq-export: plugin imports"
_IMPORT = re.compile(r"^(\s*)from torchnlq\.models(\.(\w+))? import", re.MULTILINE)


def _flat_imports(source: str) -> str:
    """``from torchnlq.models import`` -> ``from .torchnlq_models import``; ``.models.x`` -> ``from .x``."""
    return _IMPORT.sub(lambda m: f"{m.group(1)}from .{m.group(3) or PACKAGE_FILE[:-3]} import", source)


def _imports(source: str) -> list[tuple[str, bool]]:
    """(module, written as ``from ... import``) for every import of ``source``; relative ones keep their dots."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, False) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append(("." * node.level + (node.module or ""), True))
    return found


def _plugin_file(what: str, module: str) -> tuple[str, str]:
    """(export file name, rewritten source) of the plugin module that defines ``what`` (e.g. "query type 'x'")."""
    fix = "or export with --format safetensors"
    loaded = sys.modules.get(module)
    path = getattr(loaded, "__file__", None)
    if module == "__main__" or path is None or not str(path).endswith(".py"):
        raise UserError(
            f"{what} is defined in {module!r}, not in a module file the export can carry; "
            f"define it in a .py module named by [job] plugins, {fix}"
        )
    source = Path(path).read_text(encoding="utf-8")
    # What a shipped plugin cannot import: all but the standard library, torch and ``from torchnlq.models``.
    allowed = ("torch", "__future__", *sys.stdlib_module_names)
    foreign = [name for name, is_from in _imports(source) if name.split(".")[0] not in allowed
               and not (is_from and (name == "torchnlq.models" or name.startswith("torchnlq.models.")))]
    if foreign:
        raise UserError(
            f"{what} comes from {path}, which imports {', '.join(sorted(set(foreign)))}: an export "
            f"carries a plugin only when it imports nothing but torch, torchnlq.models and the standard library; "
            f"move what it needs into that module, {fix}"
        )
    return f"plugin_{module.rsplit('.', 1)[-1]}.py", _flat_imports(source)


def export_code(query_type: str, block: str = PRENORM) -> dict[str, str]:
    """Every code file of an export of a model with ``query_type`` and ``block`` family: name -> source."""
    files: dict[str, str] = {}
    for path in sorted(MODELS_DIR.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        if any(name.startswith("torchnlq") for name, _ in _imports(source)):  # it must stay self-contained
            raise RuntimeError(f"{path} imports torchnlq by name; the model package imports itself relatively")
        files[PACKAGE_FILE if path.name == "__init__.py" else path.name] = source
    wrapper = _flat_imports(WRAPPER_SOURCE.read_text(encoding="utf-8"))
    for what, cls in ((f"query type {query_type!r}", QUERY_TYPES[query_type]), (f"block family {block!r}", BLOCKS[block])):
        if cls.__module__.startswith(model_package.__name__ + "."):
            continue
        name, source = _plugin_file(what, cls.__module__)  # a plugin registered it
        stem = name[:-3]
        if name not in files:
            wrapper = wrapper.replace(PLUGIN_MARKER, f"from .{stem} import __name__ as _{stem}  # registers {what}\n"
                                      + PLUGIN_MARKER)
        files[name] = source
    files["modeling_torchnlq.py"] = wrapper
    return files
