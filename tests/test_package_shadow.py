"""A torchnlq checkout met from the folder above it (Python imports the working directory's ``torchnlq`` first,
issue 49.3): every entry of the package works when the installed package is that checkout's own, and ends in the
same one ImportError line when the folder shadows another copy, never a bare AttributeError."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

#: Each entry of the package, as a user types it; it prints "ok" once it reached the package's code.
ENTRIES = {
    "attribute": ["-c", "import torchnlq; assert callable(torchnlq.load_pretrained); print('ok')"],
    "from-import": ["-c", "from torchnlq import load_pretrained, __version__; print('ok')"],
    "submodule": ["-c", "import torchnlq.interop.load as m; assert callable(m.load_model); print('ok')"],
    "module-run": ["-m", "torchnlq.train", "--help"],
}

SHADOW_LINE = "shadows the installed torchnlq package"


def _installed_is_this_checkout() -> bool:
    """Whether the installed torchnlq (setuptools' editable finder of this checkout) is found past the folder."""
    code = "import importlib.util as u; s = u.find_spec('torchnlq'); print(s.origin)"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=60).stdout
    return Path(out.strip()).resolve() == (REPO_ROOT / "torchnlq" / "__init__.py").resolve()


@pytest.mark.integration  # subprocesses
@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("folder", ["this-checkout", "another-copy"])
def test_every_entry_from_the_folder_above_a_checkout(tmp_path: Path, entry: str, folder: str) -> None:
    if not _installed_is_this_checkout():
        pytest.skip("the installed torchnlq is not this checkout (its own case: a copy shadowing it, below)")
    shadow = tmp_path / "torchnlq"
    if folder == "this-checkout":
        shadow.symlink_to(REPO_ROOT, target_is_directory=True)  # a clone named torchnlq, installed with pip -e
    else:  # another checkout (its root file, no package inside) in front of the installed one
        shadow.mkdir()
        shutil.copy(REPO_ROOT / "__init__.py", shadow / "__init__.py")
    proc = subprocess.run([sys.executable, *ENTRIES[entry]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    if folder == "this-checkout":
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "ok" in proc.stdout or "usage" in proc.stdout, proc.stdout[-500:]
    else:
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode != 0 and last.startswith("ImportError: ") and SHADOW_LINE in last, proc.stderr[-2000:]
        assert "AttributeError" not in proc.stderr
