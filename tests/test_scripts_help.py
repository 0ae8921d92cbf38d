"""Every command-line script and benchmark answers --help with its usage, exit 0, and writes nothing; every
user tool in scripts/ is a thin door into the package (issue 33.4: one convention, one way to run a benchmark)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

SCRIPTS = sorted(p.name for p in (REPO_ROOT / "scripts").glob("*.py"))
#: The benchmarks, each run as ``python -m benchmarks.NAME`` from the checkout (the package is not installed).
BENCHMARKS = sorted(p.stem for p in (REPO_ROOT / "benchmarks").glob("*.py")
                    if 'if __name__ == "__main__":' in p.read_text())
#: Scripts that still hold their own command line; their argparse and main are to move into the package.
OWN_COMMAND_LINE = {"convert_checkpoint.py", "evaluate.py", "generate.py", "upcycle.py", "prepare_data.py",
                    "gen_config_docs.py"}


def _tree_state(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def _help(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    """``argv --help`` in ``cwd``: exit 0, a usage, no traceback, defaults said once, nothing written there."""
    proc = subprocess.run([sys.executable, *argv, "--help"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # An option's default is said once, and only when there is one ("(default: the run's) (default: None)").
    flat = " ".join(proc.stdout.split())
    assert "(default: None)" not in flat and not re.search(r"\(default[^()]*\) \(default", flat), flat
    assert list(cwd.iterdir()) == []  # nothing written where it ran
    return proc.stdout


@pytest.mark.integration
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_usage_and_writes_nothing(tmp_path: Path, script: str) -> None:
    docs_before = _tree_state(REPO_ROOT / "docs")
    out = _help([str(REPO_ROOT / "scripts" / script)], tmp_path, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert "usage" in out.lower() or f"scripts/{script}" in out
    assert _tree_state(REPO_ROOT / "docs") == docs_before  # gen_config_docs.py --help rewrites nothing


def test_the_benchmarks_are_found() -> None:
    assert {"train_step", "gpu_check", "activation_memory"} <= set(BENCHMARKS), BENCHMARKS
    assert not any(name.startswith(("bench", "gpu_check")) for name in SCRIPTS), "benchmarks run as modules"


@pytest.mark.integration
@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_help_names_its_command(tmp_path: Path, name: str) -> None:
    """``python -m benchmarks.NAME --help``: its usage names that very command (argparse's prog, the docstring)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}  # as from the repository root
    out = _help(["-m", f"benchmarks.{name}"], tmp_path, env)
    assert f"python -m benchmarks.{name}" in out, out[:500]


def _main_block(tree: ast.Module) -> ast.If | None:
    last = tree.body[-1] if tree.body else None
    return last if isinstance(last, ast.If) and ast.unparse(last.test) == "__name__ == '__main__'" else None


@pytest.mark.parametrize("script", sorted(set(SCRIPTS) - OWN_COMMAND_LINE))
def test_a_user_tool_is_a_thin_door_into_the_package(script: str) -> None:
    """No logic of its own: the checkout on sys.path, imports from torchnlq, then ``sys.exit(cli())`` or
    ``sys.exit(run_cli(main))``; no benchmark (those run as ``python -m benchmarks.NAME``)."""
    tree = ast.parse((REPO_ROOT / "scripts" / script).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))], "a definition"
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert all(m in ("sys", "pathlib") or m.startswith("torchnlq.") for m in modules), modules
    main = _main_block(tree)
    assert main is not None and [ast.unparse(s) for s in main.body] in (["sys.exit(cli())"],
                                                                        ["sys.exit(run_cli(main))"])


#: The transformers classes of the Hugging Face folders torchnlq reads (written out: the reference the lists derived
#: from the families' hf_architectures are checked against).
READ_FOLDERS = ("GPT2LMHeadModel", "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


@pytest.mark.integration
@pytest.mark.parametrize("script", ["convert_checkpoint.py", "upcycle.py", "evaluate.py", "generate.py"])
def test_the_tools_that_read_hugging_face_folders_name_every_one(tmp_path: Path, script: str) -> None:
    """--help and the "does not exist" line of every tool that reads a Hugging Face folder name each architecture a
    family reads, Qwen3-MoE's too (issue 47.6: the lists are derived from the registered families)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    said = " ".join(_help([str(REPO_ROOT / "scripts" / script)], tmp_path, env).split())
    assert all(name in said for name in READ_FOLDERS), said
    extra = {"evaluate.py": ["--data", str(tmp_path)], "generate.py": []}.get(script, [str(tmp_path / "out")])
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / script), str(tmp_path / "missing"), *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "does not exist" in lines[0] and all(name in lines[0] for name in READ_FOLDERS), lines[0]
    assert list(tmp_path.iterdir()) == []
