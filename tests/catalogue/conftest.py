"""The catalogue's shared inputs (a real run, its checkpoint and export, token folders, run folders to
compare), the environment every row runs in, and the subprocess rows, all started at once."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from helpers.checkpoints import write_byte_data
from helpers.train import script_env

from catalogue.rows import TRAIN, Inputs, fill
from catalogue.runner import Launched, Launches, command, run_process, snapshot, working_folder
from torchnlq.cli import LAUNCH_DIR_ENV

SUBPROCESS_TEST = "test_mistake_in_a_subprocess"


def write_compare_run(root: Path, name: str, val: Mapping[int, float], batch: str = "aaaa", validation: str = "vvvv",
                      tensorboard: bool = True) -> Path:
    """A finished run folder as compare_runs reads it: config.toml, run_info.json and TensorBoard's loss/val."""
    from torch.utils.tensorboard import SummaryWriter

    from torchnlq.config.manager import load_job_config
    from torchnlq.config.render import to_toml

    run = root / name
    run.mkdir(parents=True)
    (run / "config.toml").write_text(to_toml(load_job_config([f"--job.name={name}"])))
    (run / "run_info.json").write_text(json.dumps({
        "name": name, "step": max(val), "steps": max(val), "finished": True, "query_type": "linear",
        "non_embedding_params": 1000, "batch_fingerprint": batch, "validation_fingerprint": validation,
    }))
    if tensorboard:
        writer = SummaryWriter(str(run / "tb"))
        for step, loss in val.items():
            writer.add_scalar("loss/val", loss, step)
        writer.close()
    return run


@pytest.fixture(scope="session")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    """The valid inputs of every row: a token folder, a real run (trained here for two steps), its export, runs."""
    import io
    import logging

    from torchnlq.interop.export import export_safetensors
    from torchnlq.config.manager import load_job_config
    from torchnlq.config.render import to_toml
    from torchnlq.train.trainer import Trainer

    root = tmp_path_factory.mktemp("inputs")
    data = write_byte_data(root / "data")
    places = {"{tmp}": str(root), "{data}": str(data)}
    cfg = load_job_config([fill(a, places) for a in TRAIN])
    config = root / "train.toml"
    config.write_text(to_toml(cfg))
    # A real run folder, as the trainer leaves it: the resume rows break a real resume.
    with contextlib.redirect_stdout(io.StringIO()):
        Trainer(cfg).train()
    logger = logging.getLogger("torchnlq")  # setup_logging's handlers hold the run's train.log open
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    run = root / "outputs" / "run"
    ckpt = run / "checkpoints" / "step-2"
    export = export_safetensors(ckpt, root / "export")
    runs = root / "runs"
    write_compare_run(runs, "a", {10: 3.0, 20: 2.5})
    write_compare_run(runs, "b", {10: 2.9, 20: 2.4})
    write_compare_run(runs, "other_batches", {10: 2.9, 20: 2.4}, batch="bbbb")
    write_compare_run(runs, "other_val", {10: 2.9, 20: 2.4}, validation="wwww")
    write_compare_run(runs, "late", {30: 2.0})
    write_compare_run(runs, "no_tb", {10: 2.9}, tensorboard=False)
    return Inputs(root, data, run, ckpt, export, runs, config)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No launcher, no torchrun ranks, no tiktoken file from the caller's environment; datasets offline."""
    for var in (LAUNCH_DIR_ENV, "TORCHNLQ_TIKTOKEN_FILE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TORCHNLQ_WORLD_SIZE", "")  # recorded, so the NGPU=2 preflight's setting is undone
    return monkeypatch



def _subprocess_rows(session: pytest.Session) -> list[pytest.Item]:
    """The selected subprocess rows of the catalogue's files (another folder's tests may share the name)."""
    return [item for item in session.items if getattr(item, "originalname", "") == SUBPROCESS_TEST
            and getattr(item, "module", None) is not None and item.module.__name__.startswith("catalogue.")]


@pytest.fixture(scope="session")
def launched(request: pytest.FixtureRequest, inputs: Inputs,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launches]:
    """Start every selected subprocess row of every entry point at once (a few at a time), so their ~3 s starts
    overlap.

    Each row gets its own folder (cwd) and a cache folder outside it: TORCHNLQ_CACHE, HF_HOME,
    TIKTOKEN_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR are this test's caches, excluded by design.
    """
    selected = {item.nodeid: item.callspec.params["mistake"] for item in _subprocess_rows(request.session)}
    cache = tmp_path_factory.mktemp("subprocess-cache")
    base_env = script_env(cache)  # this Python first on PATH, OMP_NUM_THREADS=1, TORCHNLQ_CACHE=cache/cache
    for var, sub in (("HF_HOME", "hf"), ("TIKTOKEN_CACHE_DIR", "tiktoken"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        base_env[var] = str(cache / sub)
    for var in (LAUNCH_DIR_ENV, "TORCHNLQ_TIKTOKEN_FILE", "NGPU", "NNODES", "LOG_RANK", "STOP_TIMEOUT"):
        base_env.pop(var, None)
    inputs_before = snapshot(inputs.root)
    workers = os.cpu_count() or 2
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        rows: dict[str, Launched] = {}
        for node_id, mistake in selected.items():
            tmp = tmp_path_factory.mktemp("mistake")
            work = working_folder(tmp)
            places = inputs.places(work)
            if mistake.setup is not None:
                mistake.setup(work, inputs)
            program, program_env = command(mistake.entry)
            env = {**base_env, **program_env, **{name: fill(value, places) for name, value in mistake.env}}
            cmd = [*program, *(fill(a, places) for a in mistake.argv)]
            rows[node_id] = Launched(tmp, places, snapshot(tmp), pool.submit(run_process, cmd, work, env))
        yield Launches(rows, inputs_before)


@pytest.fixture(scope="session", autouse=True)
def start_the_subprocess_rows_first(request: pytest.FixtureRequest) -> None:
    """Start the subprocess rows before the in-process ones when both are selected.

    The in-process rows keep one core busy; the processes run on the others meanwhile (on a
    2-core CI machine this hides most of their cost). Nothing starts under -m "not integration".
    Under pytest-xdist every worker collects every row but only one runs them (their xdist group): there the
    first row starts them all, and no other worker starts any.
    """
    if _subprocess_rows(request.session) and not os.environ.get("PYTEST_XDIST_WORKER"):
        request.getfixturevalue("launched")
