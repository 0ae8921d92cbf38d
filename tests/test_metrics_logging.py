"""What a run logs: the resolved config and hparams in TensorBoard, the same scalars in Weights & Biases,
and the documented list of every tag (docs/monitoring.md).

Everything is checked by reading the files back with readers that do not share code with the
writers: TensorBoard's ``EventAccumulator`` (and, once, TensorBoard's own HTTP server), and a
small reader of W&B's offline ``.wandb`` files written here from the format (a LevelDB-style
log of protobuf records; wandb 0.31 ships no Python reader). The expected values come from the
config each test sets, not from the code under test.

W&B always runs offline here: WANDB_MODE=offline and its folders inside the test's tmp dir,
and no API key, so nothing can reach the network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import REPO_ROOT
from helpers.train import run_train, scalars, tiny_args, tiny_config

from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.train.metrics import run_hparams
from torchnlq.train.preflight import check_job_config, config_warnings

DOC = REPO_ROOT / "docs" / "monitoring.md"

# ----- W&B's offline files, read from their format -----------------------------------------------------

_BLOCK = 32 * 1024  # the log is written in 32 KiB blocks
_HEADER = 7  # a record's header: crc32 (4 bytes), length (2), type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of one ``run-<id>.wandb`` file, in order.

    The file starts with a 7-byte header (``:W&B``, magic, version); then records, each with a
    7-byte header, split across 32 KiB blocks as FIRST/MIDDLE/LAST pieces; a block's tail shorter
    than a header is padding.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, pending, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left
            continue
        chunk = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
    out = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def offline_runs(run_dir: Path) -> list[Path]:
    """The ``offline-run-*`` folders of a run, oldest first (W&B names them by start time, then a suffix)."""
    return sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda p: (p.name.split("-")[2], len(p.name), p.name))


def wandb_file(folder: Path) -> Path:
    (path,) = folder.glob("run-*.wandb")
    return path


def wandb_history(folders: list[Path]) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the history rows of these offline runs (W&B's own ``_*`` keys left out)."""
    history: dict[str, dict[int, float]] = {}
    for folder in folders:
        for record in wandb_records(wandb_file(folder)):
            if record.WhichOneof("record_type") != "history":
                continue
            step = record.history.step.num
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    history.setdefault(key, {})[step] = json.loads(item.value_json)
    return history


def wandb_run(folder: Path) -> tuple[Any, dict[str, Any]]:
    """The run record of an offline run and its config (``{key: value}``, later config updates applied)."""
    run, config = None, {}
    for record in wandb_records(wandb_file(folder)):
        kind = record.WhichOneof("record_type")
        if kind == "run" and run is None:
            run = record.run
            updates = record.run.config.update
        elif kind == "config":
            updates = record.config.update
        else:
            continue
        for item in updates:
            config[item.key] = json.loads(item.value_json)
    assert run is not None, folder
    return run, config


# ----- TensorBoard, read back -------------------------------------------------------------------------

def tb_events(tb_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def tb_texts(tb_dir: Path) -> dict[str, list[tuple[int, str]]]:
    """Text summaries as ``{tag: [(step, markdown), ...]}``."""
    from tensorboard.util import tensor_util

    acc = tb_events(tb_dir)
    tags = acc.PluginTagToContent("text")
    return {tag: [(e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()) for e in acc.Tensors(tag)]
            for tag in tags}


def tb_hparams(tb_dir: Path) -> tuple[dict[str, Any], list[int], int | None]:
    """The session start's hparams (as Python values), the steps of its events, and the session end's status."""
    from google.protobuf import json_format
    from tensorboard.plugins.hparams import metadata

    acc = tb_events(tb_dir)
    content = acc.PluginTagToContent("hparams")
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    values = {name: json_format.MessageToDict(value) for name, value in start.hparams.items()}
    steps = [e.step for e in acc.Tensors(metadata.SESSION_START_INFO_TAG)]
    end = None
    if metadata.SESSION_END_INFO_TAG in content:
        end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG]).status
    return values, steps, end


