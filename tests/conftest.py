"""Shared test set-up: keep every cache and temporary file inside pytest's tmp dirs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache / "tiktoken"))
    monkeypatch.setenv("HF_HOME", str(cache / "hf"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One torch thread for a module of tiny-model tests (``pytestmark = pytest.mark.usefixtures(...)``).

    With two OpenMP threads on a shared, loaded machine every op of a tiny model waits for a
    descheduled thread at the barrier (4x slower here); one thread is faster and steadier.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
