"""A real full disk and a real read-only folder (issue 31.2), not an injected OSError.

A tmpfs of a drawn size is mounted where a run folder, an export's OUT or prepare_data.py's --out lives,
so the disk fills wherever it happens to (torch's zip writer and DCP's threads in a save, TensorBoard's
thread, train.log, run_info.json, datasets' cache, the token files). Every entry point then ends with
exactly one ``error:`` line naming a path on that disk and what to do, exit 2, no traceback, and nothing
half-written left where a later start would take it for a result; after the disk grows, the same command
finishes the work. Mounting needs root (as on the development machines and in CI); elsewhere these skip.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torchnlq.checkpoint.checkpointer import list_checkpoints, step_folders
from torchnlq.cli import run_cli
from torchnlq.interop.load import load_model
from torchnlq.train.__main__ import main as train_main

from helpers.checkpoints import load_script
from helpers.train import tiny_args

SETTINGS = dict(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
FULL = "the disk is full"


def mount(folder: Path, options: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def can_mount(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip unless this process may mount a tmpfs (root, with the capability: not in every container)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    probe = tmp_path_factory.mktemp("probe")
    try:
        mount(probe, "size=16k")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here ({e})")
    subprocess.run(["umount", str(probe)], check=True)


@contextlib.contextmanager
def small_disk(size_kib: int, read_only: bool = False) -> Iterator[Path]:
    """A new folder on a tmpfs of ``size_kib`` KiB (``read_only``: mounted read-only), unmounted at the end."""
    folder = Path(tempfile.mkdtemp(prefix="disk-"))
    mount(folder, f"size={size_kib}k" + (",ro" if read_only else ""))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        folder.rmdir()


def grow(disk: Path, size_kib: int = 16384) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_kib}k", str(disk)], check=True)


def run(capfd: pytest.CaptureFixture[str], main, argv: list[str]) -> tuple[int, str, str]:  # noqa: ANN001
    """An entry point's ``main`` through run_cli, in this process: (exit code, stdout, stderr)."""
    capfd.readouterr()
    code = run_cli(main, argv)
    out, err = capfd.readouterr()
    return code, out, err


