"""Reading a checkpoint or an export runs no code from it (torchnlq/checkpoint/safe_reader.py).

A real checkpoint (two trainer steps) gets a pickle payload planted in one of its files at a
time: ``.metadata``, ``rng-rank0.pt``, every slot of every ``*.distcp`` shard, ``torchnlq.json``;
an export gets one in ``config.json``, ``model.safetensors`` or ``tokenizer_config.json``. The
payload would create a marker file when unpickled (a control test proves each plant is live for
the stock readers). Every entry point that reads a checkpoint or an export must leave the marker
absent, and must say in one line (UserError; exit code 2 and one ``error:`` line for the scripts)
what is wrong when it reads the planted file; the entry points that never open that file load
normally.
"""

from __future__ import annotations

import io
import pathlib
import pickle
import random
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

import torchnlq
from torchnlq.checkpoint.checkpointer import RNG_FORMAT, load_rng_state, rng_state, set_rng_state
from torchnlq.interop.export import export_safetensors
from torchnlq.interop.load import load_model
from torchnlq.checkpoint.safe_reader import METADATA_GLOBALS, read_safe_metadata
from torchnlq.errors import UserError
from torchnlq.inference.evaluation import evaluate_source
from torchnlq.train.trainer import Trainer

from helpers import REPO_ROOT
from helpers.checkpoints import load_script
from helpers.train import script_env, tiny_config

MARKER = "PLANTED_PAYLOAD_RAN"


class Payload:
    """Unpickling this creates ``marker`` (what a planted file could do with any other call)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def legacy_payload(marker: Path) -> bytes:
    """The payload as a pre-zip ``torch.save`` file: torch.load unpickles it before reading on."""
    buf = io.BytesIO()
    torch.save(Payload(marker), buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


# ---------------------------------------------------------------- the source run, built once

@dataclass
class Source:
    base: Path
    run: Path  # outputs/src: the run folder (resume copies it)
    ckpt: Path  # its checkpoints/step-2
    export: Path
    data: Path


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    base = tmp_path_factory.mktemp("safe_src")
    cfg = tiny_config(base, "src", steps=2, checkpoint__interval=2, validation__interval=2)
    Trainer(cfg).train()
    run = base / "outputs" / "src"
    ckpt = run / "checkpoints" / "step-2"
    export = export_safetensors(ckpt, base / "export")
    return Source(base, run, ckpt, export, base / "data")


def copy_run(src: Source, tmp: Path) -> Path:
    """A fresh copy of the source run folder under ``tmp/outputs/run``; returns its step-2."""
    run = tmp / "outputs" / "run"
    shutil.copytree(src.run, run)
    (run / ".lock").unlink(missing_ok=True)
    return run / "checkpoints" / "step-2"


# ---------------------------------------------------------------- plants

def plant_metadata(ckpt: Path, marker: Path) -> None:
    (ckpt / ".metadata").write_bytes(pickle.dumps(Payload(marker)))


def plant_rng(ckpt: Path, marker: Path) -> None:
    # Looks like the old format (NumPy's tuple included, whose globals the old-format reader allows).
    torch.save({"python": Payload(marker), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
               ckpt / "rng-rank0.pt")


def plant_distcp(ckpt: Path, marker: Path) -> None:
    """Overwrite every item of every shard in place with the payload, padded to the item's length."""
    payload = legacy_payload(marker)
    storage = read_safe_metadata(ckpt).storage_data
    planted: dict[str, int] = {}
    for info in storage.values():
        assert info.length >= len(payload), (info, len(payload))
        with open(ckpt / info.relative_path, "r+b") as f:
            f.seek(info.offset)
            f.write(payload + b"\0" * (info.length - len(payload)))
        planted[info.relative_path] = planted.get(info.relative_path, 0) + 1
    assert set(planted) == {p.name for p in ckpt.glob("*.distcp")}


def plant_json(ckpt: Path, marker: Path) -> None:
    (ckpt / "torchnlq.json").write_bytes(pickle.dumps(Payload(marker)))


CKPT_PLANTS: dict[str, Callable[[Path, Path], None] | None] = {
    "none": None,
    "metadata": plant_metadata,
    "rng": plant_rng,
    "distcp": plant_distcp,
    "json": plant_json,
}

# What each refusal says (the planted file, named or described).
CKPT_MESSAGES = {
    "metadata": "its .metadata holds pathlib.Path.touch, which torchnlq does not load (a planted or foreign file)",
    "rng": "is not a torchnlq RNG state (it holds",
    "distcp": "is not a torchnlq checkpoint: its shard __0_0.distcp holds",
    "json": "torchnlq.json' is corrupt",
}


def plant_export_file(name: str) -> Callable[[Path, Path], None]:
    def plant(export: Path, marker: Path) -> None:
        (export / name).write_bytes(pickle.dumps(Payload(marker)))
    return plant


