"""One trainer per run folder: RunLock, and what a second trainer on a running run does."""

from __future__ import annotations

import errno
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from helpers.train import run_train, tiny_args, tiny_config

import torchnlq.train.run_lock as run_lock_mod
from torchnlq.errors import UserError
from torchnlq.train.run_lock import LOCK_FILE, RunLock, _read_holder

IN_USE = "run folder {} is in use by process {} on {} (started "

# ----- RunLock ---------------------------------------------------------------------------------


def test_second_acquire_fails_naming_the_holder_and_release_frees_it(tmp_path: Path) -> None:
    first = RunLock(tmp_path).acquire()
    assert first.held and (tmp_path / LOCK_FILE).is_file()
    # flock locks belong to an open file, so a second open of it conflicts even inside one process.
    with pytest.raises(UserError) as e:
        RunLock(tmp_path).acquire()
    message = str(e.value)
    assert message.startswith(IN_USE.format(tmp_path, os.getpid(), socket.gethostname()))
    assert message.endswith("wait for it to finish or stop it, or use another --job.name")
    assert "\n" not in message
    first.release()
    first.release()  # idempotent
    assert not first.held
    with RunLock(tmp_path) as again:
        assert again.held
    assert not again.held
    RunLock(tmp_path).acquire().release()


def test_check_free_names_the_holder_and_writes_nothing(tmp_path: Path) -> None:
    RunLock(tmp_path).check_free()  # no lock file: free, and none is created
    assert not (tmp_path / LOCK_FILE).exists()
    holder = RunLock(tmp_path).acquire()
    content = (tmp_path / LOCK_FILE).read_bytes()
    with pytest.raises(UserError, match=IN_USE.format(tmp_path, os.getpid(), socket.gethostname()).replace("(", r"\(")):
        RunLock(tmp_path).check_free()
    holder.release()
    RunLock(tmp_path).check_free()  # released: free again
    assert (tmp_path / LOCK_FILE).read_bytes() == content  # the last holder's line is untouched


def test_a_dropped_lock_is_released(tmp_path: Path) -> None:
    lock = RunLock(tmp_path).acquire()
    del lock
    gc.collect()
    RunLock(tmp_path).acquire().release()


def test_holder_not_written_yet_is_another_process(tmp_path: Path) -> None:
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        assert _read_holder(fd, attempts=2, pause_s=0) == "another process (its pid could not be read from the lock file)"
    finally:
        os.close(fd)


def test_a_filesystem_without_flock_runs_unlocked_with_a_warning(tmp_path: Path, monkeypatch) -> None:
    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_lock_mod.fcntl, "flock", no_locks)
    lock = RunLock(tmp_path).acquire()
    assert not lock.held and "does not support flock" in lock.warning


HOLDER = "import sys, time; from torchnlq.train.run_lock import RunLock; lock = RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(600)"


@pytest.mark.integration  # a subprocess
def test_lock_held_by_another_process_then_freed_by_sigkill(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=f"^run folder .* is in use by process {holder.pid} on "):
            RunLock(tmp_path).acquire()
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops the flock with the process
        assert holder.wait(timeout=30) == -signal.SIGKILL
        with RunLock(tmp_path) as lock:
            assert lock.held
    finally:
        holder.kill()
        holder.wait()


# ----- the trainer -----------------------------------------------------------------------------


@pytest.mark.integration  # builds trainers
def test_a_second_trainer_on_a_held_run_writes_nothing(tmp_path: Path) -> None:
    from torchnlq.train.trainer import Trainer

    first = Trainer(tiny_config(tmp_path, "busy", steps=4))
    run_dir = tmp_path / "outputs/busy"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    with pytest.raises(UserError, match=f"is in use by process {os.getpid()} "):
        Trainer(tiny_config(tmp_path, "busy", steps=8, optimizer__lr=1e-3))  # another config.toml
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    first.train()  # releases the lock at its end
    assert not first.run_lock.held
    again = Trainer(tiny_config(tmp_path, "busy", steps=8))
    assert again.step == 4
    again.close()
    Trainer(tiny_config(tmp_path, "busy", steps=8)).close()


