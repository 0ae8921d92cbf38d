"""The code a ``--format hf`` export carries: the model package's own files, the wrapper, and plugins.

``trust_remote_code`` loads ``modeling_torchnlq.py`` and the flat siblings it imports (one folder, no packages),
so every file of ``torchnlq/models/`` is copied under a flat name (``__init__.py`` as ``torchnlq_models.py``; a
family folder's ``dense/block.py`` as ``dense_block.py``, its ``__init__.py`` as ``dense.py``) and every import of
them is rewritten to that name. A plugin that registered the model's query type or family travels too, and may
import only ``__future__``, the standard library, torch and ``torchnlq.models`` (else one refusal line).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import torchnlq.models as model_package
from torchnlq.errors import UserError
from torchnlq.models.config import DENSE
from torchnlq.models.family import FAMILIES
from torchnlq.models.query import QUERY_TYPES

MODELS_DIR = Path(model_package.__file__).parent
WRAPPER_SOURCE = Path(__file__).with_name("modeling_torchnlq.py")
#: The export's name of ``torchnlq/models/__init__.py`` (a flat folder has no packages).
PACKAGE_FILE = "torchnlq_models.py"
PLUGIN_MARKER = "# torchnlq-export: plugin imports"
_ABSOLUTE = re.compile(r"^(\s*)from torchnlq\.models((?:\.\w+)*) import", re.MULTILINE)
_RELATIVE = re.compile(r"^(\s*)from (\.+)((?:\w+)(?:\.\w+)*)? import", re.MULTILINE)


def flat_name(parts: list[str]) -> str:
    """The export's module name of ``torchnlq.models.<parts...>`` (a package by its folder's name)."""
    return "_".join(parts) if parts else PACKAGE_FILE[:-3]


def _flat_imports(source: str, package: list[str] | None = None) -> str:
    """``source`` with its imports of the model package rewritten to the export's flat modules: ``from
    torchnlq.models.x.y import`` (any file), and relative ones of a file of the package ``package`` (its folder
    below torchnlq/models, as parts; None: not a file of the model package)."""
    source = _ABSOLUTE.sub(lambda m: f"{m.group(1)}from .{flat_name(m.group(2).split('.')[1:])} import", source)
    if package is None:
        return source

    def relative(m: re.Match) -> str:
        level, module = len(m.group(2)), m.group(3)
        if level - 1 > len(package):
            raise RuntimeError(f"a relative import climbs out of torchnlq/models: {m.group(0)!r}")
        target = package[: len(package) - (level - 1)] + (module.split(".") if module else [])
        if not module and package:
            raise RuntimeError(f"'from . import' inside torchnlq/models/{'/'.join(package)} cannot be flattened")
        return f"{m.group(1)}from .{flat_name(target)} import" if target else m.group(0)

    return _RELATIVE.sub(relative, source)


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


def model_package_files() -> dict[str, str]:
    """Every file of torchnlq/models/ under its flat export name, its imports rewritten: name -> source."""
    files: dict[str, str] = {}
    for path in sorted(MODELS_DIR.rglob("*.py")):
        parts = list(path.relative_to(MODELS_DIR).with_suffix("").parts)
        package = parts[:-1]  # the folder of the file, below torchnlq/models
        module = package if parts[-1] == "__init__" else parts
        source = path.read_text(encoding="utf-8")
        if any(name.startswith("torchnlq") for name, _ in _imports(source)):  # it must stay self-contained
            raise RuntimeError(f"{path} imports torchnlq by name; the model package imports itself relatively")
        name = flat_name(module) + ".py"
        if name in files:
            raise RuntimeError(f"{path} and another file of torchnlq/models/ both flatten to {name}")
        files[name] = _flat_imports(source, package)
    return files


def export_code(query_type: str, family: str = DENSE) -> dict[str, str]:
    """Every code file of an export of a model with ``query_type`` of ``family``: name -> source."""
    files = model_package_files()
    wrapper = _flat_imports(WRAPPER_SOURCE.read_text(encoding="utf-8"))
    for what, cls in ((f"query type {query_type!r}", QUERY_TYPES[query_type]),
                      (f"model family {family!r}", FAMILIES[family].block)):
        if cls.__module__.startswith(model_package.__name__ + "."):
            continue
        name, source = _plugin_file(what, cls.__module__)  # a plugin registered it
        stem = name[:-3]
        if name not in files:
            wrapper = wrapper.replace(PLUGIN_MARKER, f"from .{stem} import __name__ as _{stem}  # registers {what}\n"
                                      + PLUGIN_MARKER)
        files[name] = source
    files["modeling_torchnlq.py"] = wrapper
    return _imported_from(files, "modeling_torchnlq.py")


def _imported_from(files: dict[str, str], start: str) -> dict[str, str]:
    """The files ``start`` imports, directly or through each other: what transformers' ``save_pretrained`` copies
    again, so that an export and a re-saved copy hold the same files (e.g. not the trainer's MoE statistics)."""
    kept, todo = {start}, [start]
    while todo:
        for module, _ in _imports(files[todo.pop()]):
            name = module.lstrip(".") + ".py"
            if module.startswith(".") and name in files and name not in kept:
                kept.add(name)
                todo.append(name)
    return {name: source for name, source in files.items() if name in kept}