EXPORT_PLANTS: dict[str, Callable[[Path, Path], None] | None] = {
    "none": None,
    "config": plant_export_file("config.json"),
    "safetensors": plant_export_file("model.safetensors"),
    "tokenizer": plant_export_file("tokenizer_config.json"),
}
# tokenizer_config.json is read only when config.json records no tokenizer (torchnlq's exports do).
EXPORT_READS = {"config", "safetensors"}


# ---------------------------------------------------------------- entry points

def expect_user_error(fn: Callable[[], object], reads: bool) -> str | None:
    """Run ``fn``: a one-line UserError when it reads the planted file, else success."""
    if not reads:
        fn()
        return None
    with pytest.raises(UserError) as e:
        fn()
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def run_script(name: str, argv: list[str], capsys: pytest.CaptureFixture, reads: bool) -> str | None:
    script = load_script(name)
    rc = script.run_cli(script.main, argv)
    err = capsys.readouterr().err
    if not reads:
        assert rc == 0, err
        return None
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def inference_entry_points(src: Source, path: Path, tmp: Path, capsys) -> dict[str, Callable[[bool], str | None]]:
    """Every tool that opens a checkpoint or an export for inference, as ``fn(reads) -> message``."""
    return {
        "load_pretrained": lambda reads: expect_user_error(lambda: torchnlq.load_pretrained(str(path)), reads),
        "load_model": lambda reads: expect_user_error(lambda: load_model(path), reads),
        "evaluate_source": lambda reads: expect_user_error(
            lambda: evaluate_source(path, src.data, sequences=4, micro_batch_size=2), reads),
        "convert_checkpoint.py": lambda reads: run_script(
            "convert_checkpoint", [str(path), str(tmp / "converted")], capsys, reads),
        "generate.py": lambda reads: run_script(
            "generate", [str(path), "--prompt", "ab", "--max-new-tokens", "2"], capsys, reads),
        "evaluate.py": lambda reads: run_script(
            "evaluate", [str(path), "--data", str(src.data), "--sequences", "4", "--micro-batch-size", "2"],
            capsys, reads),
    }


TRAINER_ENTRIES = ("resume", "initial_load_path", "initial_load_path_full")
INFERENCE_ENTRIES = ("load_pretrained", "load_model", "evaluate_source",
                     "convert_checkpoint.py", "generate.py", "evaluate.py")


def trainer_entry(src: Source, entry: str, tmp: Path, ckpt: Path, reads: bool) -> str | None:
    common = dict(steps=4, checkpoint__interval=2, validation__interval=2, data__path=src.data)
    if entry == "resume":  # the same run, again: resumes from its (planted) latest checkpoint
        cfg = tiny_config(tmp, "run", **common)
    else:  # a new run that starts from the planted checkpoint
        cfg = tiny_config(tmp, "new", **common, checkpoint__initial_load_path=ckpt,
                          checkpoint__initial_load_model_only=(entry == "initial_load_path"))
    return expect_user_error(lambda: Trainer(cfg), reads)


def reads_planted(plant: str, entry: str) -> bool:
    """Whether ``entry`` opens the file ``plant`` poisons (the RNG states: only a full resume)."""
    if plant == "none":
        return False
    if plant == "rng":
        return entry in ("resume", "initial_load_path_full")
    return True


# ---------------------------------------------------------------- the tests

@pytest.mark.integration
@pytest.mark.parametrize("entry", TRAINER_ENTRIES + INFERENCE_ENTRIES)
@pytest.mark.parametrize("plant", list(CKPT_PLANTS))
def test_planted_checkpoint_runs_nothing(source: Source, plant: str, entry: str, tmp_path: Path, capsys) -> None:
    ckpt = copy_run(source, tmp_path)
    marker = tmp_path / MARKER
    if CKPT_PLANTS[plant] is not None:
        CKPT_PLANTS[plant](ckpt, marker)
    reads = reads_planted(plant, entry)
    if entry in TRAINER_ENTRIES:
        message = trainer_entry(source, entry, tmp_path, ckpt, reads)
    else:
        message = inference_entry_points(source, ckpt, tmp_path, capsys)[entry](reads)
    assert not marker.exists(), f"the payload planted in {plant} ran through {entry}"
    if reads:
        assert message is not None and CKPT_MESSAGES[plant] in message, message
        assert str(ckpt) in message


@pytest.mark.integration
@pytest.mark.parametrize("entry", INFERENCE_ENTRIES)
@pytest.mark.parametrize("plant", list(EXPORT_PLANTS))
def test_planted_export_runs_nothing(source: Source, plant: str, entry: str, tmp_path: Path, capsys) -> None:
    export = Path(shutil.copytree(source.export, tmp_path / "export"))
    marker = tmp_path / MARKER
    if EXPORT_PLANTS[plant] is not None:
        EXPORT_PLANTS[plant](export, marker)
    reads = plant in EXPORT_READS
    message = inference_entry_points(source, export, tmp_path, capsys)[entry](reads)
    assert not marker.exists(), f"the payload planted in {plant} ran through {entry}"
    if reads:
        assert message is not None and str(export) in message, message


