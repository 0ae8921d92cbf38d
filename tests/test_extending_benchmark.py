"""The benchmark walk-through of docs/extending.md ("A new benchmark"), performed as written there.

The section has one ```python block: the benchmark module (``benchmarks/forward_batch.py`` in the docs),
run as ``python -m benchmarks.forward_batch``. It is taken from the markdown and written into tmp_path, never
into the working tree: the module is imported from there and its ``main`` run with tiny sizes; for the
layering rules and the command, it goes into a copy of the repository's code (``tmp/torchnlq/...``,
``tmp/benchmarks/...``) and the import-linter contracts of pyproject.toml (tests/test_layering.py) run on
that copy, the command in a subprocess from the copy's root.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from helpers import REPO_ROOT
from helpers.train import script_env
from test_layering import PACKAGE_ROOT, run_lint_imports
from torchnlq.cli import run_cli

DOC = REPO_ROOT / "docs" / "extending.md"
MODULE = "benchmarks.forward_batch"  # where the docs put the example
MODULE_PATH = "benchmarks/forward_batch.py"
TINY = ["--batches", "1", "2", "--seq", "8", "--layers", "1", "--dim", "16", "--heads", "2",
        "--steps", "2", "--warmup", "1"]


def doc_module() -> str:
    """The section's python block: the module, with its ``main`` and the ``__main__`` block that runs it."""
    text = DOC.read_text()
    match = re.search(r"^## A new benchmark.*?(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert match, "docs/extending.md has no section '## A new benchmark'"
    blocks = re.findall(r"```python\n(.*?)```", match.group(0), flags=re.DOTALL)
    assert len(blocks) == 1, "the benchmark section should have one python block: the module"
    module = blocks[0]
    assert re.search(r"^def main\(", module, flags=re.MULTILINE), "the module defines main(argv)"
    assert 'if __name__ == "__main__":\n    sys.exit(run_cli(main))' in module, "the module runs main via run_cli"
    return module


@pytest.fixture
def example(tmp_path: Path) -> ModuleType:
    """The docs' benchmark module, written to tmp_path and imported from there (not registered in sys.modules)."""
    path = tmp_path / "forward_batch.py"
    path.write_text(doc_module())
    spec = importlib.util.spec_from_file_location("docs_forward_batch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_rows(output: str) -> list[list[str]]:
    """The cells of the Markdown table's body rows in ``output`` (header and separator dropped)."""
    lines = [line for line in output.splitlines() if line.startswith("|")]
    assert len(lines) >= 2 and set(lines[1]) <= set("|-: "), f"no Markdown table in:\n{output}"
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def check_table(output: str, variants: tuple[str, ...], n_batches: int) -> None:
    rows = table_rows(output)
    assert [row[0] for row in rows] == list(variants), output
    for row in rows:
        assert len(row) == 1 + n_batches, output
        assert all(float(ms) > 0 for ms in row[1:]), output
    assert len([line for line in output.splitlines() if line.startswith("# ")]) == 2, output  # what, and where


def package_copy(tmp_path: Path, module_source: str) -> Path:
    """tmp/torchnlq and tmp/benchmarks: the packages' .py files, plus ``module_source`` as the docs'
    benchmark module; tmp/pyproject.toml: the import contracts."""
    root = tmp_path / "torchnlq"
    for package in (PACKAGE_ROOT, REPO_ROOT / "benchmarks"):
        shutil.copytree(package, tmp_path / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    (tmp_path / MODULE_PATH).write_text(module_source)
    return root


def example_problems(tmp_path: Path) -> list[str]:
    """The lines of lint-imports' report on the copy that name the example module (the rest of the
    tree is test_layering's job)."""
    return [line.strip(" -") for line in run_lint_imports(tmp_path).stdout.splitlines() if MODULE in line]


def test_example_prints_one_row_per_variant(example, capsys):
    assert example.main(TINY) == 0
    check_table(capsys.readouterr().out, example.VARIANTS, n_batches=2)


def test_example_bad_input_is_one_error_line(example, capsys):
    """Through run_cli, as its ``__main__`` block calls it: a UserError is one line and exit code 2."""
    assert run_cli(example.main, ["--batches", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_example_follows_the_layering_rules(tmp_path):
    """In benchmarks/ the example imports only what the benchmarks layer may import."""
    source = doc_module()
    assert re.search(r"^from benchmarks\.timing import ", source, flags=re.MULTILINE), (
        "the example should use the timing helpers")
    package_copy(tmp_path, source)
    assert example_problems(tmp_path) == []


def test_layering_check_would_catch_a_bad_example(tmp_path):
    """Control: the same check reports the example once it imports the experiments, or the library imports it."""
    source = doc_module() + "\nfrom torchnlq.experiments import suite  # noqa: E402\n"
    root = package_copy(tmp_path, source)
    (root / "train" / "uses_bench.py").write_text(f"from {MODULE} import main\n")
    problems = example_problems(tmp_path)
    assert any(p.startswith(f"{MODULE} -> torchnlq.experiments.suite (l.") for p in problems), problems
    assert any(p == f"torchnlq.train.uses_bench -> {MODULE} (l.1)" for p in problems), problems


@pytest.mark.integration
def test_python_m_runs_the_example(tmp_path):
    """``python -m benchmarks.forward_batch`` from the root of a copy of the repository with the module in place."""
    package_copy(tmp_path, doc_module())
    command = [sys.executable, "-m", MODULE]
    proc = subprocess.run([*command, *TINY], cwd=tmp_path, env=script_env(tmp_path),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    check_table(proc.stdout, ("linear", "residual_mlp"), n_batches=2)
    bad = subprocess.run([*command, "--steps", "0"], cwd=tmp_path, env=script_env(tmp_path),
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad.stderr
    typo = subprocess.run([*command, "--stpes", "2"], cwd=tmp_path, env=script_env(tmp_path),
                          capture_output=True, text=True, timeout=300, check=False)
    assert typo.returncode == 2 and typo.stderr.startswith(f"error: python -m {MODULE}: "), typo.stderr
