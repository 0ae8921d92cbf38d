"""Import layering: which torchnlq packages may import which, written down once and enforced.

The allowed dependencies are the ``LAYERS`` table below; it is the spec, so when a test here
fails, fix the import, not the table (a new dependency direction is a design decision: change
the table on purpose, in its own commit, and say why).

How it works: every ``.py`` file under ``torchnlq/`` is parsed with :mod:`ast` (never
imported, so this test needs neither torch nor a working tree that imports cleanly). Every
``import``/``from ... import`` of a torchnlq module is an edge, wherever it sits: at module
level, in a function (a lazy import still runs, so it is a real dependency) or in a class
body. Imports under ``if TYPE_CHECKING:`` are skipped, because they never execute.
Python also runs a package's ``__init__`` implicitly when a submodule is imported; that
implicit step is not an edge, only what the source names explicitly is.

The checker is a handful of plain functions taking a package root and a rule table
(:func:`collect_imports`, :func:`check_layering`), so the self-tests at the bottom run it on
small fake packages built in ``tmp_path``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "torchnlq"

# ---------------------------------------------------------------------------------------------
# The rule table.
#
# Keys are nodes (layers): a dotted module prefix. A module belongs to the node with the
# LONGEST key that is the module itself or one of its parent packages, so a single module
# (``torchnlq.config.checks``) can be a node of its own inside a bigger one. The one exception
# is the package itself (``torchnlq``): that node is only ``torchnlq/__init__.py``, so a new
# top-level package does not silently fall into it but fails ``test_every_module_maps_to_a_node``
# until it is added here on purpose.
#
# Values are the OTHER nodes a node may import (a node may always import its own modules).
# Nothing is transitive: list every node a layer may import directly.
# ---------------------------------------------------------------------------------------------
LAYERS: dict[str, tuple[str, ...]] = {
    "torchnlq.errors": (),
    "torchnlq.version": (),  # __version__ alone, so that writers of files can stamp it
    "torchnlq.paths": (),  # the folders no writer may replace (export, prepare_data)
    "torchnlq.pause_points": (),  # where fault tests hold a trainer (checkpoint saves, validation)
    "torchnlq.cli": ("torchnlq.errors",),
    # The schema (job_config), loading (manager) and rendering (render): below everything.
    "torchnlq.config": ("torchnlq.errors",),
    # Cross-section checks and the choice lists derived from the model/data registries: they
    # need models and data, so they sit above them, apart from the rest of config.
    "torchnlq.config.checks": ("torchnlq.config", "torchnlq.models", "torchnlq.data", "torchnlq.errors"),
    "torchnlq.models": ("torchnlq.config", "torchnlq.errors"),
    "torchnlq.data": ("torchnlq.config", "torchnlq.errors", "torchnlq.paths"),
    "torchnlq.parallel": ("torchnlq.config", "torchnlq.models", "torchnlq.errors"),
    "torchnlq.checkpoint": (
        "torchnlq.config", "torchnlq.models", "torchnlq.data", "torchnlq.errors", "torchnlq.version", "torchnlq.paths",
        "torchnlq.pause_points",
    ),
    "torchnlq.train": (
        "torchnlq.config", "torchnlq.config.checks", "torchnlq.models", "torchnlq.data",
        "torchnlq.parallel", "torchnlq.checkpoint", "torchnlq.errors", "torchnlq.cli", "torchnlq.pause_points",
    ),
    # parallel: model_summary.py reports the memory estimate (parallel/memory_estimate.py).
    "torchnlq.inference": (
        "torchnlq.config", "torchnlq.config.checks", "torchnlq.models", "torchnlq.data",
        "torchnlq.checkpoint", "torchnlq.train", "torchnlq.errors", "torchnlq.cli", "torchnlq.parallel",
    ),
    "torchnlq.experiments": (
        "torchnlq.config", "torchnlq.config.checks", "torchnlq.models", "torchnlq.data",
        "torchnlq.checkpoint", "torchnlq.inference", "torchnlq.errors", "torchnlq.cli",
    ),
    # transformers classes for every query type and the --format hf export. Its
    # modeling_torchnlq.py imports no torchnlq module at all (it is copied into exports).
    "torchnlq.hf": ("torchnlq.models", "torchnlq.data", "torchnlq.checkpoint", "torchnlq.errors", "torchnlq.version"),
    "torchnlq.benchmarks": (),  # filled in just below: everything except experiments
    # The root __init__ only (see above): ``load_pretrained`` reaches into checkpoint/models;
    # importing torchnlq registers the transformers classes (torchnlq.hf.auto) once transformers loads.
    "torchnlq": ("torchnlq.checkpoint", "torchnlq.models", "torchnlq.version", "torchnlq.hf"),
}
# Benchmarks sit on top of the library and may use all of it, but not the experiment drivers.
LAYERS["torchnlq.benchmarks"] = tuple(n for n in LAYERS if n not in ("torchnlq.benchmarks", "torchnlq.experiments"))

# Hard rules from the design, checked on their own (not through LAYERS) so their failure
# message names the rule, and so widening LAYERS cannot quietly allow them
# (test_layer_table_respects_the_hard_rules). Each is (source prefix, target prefix, why):
# no module under the source prefix, other than those under the target prefix itself, may
# import anything under the target prefix. Prefixes here are plain dotted prefixes.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("torchnlq", "torchnlq.benchmarks", "the library never imports a benchmark"),
    ("torchnlq.train", "torchnlq.inference", "train/ never imports inference"),
    ("torchnlq.train", "torchnlq.experiments", "train/ never imports experiments"),
    ("torchnlq.models", "torchnlq.data", "models/ never imports data/"),
    ("torchnlq.models", "torchnlq.train", "models/ never imports train/"),
)


# ---------------------------------------------------------------------------------------------
# The checker.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Import:
    """One import of a package module by a package module: an edge of the module graph."""

    source: str  # the importing module, e.g. "torchnlq.train.trainer"
    target: str  # the imported module, resolved (a submodule where one is named), e.g. "torchnlq.data.token_format"
    path: str  # the importing file, relative to the root's parent, e.g. "torchnlq/train/trainer.py"
    line: int
    lazy: bool = False  # inside a function: runs only when called, still a dependency

    def site(self) -> str:
        return f"{self.path}:{self.line}"


def discover_modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root`` (a directory), by dotted name.

    ``pkg/a/__init__.py`` is ``pkg.a``; ``pkg/a/b.py`` is ``pkg.a.b``; the package's name is
    the directory's name.
    """
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:`` (the body never runs)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


