"""A sweep worker lost in the middle of a trial: its trial is failed and retried with Optuna's own machinery
(a database's heartbeat, a journal file's claims), the retry resumes the lost trial's run folder, and the budget
holds exactly. No training here: a worker process takes a trial and is killed (tests/test_sweep_workers.py
trains through a take-over); and no private Optuna API anywhere in torchnlq/."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT

from test_sweep import PARAMS, sweep_suite

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

#: A worker that takes one trial, says which, and holds it (its heartbeat or claim) until it is killed.
HOLDER = """
import sys, time
from torchnlq.experiments.suite import load_suite
from torchnlq.experiments.sweep import Sweep, parse_sweep
from torchnlq.experiments.sweep_worker import Worker
suite = load_suite(sys.argv[1])
claim = Worker(Sweep(suite, parse_sweep(suite, {})), index=1).next_trial()
print(claim.number, claim.folder, flush=True)
time.sleep(600)
"""
HEARTBEAT = 1  # seconds: Optuna's grace period is twice that


def private_optuna_uses(root: Path) -> list[str]:
    """Lines of ``root``'s Python that reach into Optuna's private API: a trial's or study's ids and storage, a
    Trial built by hand, a private module."""
    pattern = re.compile(r"\._trial_id\b|\._study_id\b|\bstudy\._storage\b|\boptuna\.Trial\(|\._pop_waiting"
                         r"|\boptuna(\.\w+)*\._\w+|from optuna(\.\w+)*\._\w+")
    return [f"{path}:{n}: {line.strip()}" for path in sorted(root.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]


def test_the_private_api_check_sees_private_uses(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = trial._trial_id\ny = optuna.Trial(study, 3)\n"
                                   "from optuna.storages._heartbeat import HeartbeatThread\nz = trial.number\n")
    assert [line.split(": ", 1)[0] for line in private_optuna_uses(tmp_path)] == \
        [f"{tmp_path / 'a.py'}:{n}" for n in (1, 2, 3)]


def test_torchnlq_uses_no_private_optuna_api() -> None:
    assert private_optuna_uses(REPO_ROOT / "torchnlq") == []


def _study(dump: Path, journal: str | None):  # noqa: ANN202 - an optuna.Study
    """The study as Optuna itself opens it (not through the sweep's storage code)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = (optuna.storages.JournalStorage(JournalFileBackend(journal)) if journal
               else f"sqlite:///{dump / 'sweep.db'}")
    return optuna.load_study(study_name="sweep/linear", storage=storage)


@pytest.mark.integration  # a worker process killed
@pytest.mark.parametrize("journal", [False, True], ids=["sqlite-heartbeat", "journal-claims"])
def test_a_killed_workers_trial_is_retried_in_its_folder_and_the_budget_holds(tmp_path: Path, journal: bool,
                                                                               monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    import optuna

    from torchnlq.experiments.suite import load_suite
    from torchnlq.experiments.sweep import Sweep, parse_sweep
    from torchnlq.experiments.sweep_worker import Worker

    monkeypatch.chdir(tmp_path)
    storage = str(tmp_path / "journal.log") if journal else None
    body = f"trials = 1\nheartbeat_seconds = {HEARTBEAT}\npoll_seconds = 0.2\n" + \
        (f'storage = "{storage}"\n' if journal else "") + PARAMS
    path = sweep_suite(tmp_path, body, {"linear": ["--model.query.type=linear"]})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=tmp_path, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().split() == ["0", "0"]  # trial 0, in trial-0: the whole budget
        suite = load_suite(path)
        worker = Worker(Sweep(suite, parse_sweep(suite, {})), index=2)
        if not journal:  # alive for longer than the grace period: its heartbeat keeps its trial its own
            time.sleep(3 * HEARTBEAT)
        assert worker.next_trial() is None  # a live worker's trial, and no budget left
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    killed = time.monotonic()
    first = _study(tmp_path / "runs", storage).trials[0]
    assert first.state == optuna.trial.TrialState.RUNNING
    claim = worker.next_trial()
    if journal:  # its claim went with it: taken over at once
        assert claim is not None
    else:  # stale after Optuna's grace period (2 beats) from its last beat, at most a beat before the kill
        assert claim is None
        while claim is None:
            assert time.monotonic() - killed < 60, "the killed worker's trial was never taken over"
            time.sleep(0.2)
            claim = worker.next_trial()
        assert time.monotonic() - killed >= HEARTBEAT
    try:
        assert (claim.number, claim.folder, claim.resumed) == (1, 0, True)
        assert claim.params == first.params  # the same trial, retried
        assert worker.next_trial() is None  # the retry is the budget's one trial: nothing more to take
        claim.study.tell(claim.trial, 1.5)
    finally:
        claim.release()
    trials = _study(tmp_path / "runs", storage).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(trials[1]) == 0
    assert trials[1].user_attrs["run_dir"] == trials[0].user_attrs["run_dir"] == \
        str((tmp_path / "runs" / "linear" / "trial-0").resolve())
    assert trials[1].params == trials[0].params
    assert worker.sweep.counts() == {"linear": {"COMPLETE": 1, "PRUNED": 0, "FAIL": 0, "RUNNING": 0, "WAITING": 0}}
    assert worker.sweep.done() and worker.next_trial() is None


@pytest.mark.integration  # starts (and at once stops) one run
def test_a_stopped_worker_hands_its_trial_over_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna

    from torchnlq.experiments.suite import load_suite
    from torchnlq.experiments.sweep import Sweep, parse_sweep
    from torchnlq.experiments.sweep_worker import Worker

    monkeypatch.chdir(tmp_path)
    path = sweep_suite(tmp_path, "trials = 1\npoll_seconds = 0.2\n" + PARAMS, {"linear": ["--model.query.type=linear"]})
    suite = load_suite(path)
    worker, other = (Worker(Sweep(suite, parse_sweep(suite, {})), index=i) for i in (1, 2))
    claim = worker.next_trial()
    worker.stopped = "SIGTERM"  # as its signal handler sets it: the run is stopped as it starts
    try:
        worker.run_trial(claim)
    finally:
        claim.release()
    trials = _study(tmp_path / "runs", None).trials
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"]  # no heartbeat grace to wait for
    taken = other.next_trial()
    try:
        assert (taken.number, taken.folder, taken.resumed, taken.params) == (1, 0, True, trials[0].params)
        assert other.next_trial() is None
    finally:
        taken.release()
    assert _study(tmp_path / "runs", None).trials[1].state == optuna.trial.TrialState.RUNNING
