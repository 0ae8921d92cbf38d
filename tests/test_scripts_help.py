"""Every command-line script answers --help with its usage, exit 0, and writes nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

SCRIPTS = sorted(p.name for p in (REPO_ROOT / "scripts").glob("*.py"))


def _tree_state(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


@pytest.mark.integration
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_usage_and_writes_nothing(tmp_path: Path, script: str) -> None:
    docs_before = _tree_state(REPO_ROOT / "docs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / script), "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage" in proc.stdout.lower() or f"scripts/{script}" in proc.stdout
    assert "Traceback" not in proc.stderr
    # An option's default is said once, and only when there is one ("(default: the run's) (default: None)").
    flat = " ".join(proc.stdout.split())
    assert "(default: None)" not in flat and not re.search(r"\(default[^()]*\) \(default", flat), flat
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran
    assert _tree_state(REPO_ROOT / "docs") == docs_before  # gen_config_docs.py --help rewrites nothing
