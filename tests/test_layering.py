"""Import layering: which torchnlq packages may import which, checked by import-linter.

The rules are the contracts under ``[tool.importlinter]`` in pyproject.toml; they are the spec,
so when a test here fails, fix the import, not the contract (a new dependency direction is a
design decision: change the contract on purpose, and say why). ``lint-imports`` from the
repository root runs the same check.

import-linter (through grimp) reads the source, never imports it: every import of a torchnlq
module is an edge wherever it sits, in a function too (a lazy import still runs); imports
under ``if TYPE_CHECKING:`` are not (``exclude_type_checking_imports``), as they never run.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PACKAGE_ROOT = REPO / "torchnlq"
PYPROJECT = REPO / "pyproject.toml"
CONTRACTS = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]


def run_lint_imports(cwd: Path, *contract_ids: str) -> subprocess.CompletedProcess:
    """``lint-imports`` with the contracts of ``cwd``/pyproject.toml, on the package under ``cwd``
    (the repository, or a copy of it with pyproject.toml)."""
    exe = Path(sys.executable).with_name("lint-imports")
    command = [str(exe) if exe.exists() else shutil.which("lint-imports") or "lint-imports", "--no-cache", "--no-logo"]
    for contract_id in contract_ids:
        command += ["--contract", contract_id]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("contract_id", [c["id"] for c in CONTRACTS])
def test_contract(contract_id: str) -> None:
    proc = run_lint_imports(REPO, contract_id)
    if proc.returncode != 0:
        pytest.fail(f"lint-imports --contract {contract_id}:\n{proc.stdout}{proc.stderr}", pytrace=False)


def test_every_torchnlq_import_names_a_module() -> None:
    """grimp files an import of a module that does not exist under its nearest existing parent, so
    the contracts pass a stale ``from torchnlq.old.place import x`` (in a function no test runs, say)."""

    def exists(name: str) -> bool:
        path = REPO.joinpath(*name.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    missing = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        package = path.relative_to(REPO).with_suffix("").parts[:-1]  # what `from . import` names
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else ()
                names = [".".join([*base, *([node.module] if node.module else [])])]
            else:
                continue
            missing += [f"{path.relative_to(REPO)}:{node.lineno} imports {name}, which is not a module"
                        for name in names if name.split(".")[0] == "torchnlq" and not exists(name)]
    assert not missing, "\n".join(missing)


def test_lazy_imports_count_and_type_checking_imports_do_not(tmp_path: Path) -> None:
    """The session options of pyproject.toml, on a two-layer package: high above low."""
    options = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    assert options["exclude_type_checking_imports"] is True
    (tmp_path / "pyproject.toml").write_text(
        '[tool.importlinter]\nroot_package = "pkg"\nexclude_type_checking_imports = true\n'
        '[[tool.importlinter.contracts]]\nid = "l"\nname = "l"\ntype = "layers"\nlayers = ["pkg.high", "pkg.low"]\n'
    )
    files = {
        "__init__.py": "",
        "high.py": "",
        "low/__init__.py": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.high\n",
        "low/helper.py": "def f():\n    from pkg import high\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    report = run_lint_imports(tmp_path).stdout
    assert "pkg.low.helper -> pkg.high (l.2)" in report and "pkg.low ->" not in report, report