def all_tags(tb_dir: Path) -> set[str]:
    """Every tag of the event files: scalars and tensor summaries (text, hparams)."""
    tags = tb_events(tb_dir).Tags()
    return set(tags["scalars"]) | set(tags["tensors"])


def documented_tags() -> set[str]:
    """The tags in the first column of docs/monitoring.md's tag tables (``| `tag` | when | unit | meaning |``)."""
    tags = set()
    in_tags = False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            in_tags = line.strip() == "## The tags"
        match = re.match(r"\| `([^`]+)` \|", line)
        if in_tags and match:
            tags.add(match.group(1))
    return tags


def assert_documented(tags: set[str]) -> None:
    """Each written tag (layer numbers as ``{i}``) has its row in docs/monitoring.md."""
    documented = documented_tags()
    assert len(documented) > 15  # the table was found
    # Layer numbers as {i}; the query matrix of a weights/ tag (w_q, w1, w2) as {w}.
    generic = {re.sub(r"^(weights/(?:layer\{i\}|mean))/(?:w_q|w1|w2)/", r"\1/{w}/", re.sub(r"/layer\d+/", "/layer{i}/", tag))
               for tag in tags}
    missing = sorted(generic - documented)
    assert not missing, f"tags written by a run but missing from {DOC.relative_to(REPO_ROOT)}: {missing}"


def test_the_readme_points_to_the_documented_tags() -> None:
    """The README sends readers to docs/monitoring.md for the tags, and that page's tables list them.

    Every tag a short run writes must have its row there (``assert_documented`` in the run tests);
    this checks the link and that the tables are found and hold the core tags of every group.
    """
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/monitoring.md)" in readme, "README.md does not link to docs/monitoring.md"
    documented = documented_tags()
    assert len(documented) > 15  # the table was found
    core = {"loss/train", "loss/val", "lr", "grad_norm", "throughput/tokens_per_s", "throughput/mfu",
            "memory/peak_gib", "tokens_seen", "query/layer{i}/f_ratio", "query/mean/f_ratio",
            "weights/layer{i}/{w}/sigma_max", "weights/mean/{w}/sigma_max", "config/toml"}
    missing = sorted(core - documented)
    assert not missing, f"tags missing from {DOC.relative_to(REPO_ROOT)}'s tables: {missing}"


# ----- the runs -----------------------------------------------------------------------------------------

def wandb_env(root: Path) -> dict[str, str]:
    """W&B offline, every folder of its own inside ``root``: nothing outside the test, nothing online."""
    return {
        "WANDB_MODE": "offline", "WANDB_DIR": str(root / "wandb_dir"), "WANDB_CACHE_DIR": str(root / "wandb_cache"),
        "WANDB_CONFIG_DIR": str(root / "wandb_config"), "WANDB_DATA_DIR": str(root / "wandb_data"),
        "WANDB_SILENT": "true",
    }


@contextlib.contextmanager
def offline_wandb(root: Path) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in wandb_env(root).items():
            mp.setenv(key, value)
        mp.delenv("WANDB_API_KEY", raising=False)
        yield


@pytest.fixture(scope="module", autouse=True)
def _stop_wandb_service() -> Iterator[None]:
    """W&B's background service outlives its runs: stop it after this module's runs."""
    yield
    if sys.modules.get("wandb") is not None:
        sys.modules["wandb"].teardown()


def quiet_train(cfg: Any) -> Any:
    from torchnlq.train.trainer import Trainer

    with contextlib.redirect_stdout(io.StringIO()):
        trainer = Trainer(cfg)
        trainer.train()
    return trainer