class _ImportCollector(ast.NodeVisitor):
    """Collects the raw imports of one module: (absolute dotted name, imported names or None, line, lazy)."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.is_package = is_package
        self.depth = 0  # function nesting: >0 means the import is lazy
        self.found: list[tuple[str, tuple[str, ...] | None, int, bool]] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            # Skip the body: it only exists for the type checker. The else branch does run.
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, None, node.lineno, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            # Relative: level 1 is the module's own package (a package's __init__ is its own package).
            package = self.module.split(".")
            if not self.is_package:
                package = package[:-1]
            base = package[: len(package) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        self.found.append((name, tuple(a.name for a in node.names), node.lineno, self.depth > 0))


def collect_imports(root: Path) -> list[Import]:
    """Every import of a module of the package at ``root`` by a module of that package, sorted.

    ``import pkg.a.b`` is an edge to ``pkg.a.b``; ``from pkg.a import b`` is an edge to the
    submodule ``pkg.a.b`` when that is a module, else (``b`` is a name defined in
    ``pkg/a/__init__.py``) an edge to ``pkg.a``. Imports of other packages are ignored.
    A file that does not parse raises SyntaxError naming it.
    """
    modules = discover_modules(root)
    package = root.name
    edges: set[Import] = set()
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        collector = _ImportCollector(module, path.name == "__init__.py")
        collector.visit(tree)
        rel = path.relative_to(root.parent).as_posix()
        for name, names, line, lazy in collector.found:
            if name != package and not name.startswith(package + "."):
                continue
            if names is None:
                targets = [name]
            else:
                targets = [f"{name}.{n}" if f"{name}.{n}" in modules else name for n in names]
            for target in targets:
                if target != module:  # a module naming itself is no dependency
                    edges.add(Import(module, target, rel, line, lazy))
    return sorted(edges)


def node_of(module: str, layers: Mapping[str, Sequence[str]], package: str) -> str | None:
    """The node ``module`` belongs to: the longest key that is it or a parent package of it.

    The package's own key (``package``) matches only the package's ``__init__`` itself.
    """
    best: str | None = None
    for key in layers:
        matches = module == key or (key != package and module.startswith(key + "."))
        if matches and (best is None or len(key) > len(best)):
            best = key
    return best


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the strongly connected components of ``graph`` (each sorted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        # Recursion depth is bounded by the number of modules (about a hundred): fine.
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _shortest_cycle(graph: Mapping[str, Iterable[str]], start: str, within: set[str]) -> list[str]:
    """A shortest path start -> ... -> start inside ``within`` (breadth first), as its node list."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w not in within:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def find_cycles(edges: Mapping[tuple[str, str], Import], kind: str) -> list[str]:
    """One message per cycle (strongly connected component of more than one vertex) of ``edges``.

    ``edges`` maps (from, to) to the import that makes that edge; the message shows one
    shortest cycle through the component's first vertex, with the import behind each step.
    """
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        if a != b:
            graph[a].add(b)
    messages = []
    for component in _strongly_connected(graph):
        if len(component) < 2:
            continue
        cycle = _shortest_cycle(graph, component[0], set(component))
        lines = [f"{kind} cycle: " + " -> ".join(cycle)]
        for a, b in pairwise(cycle):
            imp = edges[a, b]
            lazy = " (in a function)" if imp.lazy else ""
            lines.append(f"    {imp.site()} imports {imp.target}{lazy}")
        if len(component) > len(cycle) - 1:
            lines.append(f"    (the whole cycle group: {', '.join(component)})")
        messages.append("\n".join(lines))
    return messages