def one_error_line(code: int, err: str, *fragments: str) -> str:
    """Exit 2 and exactly one ``error:`` line (progress bars aside) holding ``fragments``; returns it."""
    assert "Traceback" not in err and "Exception" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1, (code, err)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def everything_below(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ------------------------------------------------------------------ training


@pytest.mark.integration  # trains (in this process), a few seconds per example
@settings(max_examples=6, **SETTINGS)
@given(size_kib=st.integers(8, 1900))
@example(size_kib=900)  # the second save fails: the first is the resume point
def test_a_run_on_a_disk_that_fills_stops_with_one_line_and_the_same_command_finishes(
    can_mount: None, tmp_path_factory: pytest.TempPathFactory, capfd: pytest.CaptureFixture[str], size_kib: int,
) -> None:
    """The disk fills at a drawn moment (a checkpoint is ~740 KiB: from config.toml to the second save)."""
    data = tmp_path_factory.getbasetemp() / "full-disk-data"  # shared: the synthetic corpus, off the small disk
    with small_disk(size_kib) as disk:
        args = [*tiny_args(disk, steps=8), f"--data.path={data}", "--metrics.tensorboard=true"]
        folder = disk / "outputs" / "run" / "checkpoints"
        code, _, err = run(capfd, train_main, args)
        if code == 0:  # it fitted
            assert list_checkpoints(folder) == [4, 8]
            return
        line = one_error_line(code, err, str(disk), FULL)
        complete = list_checkpoints(folder)
        assert step_folders(folder) == complete  # no step-N folder is half a checkpoint
        assert not list(folder.glob("*.partial")) if folder.is_dir() else True  # a failed save removed its own
        if "resume point" in line:  # the one it names is the last complete one
            assert f"the last complete checkpoint, step-{complete[-1]}, is the resume point" in line
        grow(disk)
        code, out, err = run(capfd, train_main, args)  # the same command, without --job.rerun
        assert code == 0, err
        assert list_checkpoints(folder)[-1] == 8
        if complete:
            assert f"resumed from {folder / f'step-{complete[-1]}'} (step {complete[-1]}," in out


# ------------------------------------------------------------------ export


@settings(max_examples=5, **SETTINGS)
@given(size_kib=st.integers(4, 400))
def test_an_export_onto_a_disk_that_fills_is_one_line_and_leaves_nothing(
    can_mount: None, exportable: Path, capfd: pytest.CaptureFixture[str], size_kib: int,
) -> None:
    """An export of ~200 KiB: a disk too small is one line naming OUT, and no temporary folder stays."""
    convert = load_script("convert_checkpoint")
    with small_disk(size_kib) as disk:
        out = disk / "export"
        code, _, err = run(capfd, convert.main, [str(exportable), str(out), "--format", "safetensors"])
        if code == 0:
            assert load_model(out).args.n_layers == 2
            return
        one_error_line(code, err, f"'{out}'", FULL)
        assert everything_below(disk) == []


def test_an_export_into_a_read_only_folder_is_one_line(can_mount: None, exportable: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    convert = load_script("convert_checkpoint")
    with small_disk(64, read_only=True) as disk:
        code, _, err = run(capfd, convert.main, [str(exportable), str(disk / "export"), "--format", "safetensors"])
        one_error_line(code, err, str(disk), "read-only file system: write elsewhere")


@pytest.fixture(scope="module")
def exportable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of a tiny model (written with the test helpers, not by training)."""
    from helpers.checkpoints import tiny_model, write_checkpoint

    folder = tmp_path_factory.mktemp("exportable") / "step-7"
    write_checkpoint(folder, tiny_model())
    return folder


# ------------------------------------------------------------------ prepare_data.py


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~150 KB of paragraphs: ~150k byte tokens, whose token files and datasets' cache outgrow a small disk."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    path.write_text("".join(" ".join(words[(i * 7 + j) % 10] for j in range(25)) + "\n\n" for i in range(900)))
    return path


@settings(max_examples=6, **SETTINGS)
@given(size_kib=st.integers(4, 1200), cache_on_the_disk=st.booleans())
def test_prepare_onto_a_disk_that_fills_is_one_line_and_leaves_nothing(
    can_mount: None, corpus: Path, capfd: pytest.CaptureFixture[str], size_kib: int, cache_on_the_disk: bool,
) -> None:
    """--out (and datasets' cache, by default inside it) on a small disk; the token files were a memory map,
    whose page that cannot be stored killed the process with SIGBUS: now one line, and nothing stays."""
    prepare = load_script("prepare_data")
    with small_disk(size_kib) as disk, tempfile.TemporaryDirectory() as elsewhere:
        out = disk / "data"
        cache = [] if cache_on_the_disk else ["--cache-dir", elsewhere]
        argv = ["--out", str(out), "--files", str(corpus), "--tokenizer", "byte", "--text-split", "paragraph",
                "--val-fraction", "0.1", "--num-proc", "1", *cache]
        code, _, err = run(capfd, prepare.main, argv)
        if code == 0:
            made = sorted(p.name for p in out.iterdir() if p.name != "hf_cache")
            assert made == ["meta.json", "train.bin", "val.bin"]
            return
        one_error_line(code, err, str(out), FULL)
        assert everything_below(disk) == []  # prepare removes what it created


def test_prepare_into_a_read_only_folder_is_one_line(can_mount: None, corpus: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    prepare = load_script("prepare_data")
    with small_disk(64, read_only=True) as disk:
        argv = ["--out", str(disk / "data"), "--files", str(corpus), "--tokenizer", "byte", "--num-proc", "1"]
        code, _, err = run(capfd, prepare.main, argv)
        one_error_line(code, err, str(disk / "data"), "read-only file system: write elsewhere")