@pytest.mark.integration
def test_planted_metadata_in_a_subprocess(source: Source, tmp_path: Path) -> None:
    """The script as a user runs it: exit code 2, one ``error:`` line, no marker."""
    ckpt = copy_run(source, tmp_path)
    marker = tmp_path / MARKER
    plant_metadata(ckpt, marker)
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "generate.py"), str(ckpt), "--max-new-tokens", "2"],
        capture_output=True, text=True, env=script_env(tmp_path), timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: '{ckpt}' is not a torchnlq checkpoint: {CKPT_MESSAGES['metadata']}"
    ], r.stderr
    assert not marker.exists()


@pytest.mark.integration
def test_each_plant_is_live_for_the_stock_readers(source: Source, tmp_path: Path) -> None:
    """Control: what the tests plant does run under pickle.load / torch.load(weights_only=False) / stock DCP."""
    for plant in ("metadata", "rng", "distcp"):
        ckpt = copy_run(source, tmp_path / plant)
        marker = tmp_path / plant / MARKER
        CKPT_PLANTS[plant](ckpt, marker)
        if plant == "metadata":
            with open(ckpt / ".metadata", "rb") as f:
                pickle.load(f)
        elif plant == "rng":
            torch.load(ckpt / "rng-rank0.pt", weights_only=False)
        else:  # DCP's default planner torch.loads the optimizer's non-tensor items with weights_only=False
            meta = read_safe_metadata(ckpt)
            state = {k: None for k, v in meta.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
            assert state, "the checkpoint has non-tensor items (optimizer param_groups)"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    dcp.load(state, checkpoint_id=str(ckpt))
                except BaseException:  # the padding after the payload fails the read: the payload ran first
                    pass
        assert marker.exists(), plant


@pytest.mark.integration
def test_metadata_allow_list_covers_what_dcp_writes(source: Source) -> None:
    """Every global of a real .metadata is allowed, and nothing is imported to resolve one."""
    seen: set[tuple[str, str]] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            seen.add((module, name))
            return super().find_class(module, name)

    with open(source.ckpt / ".metadata", "rb") as f:
        Recorder(f).load()
    assert seen and seen <= set(METADATA_GLOBALS), seen - set(METADATA_GLOBALS)
    assert read_safe_metadata(source.ckpt).state_dict_metadata.keys() >= {"model.tok_emb.weight"}


@pytest.mark.integration
def test_rng_file_holds_only_tensors_and_plain_values(source: Source) -> None:
    state = torch.load(source.ckpt / "rng-rank0.pt", weights_only=True)  # no allow-list needed
    assert state["format"] == RNG_FORMAT
    assert state["python"]["state"].dtype == torch.int64 and state["numpy"]["keys"].shape == (624,)


# ---------------------------------------------------------------- RNG formats (no trainer: fast)

def draws() -> tuple:
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_rng_round_trip_through_weights_only(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.standard_normal()  # cached gaussians are part of the state
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = draws()
    draws()
    set_rng_state(load_rng_state(tmp_path / "rng.pt"))
    assert draws() == expected


def old_format_state() -> dict:
    """What torchnlq wrote before RNG_FORMAT 2: random.getstate() and np.random.get_state() as they are."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-numpy1-names"])
def test_old_format_rng_file_still_restores(tmp_path: Path, legacy: bool) -> None:
    random.seed(4), np.random.seed(5), torch.manual_seed(6)
    random.gauss(0, 1), np.random.standard_normal()
    path = tmp_path / "rng-rank0.pt"
    if legacy:  # as NumPy 1.x names its array reconstructor (numpy.core.multiarray)
        buf = io.BytesIO()
        torch.save(old_format_state(), buf, _use_new_zipfile_serialization=False)
        data = buf.getvalue()
        assert b"numpy._core.multiarray" in data
        path.write_bytes(data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    else:
        torch.save(old_format_state(), path)  # exactly as the old Checkpointer.save did
    expected = draws()
    draws()
    set_rng_state(load_rng_state(path))
    assert draws() == expected


def test_old_format_allow_list_lets_nothing_else_through(tmp_path: Path) -> None:
    marker = tmp_path / MARKER
    for i, state in enumerate([
        {**old_format_state(), "extra": Payload(marker)},
        {**old_format_state(), "numpy": ("MT19937", np.zeros(624, dtype=object), 0, 0, 0.0)},
        Payload(marker),
    ]):
        torch.save(state, tmp_path / f"rng{i}.pt")
        with pytest.raises(UserError, match="is not a torchnlq RNG state"):
            load_rng_state(tmp_path / f"rng{i}.pt")
    assert not marker.exists()