@dataclass
class Report:
    """What :func:`check_layering` found; every field is a list of human-readable messages."""

    table: list[str] = field(default_factory=list)  # the table itself is inconsistent
    unmapped: list[str] = field(default_factory=list)  # modules that belong to no node
    stale: list[str] = field(default_factory=list)  # nodes naming no module
    missing: list[str] = field(default_factory=list)  # imports of package modules that do not exist
    violations: list[str] = field(default_factory=list)  # edges the table does not allow
    forbidden: list[str] = field(default_factory=list)  # edges breaking a hard rule
    module_cycles: list[str] = field(default_factory=list)
    layer_cycles: list[str] = field(default_factory=list)


def check_layering(
    root: Path,
    layers: Mapping[str, Sequence[str]],
    forbidden: Sequence[tuple[str, str, str]] = (),
) -> Report:
    """Check the package at ``root`` against the rule table ``layers`` and the hard rules ``forbidden``."""
    package = root.name
    modules = discover_modules(root)
    imports = collect_imports(root)
    report = Report()

    for node, allowed in layers.items():
        report.table += [f"{node} allows {a}, which is not a node of the table" for a in allowed if a not in layers]
    report.stale = [f"{node} is in the table but there is no module {node}" for node in layers if node not in modules]
    report.unmapped = [
        f"{modules[m].relative_to(root.parent).as_posix()} ({m}) belongs to no node of the table"
        for m in modules
        if node_of(m, layers, package) is None
    ]

    # First import site of each module edge and of each node edge, for the cycle messages.
    module_edges: dict[tuple[str, str], Import] = {}
    node_edges: dict[tuple[str, str], Import] = {}
    for imp in imports:
        if imp.target not in modules:
            report.missing.append(f"{imp.site()} imports {imp.target}, which is not a module of {package}")
        for src, tgt, why in forbidden:
            if _under(imp.source, src) and not _under(imp.source, tgt) and _under(imp.target, tgt):
                report.forbidden.append(f"{imp.site()} imports {imp.target} ({why})")
        module_edges.setdefault((imp.source, imp.target), imp)
        a, b = node_of(imp.source, layers, package), node_of(imp.target, layers, package)
        if a is None or b is None or a == b:
            continue  # unmapped modules are reported above; a node may import itself
        node_edges.setdefault((a, b), imp)
        allowed = layers[a]
        if b not in allowed:
            report.violations.append(
                f"{imp.site()} imports {imp.target} (layer {a} may not depend on layer {b}; "
                f"allowed: {', '.join(allowed) or '(nothing)'})"
            )

    report.module_cycles = find_cycles(module_edges, "import")
    report.layer_cycles = find_cycles(node_edges, "layer")
    return report


def _fail_if(messages: list[str], what: str) -> None:
    if messages:
        pytest.fail(f"{len(messages)} {what}:\n" + "\n".join(messages), pytrace=False)


# ---------------------------------------------------------------------------------------------
# The real tree.
# ---------------------------------------------------------------------------------------------
@cache
def _real_report() -> Report:
    return check_layering(PACKAGE_ROOT, LAYERS, FORBIDDEN)


def test_layer_table_is_consistent() -> None:
    _fail_if(_real_report().table, "inconsistent entries in LAYERS")