#: The run the tests read: settings that differ from the defaults, so a value read back is this config's.
RUN = {
    "training__seed": 7,
    "data__seed": 11,
    "optimizer__lr": 2e-3,
    "optimizer__weight_decay": 0.05,
    "lr_schedule__warmup_steps": 1,
    "model__query__activation": "silu",
    "model__query__bottleneck_ratio": 0.25,
    "validation__interval": 2,
    "checkpoint__interval": 2,
    "metrics__query_diagnostics_interval": 2,
    "metrics__weight_dynamics_interval": 2,
    "metrics__peak_tflops": 1.0,
    "metrics__wandb": True,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A 4-step tiny run with W&B offline, query diagnostics, validation and checkpoints every 2 steps."""
    tmp = tmp_path_factory.mktemp("logged")
    cfg = tiny_config(tmp, "logged", steps=4, **RUN)
    with offline_wandb(tmp):
        quiet_train(cfg)
    return tmp / "outputs" / "logged", cfg


# ----- TensorBoard: the config and the hparams ----------------------------------------------------------

@pytest.mark.integration
def test_the_config_text_is_the_run_config_toml(run: tuple[Path, Any]) -> None:
    run_dir, _ = run
    saved = (run_dir / "config.toml").read_text()
    texts = tb_texts(run_dir / "tb")
    assert list(texts) == ["config/toml"]
    ((step, markdown),) = texts["config/toml"]
    assert step == 0
    assert markdown == "```toml\n" + saved.rstrip("\n") + "\n```"


@pytest.mark.integration
def test_the_hparams_are_the_configs_values(run: tuple[Path, Any]) -> None:
    run_dir, _ = run
    hparams, steps, end = tb_hparams(run_dir / "tb")
    assert steps == [0]
    expected = {
        "job.name": "logged", "model.flavor": "debug", "model.query.type": "residual_mlp",
        "model.query.activation": RUN["model__query__activation"],
        "model.query.bottleneck_ratio": RUN["model__query__bottleneck_ratio"], "model.query.input_norm": "rms",
        "model.query.output_norm": "layer", "model.query.half_scale": True,
        "model.n_layers": 2, "model.dim": 32, "model.n_heads": 2, "model.n_kv_heads": 2,
        "optimizer.lr": RUN["optimizer__lr"], "optimizer.weight_decay": RUN["optimizer__weight_decay"],
        "lr_schedule.warmup_steps": RUN["lr_schedule__warmup_steps"],
        "lr_schedule.decay_steps": 4, "training.steps": 4, "training.micro_batch_size": 4,
        "training.grad_accum_steps": 2, "training.seq_len": 32,
        "training.seed": str(RUN["training__seed"]), "data.seed": str(RUN["data__seed"]), "validation.seed": "2357",
        "run.world_size": 1, "run.global_batch": 8, "run.tokens_per_step": 8 * 32, "run.precision": "fp32",
    }
    for name, value in expected.items():
        assert hparams.get(name) == value, (name, hparams.get(name), value)
    assert hparams["run.params"] > 0
    from tensorboard.plugins.hparams import api_pb2

    assert end == api_pb2.Status.STATUS_SUCCESS


def test_hparams_name_only_the_knobs_a_query_type_reads(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, model__query__type="linear")
    hparams = run_hparams(cfg, check_job_config(cfg), world_size=2, global_batch=16, tokens_per_step=512,
                          precision="bf16")
    assert not [name for name in hparams if name.startswith("model.query.") and name != "model.query.type"]
    assert hparams["model.query.type"] == "linear" and hparams["run.world_size"] == 2
    assert all(isinstance(v, (bool, int, float, str)) for v in hparams.values())  # what TensorBoard takes
    big = tiny_config(tmp_path, training__seed=2**64 - 1)
    assert run_hparams(big, check_job_config(big), world_size=1, global_batch=8, tokens_per_step=256,
                       precision="fp32")["training.seed"] == str(2**64 - 1)  # exact, as no float64 is


# ----- W&B: the same scalars, the config -----------------------------------------------------------------

@pytest.mark.integration
def test_wandb_logs_the_tensorboard_scalars_at_the_same_steps(run: tuple[Path, Any]) -> None:
    run_dir, _ = run
    folders = offline_runs(run_dir)
    assert len(folders) == 1 and folders[0].parent == run_dir / "wandb"
    history = wandb_history(folders)
    tb = scalars(run_dir / "tb")
    assert {"loss/train", "loss/val", "throughput/mfu", "query/mean/f_ratio", "checkpoint/blocked_s"} <= set(tb)
    assert set(history) == set(tb)
    for tag, values in tb.items():
        assert set(history[tag]) == set(values), tag
        for step, value in values.items():
            # TensorBoard keeps a float32 of the same Python float W&B keeps whole.
            assert np.float32(history[tag][step]) == np.float32(value), (tag, step, history[tag][step], value)


@pytest.mark.integration
def test_wandb_holds_the_resolved_config_and_the_run_id_of_the_folder(run: tuple[Path, Any], tmp_path: Path) -> None:
    run_dir, cfg = run
    (folder,) = offline_runs(run_dir)
    record, config = wandb_run(folder)
    assert record.display_name == "logged" and record.project == "torchnlq"
    assert record.run_id == (run_dir / "wandb" / "run_id").read_text().strip()
    expected = json.loads(json.dumps(dataclasses.asdict(cfg)))  # the test's own config, through JSON
    for section, values in expected.items():
        assert config[section] == values, section
    assert config["run"] == {"world_size": 1, "global_batch": 8, "tokens_per_step": 256, "precision": "fp32",
                             "params": config["run"]["params"]}
    assert config["training"]["seed"] == 7 and config["model"]["query"]["activation"] == "silu"
    # Nothing in WANDB_DIR: the run's W&B files are all in its own folder.
    assert not list((run_dir.parents[1] / "wandb_dir").glob("**/offline-run-*"))


@pytest.mark.integration
def test_every_tag_a_run_writes_is_documented(run: tuple[Path, Any]) -> None:
    run_dir, _ = run
    tags = all_tags(run_dir / "tb")
    assert {"loss/val_std", "query/layer1/gain_out", "_hparams_/session_end_info", "config/toml"} <= tags
    assert_documented(tags)


# ----- resume -------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_a_resume_writes_the_config_again_only_when_it_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchnlq.train.trainer import Trainer

    extra = {"checkpoint__interval": 4, "validation__interval": 4, "lr_schedule__decay_steps": 12,
             "metrics__wandb": True}
    with offline_wandb(tmp_path):
        # A run of 8 steps that dies right after saving step 4.
        first = Trainer(tiny_config(tmp_path, "resumed", steps=8, **extra))
        save = first.save_checkpoint

        def save_then_die() -> None:
            save()
            raise RuntimeError("killed after the save")

        monkeypatch.setattr(first, "save_checkpoint", save_then_die)
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(RuntimeError, match="killed"):
            first.train()
        quiet_train(tiny_config(tmp_path, "resumed", steps=8, **extra))  # the same config: resumes at 4
        quiet_train(tiny_config(tmp_path, "resumed", steps=12, **extra))  # more steps: resumes at 8

    run_dir = tmp_path / "outputs" / "resumed"
    saved = (run_dir / "config.toml").read_text()
    texts = tb_texts(run_dir / "tb")
    assert [step for step, _ in texts["config/toml"]] == [0, 8]  # nothing at the unchanged resume (step 4)
    first_text, last_text = texts["config/toml"][0][1], texts["config/toml"][1][1]
    assert last_text == "```toml\n" + saved.rstrip("\n") + "\n```"
    assert "steps = 8\n" in first_text and "steps = 12\n" in last_text
    ((step, changes),) = texts["config/resume_changes"]
    assert step == 8 and changes == "- training.steps changed on resume: 8 -> 12"
    hparams, steps, _ = tb_hparams(run_dir / "tb")
    assert steps == [0] and hparams["training.steps"] == 8  # written once: the run's first start

    # W&B: one run id for the folder, one offline folder per start, and together the TensorBoard curves.
    folders = offline_runs(run_dir)
    assert len(folders) == 3
    run_id = (run_dir / "wandb" / "run_id").read_text().strip()
    assert {wandb_run(f)[0].run_id for f in folders} == {run_id}
    history, tb = wandb_history(folders), scalars(run_dir / "tb")
    assert set(history) == set(tb)
    for tag in tb:
        assert {s: np.float32(v) for s, v in history[tag].items()} == {s: np.float32(v) for s, v in tb[tag].items()}
    assert set(tb["loss/train"]) == set(range(1, 13))
    assert_documented(all_tags(run_dir / "tb"))


# ----- mistakes: one error line, before anything is written ----------------------------------------------

def _train_cli(argv: list[str]) -> int:
    from torchnlq.train.__main__ import main

    return run_cli(main, argv)


def test_wandb_without_the_package_is_one_error_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a module as not importable
    code = _train_cli(tiny_args(tmp_path, steps=2, metrics__wandb=True))
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err == [("error: metrics.wandb = true needs the wandb package: pip install 'torchnlq[wandb]' "
                    "(or set metrics.wandb = false)")]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--metrics.wandb_mode=ofline"], "metrics.wandb_mode: 'ofline' is not one of online, offline, disabled"),
    (["--metrics.wandb=true", "--metrics.wandb_project=team/proj"], "metrics.wandb_project='team/proj' contains /"),
    (["--metrics.wandb=true", "--metrics.wandb_project= "], "metrics.wandb_project=' ' is empty"),
    (["--metrics.wandb=maybe"], "--metrics.wandb expects true or false, got 'maybe'"),
])
def test_bad_wandb_options_are_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str,
) -> None:
    code = _train_cli([*tiny_args(tmp_path, steps=2), *argv])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err
    assert not (tmp_path / "outputs").exists()


def test_wandb_options_without_wandb_are_a_warning(tmp_path: Path) -> None:
    cfg = load_job_config(tiny_args(tmp_path, metrics__wandb_project="mine", metrics__wandb_mode="online"))
    (warning,) = [w for w in config_warnings(cfg) if "wandb" in w]
    assert warning.startswith("metrics.wandb_project, metrics.wandb_mode set but metrics.wandb = false")
    on = load_job_config(tiny_args(tmp_path, metrics__wandb=True, metrics__wandb_project="mine"))
    assert not [w for w in config_warnings(on) if "wandb" in w]


@pytest.mark.integration
def test_wandb_is_imported_only_by_a_run_that_uses_it(tmp_path: Path) -> None:
    # A fresh interpreter: this one has imported wandb already. The config check must find the
    # package without importing it, and the trainer's modules must not import it at all.
    code = (
        "import sys\n"
        "from torchnlq.train import trainer, metrics\n"
        "from torchnlq.train.preflight import check_job_config\n"
        "from torchnlq.config.manager import load_job_config\n"
        f"check_job_config(load_job_config({tiny_args(tmp_path, metrics__wandb=True)!r}))\n"
        "print('wandb' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"


class _FakeWandb:
    """A stand-in ``wandb`` module whose ``init`` fails as an online run without a login does."""

    class Settings(dict):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(kwargs)

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def init(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)
        raise RuntimeError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")


def test_wandb_that_cannot_start_is_one_user_error_and_frees_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchnlq.train.run_lock import RunLock
    from torchnlq.train.trainer import Trainer

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = tiny_config(tmp_path, "online", steps=2, metrics__wandb=True, metrics__wandb_mode="online",
                      metrics__wandb_run_name="shown", metrics__wandb_entity="team")
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(UserError) as raised:
        Trainer(cfg)
    message = str(raised.value)
    assert "\n" not in message and "api_key not configured" in message and "wandb login" in message
    assert "--metrics.wandb_mode=offline" in message
    (call,) = fake.calls
    assert call["mode"] == "online" and call["name"] == "shown" and call["entity"] == "team"
    assert call["project"] == "torchnlq" and call["dir"] == str(tmp_path / "outputs" / "online")
    RunLock(tmp_path / "outputs" / "online").check_free()  # released: the corrected command can run


# ----- only rank 0 ----------------------------------------------------------------------------------------

@pytest.mark.integration
def test_two_processes_log_once_from_rank_0(tmp_path: Path) -> None:
    env = wandb_env(tmp_path)
    args = tiny_args(tmp_path, "two", steps=2, training__grad_accum_steps=1, metrics__wandb=True,
                     validation__interval=2)
    proc = run_train(tmp_path, *args, ngpu=2, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "two"
    assert len(list((run_dir / "tb").glob("events.out.tfevents.*"))) == 1
    folders = offline_runs(run_dir)
    assert len(folders) == 1
    history, tb = wandb_history(folders), scalars(run_dir / "tb")
    assert set(history) == set(tb) and history["loss/train"].keys() == {1, 2}
    assert wandb_run(folders[0])[1]["run"]["world_size"] == 2
    assert not list(Path(env["WANDB_DIR"]).glob("**/offline-run-*"))


# ----- TensorBoard's own server, when it starts here ------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, body: dict | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.mark.integration
def test_tensorboard_serves_the_config_text_and_the_hparams_with_the_final_validation_loss(
    run: tuple[Path, Any],
) -> None:
    run_dir, _ = run
    port = _free_port()
    tensorboard = Path(sys.executable).parent / "tensorboard"
    server = subprocess.Popen(
        [str(tensorboard), "--logdir", str(run_dir.parent), "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "HOME": str(run_dir.parents[1])},
    )
    base = f"http://127.0.0.1:{port}/data/plugin"
    try:
        deadline, tags = time.monotonic() + 20, {}
        while time.monotonic() < deadline and server.poll() is None and not tags:
            with contextlib.suppress(OSError):
                tags = _get(f"{base}/text/tags")
            time.sleep(0.5)
        if not tags:
            pytest.skip("TensorBoard's server did not answer within 20 s here")
        assert tags == {"logged/tb": ["config/toml"]}
        (text,) = _get(f"{base}/text/text?run=logged/tb&tag=config/toml")
        assert text["step"] == 0 and "<pre><code" in text["text"] and "silu" in text["text"]
        groups = _get(f"{base}/hparams/session_groups", {
            "experimentName": "", "startIndex": 0, "sliceSize": 10, "colParams": [],
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
        })
        (group,) = groups["sessionGroups"]
        assert group["hparams"]["model.query.activation"] == "silu" and group["hparams"]["optimizer.lr"] == 2e-3
        assert group["sessions"][0]["status"] == "STATUS_SUCCESS"
        metrics = {m["name"]["tag"]: m for m in group["metricValues"]}
        last_val = scalars(run_dir / "tb")["loss/val"]
        assert metrics["loss/val"]["trainingStep"] == max(last_val) == 4
        assert math.isclose(metrics["loss/val"]["value"], last_val[4], rel_tol=1e-7)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


def test_the_eta_counts_the_validations_still_to_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remaining steps at the measured training speed, plus each remaining validation at its measured length."""
    import logging

    import torch

    from torchnlq.train import metrics as metrics_module
    from torchnlq.train.metrics import MetricsLogger, ValidationPlan

    plan = ValidationPlan(interval=40, total_steps=100, forwards_per_validation=30, train_forwards_per_step=2)
    # After step s: the validations at 40, 80 and the last step (100) that are still ahead.
    assert [plan.left_after(s) for s in (0, 39, 40, 79, 80, 99, 100)] == [3, 3, 2, 2, 1, 1, 0]
    assert ValidationPlan(50, 100, 1, 1).left_after(60) == 1  # 100 is both a multiple and the last step

    clock = [1000.0]
    monkeypatch.setattr(metrics_module.time, "perf_counter", lambda: clock[0])
    logger = MetricsLogger(logging.getLogger("eta-test"), None, torch.device("cpu"), 1, None, total_steps=100)
    logger.validation_plan = plan
    clock[0] += 10.0  # 10 steps in 10 s: 1 s per step (0.5 s per micro-batch)
    # No validation measured yet: 30 forwards at a third of a training micro-batch each = 5 s per validation.
    assert logger.seconds_left(10, clock[0]) == pytest.approx(90 * 1.0 + 3 * 5.0)
    logger.log_validation(40, 2.0, 0.1, seconds=12.0)  # a validation really takes 12 s
    clock[0] += 30.0 + 12.0  # 30 more steps and that validation
    assert logger.seconds_left(40, clock[0]) == pytest.approx(60 * 1.0 + 2 * 12.0)


def test_the_step_line_names_its_memory_figure_and_writes_it_as_the_estimate_does(
        caplog: pytest.LogCaptureFixture) -> None:
    """On the CPU the step line's memory is the process's peak RSS ("peak rss"), in the estimate's units."""
    import logging
    import resource

    import torch

    from torchnlq.parallel.device_figures import resident_bytes
    from torchnlq.train.metrics import MetricsLogger

    log = logging.getLogger("memory-line-test")
    logger = MetricsLogger(log, None, torch.device("cpu"), 1, None, total_steps=10)
    logger.count_tokens(100)
    with caplog.at_level(logging.INFO, logger="memory-line-test"):
        logger.log_step(1, 2.0, 1e-3, 0.5, 100)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    shown = re.search(r"  peak rss ([0-9.]+) (MiB|GiB)  ", caplog.records[-1].getMessage())
    assert shown is not None, caplog.records[-1].getMessage()
    value = float(shown.group(1)) * 2 ** (20 if shown.group(2) == "MiB" else 30)
    assert shown.group(2) == ("GiB" if peak >= 2**30 else "MiB") and value == pytest.approx(peak, rel=0.01)
    assert 0 < resident_bytes() <= peak * 1.01  # resident now is at most the peak so far


def test_a_resume_in_the_same_second_is_read_after_the_earlier_file(tmp_path: Path) -> None:
    """TensorBoard reads a folder's event files in name order and purges events whose step goes back. A file
    named for the same second that sorts after a new writer's (a higher pid or counter, as strings) must not
    make the resumed steps vanish: the new writer's file sorts last, and every step reads back."""
    import logging

    import torch

    from torchnlq.train.metrics import MetricsLogger

    tb = tmp_path / "tb"
    first = MetricsLogger(logging.getLogger("t"), tb, torch.device("cpu"), 1, None, 9)
    for step in range(1, 7):
        first.scalar("loss/train", float(step), step)
    first.close()
    (written,) = tb.glob("events.out.tfevents.*")
    _, _, _, _, host, pid, counter = written.name.split(".", 6)
    stamp = int(time.time())  # the same second as the resume below, and a name that sorts after its own
    written.rename(tb / f"events.out.tfevents.{stamp:010d}.{host}.~{pid}.{counter}")
    resumed = MetricsLogger(logging.getLogger("t"), tb, torch.device("cpu"), 1, None, 9, start_step=6)
    for step in range(7, 10):
        resumed.scalar("loss/train", float(step), step)
    resumed.close()
    names = sorted(p.name for p in tb.glob("events.out.tfevents.*"))
    assert len(names) == 2 and "~" in names[0]
    assert scalars(tb)["loss/train"] == {step: float(step) for step in range(1, 10)}
