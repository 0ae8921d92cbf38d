"""Shared test set-up: keep every cache and temporary file inside pytest's tmp dirs.

Shared helper code lives in the tests/helpers/ package (``from helpers.train import run_train``).
Tests marked ``integration`` (subprocesses, torchrun, end-to-end trainer runs) are deselected by
``-m "not integration"``; see [tool.pytest.ini_options] in pyproject.toml. run_tests.sh runs them on every core
(pytest-xdist), a test file to a worker (pytest_collection_modifyitems below).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup`` (run_tests.sh) every test file is one group, run on one worker: its
    module- and session-scoped fixtures (a trained run, a torchrun job, a Hugging Face export) are built once, not
    once per worker. A test that names its own ``xdist_group`` keeps it; the ``cuda`` tests share one (one GPU,
    one test at a time)."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = "cuda" if item.get_closest_marker("cuda") else item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache / "tiktoken"))
    monkeypatch.setenv("HF_HOME", str(cache / "hf"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))


@pytest.fixture(scope="session", autouse=True)
def cpu_allocator_keeps_freed_memory() -> None:
    """The tests train on the CPU: keep freed memory in the heap, as CPU runs do (torchnlq/train/cpu_allocator.py)."""
    from torchnlq.train.cpu_allocator import keep_freed_memory

    keep_freed_memory()


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the whole session: every model built in-process by a test is tiny.

    With two OpenMP threads on a shared, loaded machine every op of a tiny model waits for a
    descheduled thread at the barrier; one thread is faster and steadier.
    Autouse, so modules need not ask for it; ``usefixtures("one_torch_thread")`` still works.
    Trainer subprocesses get the same through ``helpers.train.script_env`` (OMP_NUM_THREADS=1).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
