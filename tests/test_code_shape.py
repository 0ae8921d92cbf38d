"""The code's shape, checked from its syntax trees: what docs/architecture.md promises about where things live.

- A component's names are tested only in its registry's module: no ``cfg.optimizer.name == "muon"`` elsewhere
  (optimizers, group optimizers, LR schedules and decay shapes, activation-checkpoint modes, loss paths).
- The model never looks at what wrapped it: no read of ``_forward_hooks`` (or the pre-hooks) in torchnlq/models/.
- Lines hold the project's limit of 120 characters (pyproject.toml's ``[tool.ruff] line-length``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO_ROOT
from torchnlq.models.lm_loss import LOSS_PATHS
from torchnlq.parallel.activation_checkpoint import MODES
from torchnlq.train.lr_schedule import DECAY_SHAPES, SCHEDULES
from torchnlq.train.optim import GROUP_OPTIMIZERS, OPTIMIZERS

PACKAGE = REPO_ROOT / "torchnlq"
LINE_LIMIT = 120

#: Each registry: its module, the names it holds, and the attributes a config or plan holds them in.
REGISTRIES = {
    "torchnlq/train/optim.py": (set(OPTIMIZERS) | set(GROUP_OPTIMIZERS), {"name", "optimizer"}),
    "torchnlq/train/lr_schedule.py": (set(SCHEDULES) | set(DECAY_SHAPES), {"name", "decay_shape"}),
    "torchnlq/parallel/activation_checkpoint.py": (set(MODES), {"mode"}),
    "torchnlq/models/lm_loss.py": (set(LOSS_PATHS), {"path", "loss_path"}),
}


def python_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py"))


def attribute_name(node: ast.AST) -> str | None:
    """``name`` of ``x.y.name`` or of a bare ``name``."""
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def literals(node: ast.AST) -> set[str]:
    """The string constants of a compared operand (a constant, or a tuple/list/set of them)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def name_tests(path: Path) -> list[tuple[int, str, str]]:
    """(line, attribute, name) of every comparison of a registry attribute with one of that registry's names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for module, (names, attributes) in REGISTRIES.items():
            if str(path.relative_to(REPO_ROOT)) == module:
                continue
            compared = {attribute_name(op) for op in operands} & attributes
            tested = set().union(*(literals(op) for op in operands)) & names
            if compared and tested:
                found.append((node.lineno, sorted(compared)[0], sorted(tested)[0]))
    return found


def test_no_component_is_tested_by_its_name_outside_its_registry() -> None:
    found = {f"{path.relative_to(REPO_ROOT)}:{line}: {attr} == {name!r}"
             for path in python_files(PACKAGE, REPO_ROOT / "benchmarks", REPO_ROOT / "scripts")
             for line, attr, name in name_tests(path)}
    assert found == set(), "ask the registry instead:\n" + "\n".join(sorted(found))


def test_the_checker_finds_a_name_test(tmp_path: Path) -> None:
    """The check above fails where it should: a planted comparison in a file outside the registries is found."""
    planted = tmp_path / "planted.py"
    planted.write_text('if cfg.optimizer.name == "muon" or s.name in ("wsd", "x") or mode != "op":\n    pass\n')
    original = REPO_ROOT
    try:
        globals()["REPO_ROOT"] = tmp_path
        assert {name for _, _, name in name_tests(planted)} == {"muon", "wsd", "op"}
    finally:
        globals()["REPO_ROOT"] = original


def test_the_model_never_reads_what_wrapped_it() -> None:
    reads = [f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
             for path in python_files(PACKAGE / "models")
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Attribute) and node.attr in ("_forward_hooks", "_forward_pre_hooks")]
    assert reads == []


@pytest.mark.parametrize("root", ["torchnlq", "benchmarks", "scripts"])
def test_lines_hold_the_limit(root: str) -> None:
    long = [f"{path.relative_to(REPO_ROOT)}:{number}: {len(line)}"
            for path in python_files(REPO_ROOT / root)
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > LINE_LIMIT]
    assert long == [], f"{len(long)} lines over {LINE_LIMIT} characters:\n" + "\n".join(long)