def test_layer_table_respects_the_hard_rules() -> None:
    """LAYERS must not allow what FORBIDDEN forbids, so the table cannot be widened around a hard rule."""
    problems = []
    for src_node, allowed in LAYERS.items():
        for tgt_node in allowed:
            for src, tgt, why in FORBIDDEN:
                if _under(src_node, src) and not _under(src_node, tgt) and _under(tgt_node, tgt):
                    problems.append(f"LAYERS lets {src_node} import {tgt_node}, but {why}")
    _fail_if(problems, "table entries breaking a hard rule")


def test_every_module_maps_to_a_node() -> None:
    _fail_if(_real_report().unmapped, "modules missing from LAYERS (add a new package to the table on purpose)")


def test_every_node_exists() -> None:
    _fail_if(_real_report().stale, "stale entries in LAYERS")


def test_every_import_resolves_to_a_module() -> None:
    _fail_if(_real_report().missing, "imports of torchnlq modules that do not exist")


def test_hard_rules() -> None:
    """The library never imports a benchmark; train/ never imports inference or experiments;
    models/ imports neither data/ nor train/."""
    _fail_if(_real_report().forbidden, "imports breaking a hard layering rule")


def test_imports_follow_the_layer_table() -> None:
    _fail_if(_real_report().violations, "imports the layer table does not allow (fix the import, not LAYERS)")


def test_no_module_import_cycles() -> None:
    _fail_if(_real_report().module_cycles, "import cycles between modules")


def test_no_layer_cycles() -> None:
    _fail_if(_real_report().layer_cycles, "cycles between layers")


# ---------------------------------------------------------------------------------------------
# Self-tests of the checker, on small fake packages.
# ---------------------------------------------------------------------------------------------
def _make_package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    """Write ``files`` (path under the package -> source) as package ``pkg`` in tmp_path; return its root."""
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# low is below high; high/app.py imports low properly; low/helper.py lazily imports high.app
# back (a forbidden edge and a cycle); low/base.py imports high only for the type checker.
FAKE = {
    "__init__.py": "from pkg.low import helper\n",
    "low/__init__.py": "",
    "low/base.py": (
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.high.app import App\n"
        "if typing.TYPE_CHECKING:\n"
        "    import pkg.high\n"
        "else:\n"
        "    from . import helper\n"
    ),
    "low/helper.py": "def f():\n    from pkg.high import app\n    return app\n",
    "high/__init__.py": "VALUE = 1\n",
    "high/app.py": (
        "from ..low import base\n"
        "from pkg.low.helper import f\n"
        "import pkg.low.helper as h\n"
        "from pkg.high import VALUE\n"
        "from . import app\n"
    ),
}
FAKE_LAYERS = {"pkg": ("pkg.low",), "pkg.low": (), "pkg.high": ("pkg.low",)}


def test_collect_imports_resolves_and_filters(tmp_path: Path) -> None:
    """Relative imports resolve, ``from pkg.x import submodule`` names the submodule, a name
    from an ``__init__`` names the package, lazy imports count, TYPE_CHECKING and other
    packages do not, and a module importing itself is no edge."""
    root = _make_package(tmp_path, FAKE)
    got = {(i.source, i.target, i.line, i.lazy) for i in collect_imports(root)}
    assert got == {
        ("pkg", "pkg.low.helper", 1, False),
        ("pkg.low.base", "pkg.low.helper", 9, False),  # the else branch of TYPE_CHECKING runs
        ("pkg.low.helper", "pkg.high.app", 2, True),
        ("pkg.high.app", "pkg.low.base", 1, False),
        ("pkg.high.app", "pkg.low.helper", 2, False),
        ("pkg.high.app", "pkg.low.helper", 3, False),
        ("pkg.high.app", "pkg.high", 4, False),
    }


def test_node_of_longest_prefix_and_exact_root() -> None:
    layers = {"pkg": (), "pkg.a": (), "pkg.a.special": ()}
    assert node_of("pkg", layers, "pkg") == "pkg"
    assert node_of("pkg.a", layers, "pkg") == "pkg.a"
    assert node_of("pkg.a.x", layers, "pkg") == "pkg.a"
    assert node_of("pkg.a.special", layers, "pkg") == "pkg.a.special"
    assert node_of("pkg.a.specialist", layers, "pkg") == "pkg.a"  # a prefix of dotted parts, not characters
    assert node_of("pkg.b", layers, "pkg") is None  # the package's own node is its __init__ only