@pytest.mark.integration  # builds trainers
def test_a_checkpoint_saved_while_the_trainer_started_is_refused(tmp_path: Path, monkeypatch) -> None:
    import torchnlq.train.trainer as trainer_mod
    from torchnlq.train.trainer import Trainer

    Trainer(tiny_config(tmp_path, "moved", steps=4)).train()
    checkpoints = tmp_path / "outputs/moved/checkpoints"
    config = (tmp_path / "outputs/moved/config.toml").read_text()
    real_start_run = trainer_mod.start_run

    def start_then_another_trainer_saves(*args, **kwargs):
        start = real_start_run(*args, **kwargs)
        shutil.copytree(checkpoints / "step-4", checkpoints / "step-8")  # as if saved before our lock
        return start

    monkeypatch.setattr(trainer_mod, "start_run", start_then_another_trainer_saves)
    with pytest.raises(UserError, match=r"changed while this trainer was starting \(it read step-4, now the latest "
                                        r"is step-8\)"):
        Trainer(tiny_config(tmp_path, "moved", steps=12, optimizer__lr=1e-3))
    assert (tmp_path / "outputs/moved/config.toml").read_text() == config
    RunLock(tmp_path / "outputs/moved").acquire().release()  # the refused trainer let the lock go


def _drain(proc: subprocess.Popen, lines: list[str]) -> threading.Thread:
    """Read a running trainer's output in the background, so a full pipe never stalls it."""
    thread = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    thread.start()
    return thread


@pytest.mark.integration  # two run_train.sh processes
def test_a_second_identical_command_exits_with_one_line_and_the_first_finishes(tmp_path: Path) -> None:
    # Enough steps to outlast the second trainer's start; stopped with SIGTERM (save, exit 0) once it is refused.
    args = tiny_args(tmp_path, "twice", steps=100_000, validation__interval=100_000, checkpoint__interval=100_000,
                     metrics__log_interval=1000)
    run_dir = tmp_path / "outputs/twice"
    first = run_train(tmp_path, *args, wait=False)
    output: list[str] = []
    reader = _drain(first, output)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "train.log").is_file():  # the lock is taken before config.toml and train.log
            assert first.poll() is None, "".join(output)
            assert time.monotonic() < deadline, "the first run did not start"
            time.sleep(0.2)
        assert (run_dir / LOCK_FILE).is_file()
        config = (run_dir / "config.toml").read_bytes()

        second = run_train(tmp_path, *args)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"error: run folder {run_dir} is in use by process {first.pid} on "), lines[0]
        assert first.poll() is None, "".join(output)  # the first one is still training

        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=240) == 0, "".join(output)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    reader.join(timeout=30)
    assert (run_dir / "config.toml").read_bytes() == config
    log = (run_dir / "train.log").read_text()
    assert log.count(f"run {run_dir} |") == 1  # one header: the second trainer never logged here
    assert "stopped by SIGTERM" in log and "error" not in log
    with RunLock(run_dir) as lock:  # free again
        assert lock.held


@pytest.mark.parametrize("name", ["a" * 250, "a" * 255, "a" * 256, "é" * 127, "é" * 128, "ü" * 200])
@pytest.mark.parametrize("key", ["job.name", "job.dump_folder"])
def test_a_run_folder_name_the_file_system_refuses_is_one_line_before_anything(tmp_path: Path, name: str,
                                                                                key: str) -> None:
    """check_run_folder refuses a job.name or job.dump_folder component exactly when the file system would (the
    reference: mkdir of that name in a scratch folder), naming the key, and creates nothing (issue 47.7)."""
    from torchnlq.train.run_lock import check_run_folder

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    try:
        (scratch / name).mkdir()
        refused_by_fs = False
    except OSError as e:
        assert e.errno == errno.ENAMETOOLONG
        refused_by_fs = True
    shutil.rmtree(scratch)
    run_dir = tmp_path / "outputs" / name if key == "job.name" else tmp_path / name / "run"
    try:
        check_run_folder(run_dir)
        refused = False
    except UserError as e:
        refused = True
        assert str(e).startswith(f"{key} has a name of {len(name.encode())} bytes") and "shorter" in str(e), e
    assert refused == refused_by_fs
    assert list(tmp_path.iterdir()) == []