def test_check_reports_forbidden_edge_and_cycles(tmp_path: Path) -> None:
    root = _make_package(tmp_path, FAKE)
    report = check_layering(root, FAKE_LAYERS, [("pkg.low", "pkg.high", "low never imports high")])
    assert report.violations == [
        "pkg/low/helper.py:2 imports pkg.high.app (layer pkg.low may not depend on layer pkg.high; allowed: (nothing))"
    ]
    assert report.forbidden == ["pkg/low/helper.py:2 imports pkg.high.app (low never imports high)"]
    assert report.module_cycles == [
        (
            "import cycle: pkg.high.app -> pkg.low.helper -> pkg.high.app\n"
            "    pkg/high/app.py:2 imports pkg.low.helper\n"
            "    pkg/low/helper.py:2 imports pkg.high.app (in a function)\n"
            "    (the whole cycle group: pkg.high.app, pkg.low.base, pkg.low.helper)"  # base -> helper -> app -> base too
        )
    ]
    assert report.layer_cycles == [
        (
            "layer cycle: pkg.high -> pkg.low -> pkg.high\n"
            "    pkg/high/app.py:1 imports pkg.low.base\n"
            "    pkg/low/helper.py:2 imports pkg.high.app (in a function)"
        )
    ]
    assert report.table == report.unmapped == report.stale == report.missing == []


def test_check_clean_package_reports_nothing(tmp_path: Path) -> None:
    files = dict(FAKE)
    files["low/helper.py"] = "def f():\n    return 1\n"  # drop the upward import
    report = check_layering(_make_package(tmp_path, files), FAKE_LAYERS, [("pkg.low", "pkg.high", "no")])
    assert report == Report()


def test_check_reports_cycle_through_package_init(tmp_path: Path) -> None:
    """Importing a sibling through its package is fine; importing a name from one's own
    package's ``__init__`` (which imports the module back) is a cycle."""
    files = {
        "__init__.py": "",
        "a/__init__.py": "from pkg.a.x import X\nfrom pkg.a.y import Y\n",
        "a/x.py": "from pkg.a import y\nX = 1\n",  # the sibling submodule: no edge to pkg.a
        "a/y.py": "from pkg.a import X\nY = 2\n",  # a name from pkg/a/__init__.py: an edge to pkg.a
    }
    report = check_layering(_make_package(tmp_path, files), {"pkg": (), "pkg.a": ()})
    assert report.module_cycles == [
        (
            "import cycle: pkg.a -> pkg.a.y -> pkg.a\n"
            "    pkg/a/__init__.py:2 imports pkg.a.y\n"
            "    pkg/a/y.py:1 imports pkg.a\n"
            "    (the whole cycle group: pkg.a, pkg.a.x, pkg.a.y)"  # pkg.a.x -> pkg.a.y -> pkg.a -> pkg.a.x
        )
    ]
    assert report.violations == report.layer_cycles == []


def test_check_reports_table_problems(tmp_path: Path) -> None:
    files = {"__init__.py": "", "a.py": "import pkg.gone\n", "extra/__init__.py": "", "extra/m.py": ""}
    layers = {"pkg": (), "pkg.a": ("pkg.nope",), "pkg.old": ()}
    report = check_layering(_make_package(tmp_path, files), layers)
    assert report.table == ["pkg.a allows pkg.nope, which is not a node of the table"]
    assert report.stale == ["pkg.old is in the table but there is no module pkg.old"]
    assert report.unmapped == [
        "pkg/extra/__init__.py (pkg.extra) belongs to no node of the table",
        "pkg/extra/m.py (pkg.extra.m) belongs to no node of the table",
    ]
    assert report.missing == ["pkg/a.py:1 imports pkg.gone, which is not a module of pkg"]


def test_check_finds_a_three_module_cycle(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "from . import c\n",
        "c.py": "def f():\n    import pkg.a\n",
        "d.py": "from pkg import a\n",  # on no cycle: must not be reported
    }
    report = check_layering(_make_package(tmp_path, files), {"pkg": (), "pkg.a": (), "pkg.b": (), "pkg.c": (), "pkg.d": ()})
    assert report.module_cycles == [
        (
            "import cycle: pkg.a -> pkg.b -> pkg.c -> pkg.a\n"
            "    pkg/a.py:1 imports pkg.b\n"
            "    pkg/b.py:1 imports pkg.c\n"
            "    pkg/c.py:2 imports pkg.a (in a function)"
        )
    ]
    assert [m.splitlines()[0] for m in report.layer_cycles] == ["layer cycle: pkg.a -> pkg.b -> pkg.c -> pkg.a"]
    # Every edge breaks the (empty) table.
    assert len(report.violations) == 4
