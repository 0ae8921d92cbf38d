"""One worker of a sweep: ``python -m torchnlq.experiments.sweep_worker SUITE.toml [run_suite.py's options]``.

A worker takes trials until every arm's study has used its budget: it asks a study for a trial, trains it with
run_train.sh in its own run folder, reports each validation loss to the study's pruner (read from the run's
TensorBoard events as the run writes them), stops a pruned run (it saves and exits), and tells the study how the
trial ended. Any number of workers (a pool's, SLURM jobs) share the studies:

- asking for a trial (``study.ask``) happens under the suite's lock (suite_log.suite_lock), after counting the
  study's trials (sweep.counted_trials), so the budget is never overrun, whatever the number of workers;
- a trial whose worker is lost is failed and retried with Optuna's ``RetryHeartbeatStaleTrialCallback``: a
  WAITING copy with the same values, which the next ``study.ask`` takes and which runs in the original trial's
  folder (sweep.run_number), resuming it from its checkpoint (or from step 0 without one: the same batches give
  the same run), so a killed worker's trial is finished once and counted once. Lost means, for a database
  storage, Optuna's heartbeat: the worker records one every ``heartbeat_seconds`` while it runs the trial, and a
  trial silent for twice that is stale (``optuna.storages.fail_stale_trials``); for a journal file, which has
  no heartbeats, a free claim: the worker holds an ``flock`` on ``<dump>/.sweep/claims/<arm>/trial-N.lock``,
  released when it exits however it exits. A worker that is stopped (SIGTERM, SIGUSR1) hands its trial over
  the same way at once. A trial whose run fails is marked FAIL with the run's last line.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.experiments import suite_log
from torchnlq.experiments.executors import LOGS_FOLDER, SCHEDULER_SIGNALS_ENV, Children, Task
from torchnlq.experiments.suite import SuiteRun, is_finished, launcher_command, read_run_info
from torchnlq.experiments.suite_log import last_line
from torchnlq.experiments.sweep import (Sweep, counted_trials, describe, objective_step, quiet_experimental,
                                        retry_callback, run_number)
from torchnlq.files import make_folder, open_append
from torchnlq.train.preflight import check_job_config
from torchnlq.train.run_lock import RunLock

CLAIMS_FOLDER = ".sweep/claims"
#: A worker's index among its siblings (in its messages).
WORKER_ENV = "TORCHNLQ_WORKER"


class Heartbeat:
    """Optuna's heartbeat of one RUNNING trial in a database storage, recorded now and every ``interval`` seconds
    until ``stop`` (Optuna's own heartbeat thread runs only inside ``study.optimize``, whose ``ask`` cannot be
    made under the suite's lock; this calls the storage's public ``record_heartbeat``)."""

    def __init__(self, storage: Any, study_name: str, number: int, interval: float) -> None:
        study_id = storage.get_study_id_from_name(study_name)
        self.trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        self._stop = threading.Event()
        storage.record_heartbeat(self.trial_id)  # before the suite's lock is let go: never stale in between
        self._thread = threading.Thread(target=self._beat, args=(storage, interval), daemon=True,
                                        name=f"heartbeat-{number}")
        self._thread.start()

    def _beat(self, storage: Any, interval: float) -> None:
        while not self._stop.wait(interval):
            storage.record_heartbeat(self.trial_id)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Claim:
    """A trial this worker runs: Optuna's trial of ``study``, the number of its run folder (``folder``: its
    original's for a retry), and what keeps it this worker's: a heartbeat (database) or the flock on ``fd``
    (journal file)."""

    arm: SuiteRun
    study: Any
    trial: Any
    folder: int
    params: dict[str, Any]
    resumed: bool
    fd: int | None = None
    heartbeat: Heartbeat | None = None

    @property
    def number(self) -> int:
        return self.trial.number

    def release(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.fd is not None:
            os.close(self.fd)


class Worker:
    """Takes and runs trials of ``sweep`` until none is left; ``stopped`` says whether a signal ended it."""

    def __init__(self, sweep: Sweep, index: int = 0, out: TextIO | None = None) -> None:
        self.sweep, self.index, self.out = sweep, index, out or sys.stdout
        self.poll = sweep.spec.poll_seconds
        self.stopped: str | None = None
        self.world_size = int(os.environ.get("NGPU", "1") or 1)

    def say(self, text: str) -> None:
        print(f"[sweep worker {self.index}] {text}", file=self.out, flush=True)

    # ----- taking a trial ----------------------------------------------------------------------------------

    def _try_claim(self, arm: SuiteRun, number: int) -> int | None:
        path = self.sweep.dump / CLAIMS_FOLDER / arm.name / f"trial-{number}.lock"
        make_folder(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)  # who holds it, for a person looking (the flock is what counts)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "worker": self.index}).encode(), 0)
        return fd

    def next_trial(self) -> Claim | None:
        """Under the suite's lock: hand lost trials over (their retries WAITING), then a WAITING retry, else a new
        trial of a study with budget left, else None."""
        with suite_log.suite_lock(self.sweep.dump):
            for arm in self.sweep.arms:
                self._retry_lost(arm, self.sweep.study(arm))
            for arm in self.sweep.arms:
                trials = counted_trials(self.sweep.study(arm))
                if len(trials) >= self.sweep.spec.trials and not any(t.state.name == "WAITING" for t in trials):
                    continue
                # A sampler seeded by the trial's index: one worker's sweep is reproducible, and workers never
                # draw alike (each trial has its own seed, whichever worker asks). A retry keeps its values.
                study = self.sweep.study(arm, sampler_seed=self.sweep.spec.seed + len(trials))
                return self._take(arm, study)
        return None

    def _take(self, arm: SuiteRun, study: Any) -> Claim:
        """``study.ask`` (a WAITING retry first), the trial's values, and its heartbeat or claim."""
        import warnings

        with warnings.catch_warnings():  # heartbeats with ask and tell: this worker records them itself
            warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used", UserWarning)
            trial = study.ask()
        params = {p.key: p.suggest(trial) for p in self.sweep.spec.params}
        folder = run_number(_frozen(study, trial.number))
        trial.set_user_attr("run_dir", str(self.sweep.trial_dir(arm, folder).resolve()))
        # Who runs it, for a person looking (the heartbeat or claim is what counts).
        trial.set_user_attr("worker", {"pid": os.getpid(), "host": socket.gethostname(), "worker": self.index})
        claim = Claim(arm, study, trial, folder, params, resumed=folder != trial.number)
        if self.sweep.journal:
            claim.fd = self._try_claim(arm, trial.number)
            if claim.fd is None:  # pragma: no cover - a new trial's claim is free (the lock is held)
                raise RuntimeError(f"the claim of new trial {trial.number} is held")
        else:
            claim.heartbeat = Heartbeat(self.sweep.storage(), study.study_name, trial.number,
                                        self.sweep.spec.heartbeat_seconds)
        return claim

    def _retry_lost(self, arm: SuiteRun, study: Any) -> None:
        """Fail and retry the study's RUNNING trials whose workers are lost: stale heartbeats (database, Optuna's
        fail_stale_trials with the storage's retry callback) or free claims (journal file)."""
        import optuna

        if not self.sweep.journal:
            with quiet_experimental():
                optuna.storages.fail_stale_trials(study)
            return
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            fd = self._try_claim(arm, trial.number)
            if fd is not None:
                os.close(fd)
                hand_over(study, trial.number)

    # ----- the loop ----------------------------------------------------------------------------------------

    def run(self) -> int:
        """Run trials until the budgets are used and no trial is left running; 0, also after a clean stop."""
        main = threading.current_thread() is threading.main_thread()
        stops = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
        previous = {s: signal.signal(s, self._signal) for s in stops} if main else {}
        try:
            while not self.stopped:
                claim = self.next_trial()
                if claim is None:
                    # Another worker's trial: stay to take it over if that worker dies.
                    if any(c["RUNNING"] or c["WAITING"] for c in self.sweep.counts().values()):
                        time.sleep(self.poll)
                        continue
                    self.say("no trial left")
                    return 0
                try:
                    self.run_trial(claim)
                finally:
                    claim.release()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.say(f"stopped by {self.stopped}; a trial it was running resumes with the next worker")
        return 0

    def _signal(self, signum: int, frame: object) -> None:
        """Stop after the current run has saved; the trial is then handed over (hand_over) for the next worker to
        resume (what the run itself gets of the signal: :meth:`_passed_on`)."""
        self.stopped = self.stopped or signal.Signals(signum).name

    def _passed_on(self, sig: signal.Signals, children: Children) -> signal.Signals | None:
        """What the run gets of a signal: SIGUSR1 (a SLURM job's time limit is near) becomes SIGTERM; SIGTERM and
        SIGINT are passed on, except in a SLURM job, where the scheduler signals the run itself."""
        self._signal(sig, None)
        if sig == signal.SIGUSR1:
            return signal.SIGTERM
        return None if os.environ.get(SCHEDULER_SIGNALS_ENV) == "1" else sig

    def run_trial(self, claim: Claim) -> None:
        """Train one trial (resuming its folder), report and prune, and tell the study how it ended."""
        import optuna

        sweep, arm, study, trial = self.sweep, claim.arm, claim.study, claim.trial
        run = sweep.trial_run(arm, claim.folder, claim.params)
        run_dir = sweep.trial_dir(arm, claim.folder)
        label = f"{arm.name} trial {claim.number} ({describe(claim.params)})"
        try:  # a drawn value the config cannot run with fails here, before a process starts
            cfg = load_job_config(run.argv())
            check_job_config(cfg)
            step = objective_step(sweep.spec, cfg, self.world_size)
        except UserError as e:
            self._fail(study, claim, str(e), label)
            return
        per_step = cfg.training.tokens_per_step(self.world_size)
        reported = set(_frozen(study, claim.number).intermediate_values)  # a retry's: its original's
        monitor = _ValidationReader(run_dir / "tb")
        lost: list[str] = []

        def report() -> bool:
            """Report new validation losses; True when the pruner says stop (or the trial is no longer ours)."""
            try:
                for at, value in monitor.values():
                    tokens = at * per_step
                    if at > 0 and tokens not in reported:
                        trial.report(value, tokens)
                        reported.add(tokens)
                return bool(reported) and trial.should_prune()
            except optuna.exceptions.UpdateFinishedTrialError:  # failed as stale: another worker resumes it
                lost.append("its heartbeat was late")
                return True

        pruned, code = False, 0
        log = sweep.dump / LOGS_FOLDER / arm.name / f"{run_dir.name}.out"
        if claim.resumed:
            self.say(f"{label}: taken over from a worker that stopped (trial {claim.folder}'s run, {run_dir})")
            self._wait_for_run_lock(run_dir, report)
        if not is_finished(read_run_info(run_dir), run.steps):
            pruned = report()
            if not pruned:
                self.say(f"{label}: {'resumed' if claim.resumed else 'started'}, output in {log}")
                code, pruned = self._train(run, log, report)
        if lost:
            self.say(f"{label}: taken over by another worker ({lost[0]}); its run resumes there")
            return
        if is_finished(read_run_info(run_dir), run.steps):
            # The run reached its end before a stop took effect (a stop then may even kill the ending process):
            # its result is known, and counts as such.
            pruned, code = False, 0
        elif self.stopped and not pruned:
            hand_over(study, claim.number)
            return
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            info = read_run_info(run_dir) or {}
            self.say(f"{label}: pruned at step {info.get('step', '?')}")
            return
        if code != 0:
            self._fail(study, claim, last_line(log) or f"run_train.sh exited {code}", label)
            return
        report()
        # Read afresh, as TensorBoard shows it: a later event at a step wins (a resumed run's rewrite).
        value = dict(_ValidationReader(run_dir / "tb").values()).get(step)
        if value is None:
            self._fail(study, claim, f"{run_dir} logged no validation loss at step {step}", label)
            return
        study.tell(trial, value)
        self.say(f"{label}: complete, validation loss {value:.4f} at step {step}")

    def _train(self, run: Any, log: Path, report: Any) -> tuple[int, bool]:
        pruned = False
        make_folder(log.parent)
        with Children((signal.SIGINT, signal.SIGTERM, signal.SIGUSR1), self._passed_on) as children, \
                open_append(log) as out:
            child = children.start(launcher_command(run), log=out)
            if self.stopped and not children.received:  # a signal before these handlers (the loop's saw it)
                child.send_signal(signal.SIGTERM)
            next_look = time.monotonic() + self.poll
            while child.poll() is None:
                time.sleep(min(0.2, self.poll))
                if time.monotonic() >= next_look and not pruned and not self.stopped:
                    next_look = time.monotonic() + self.poll
                    if report():
                        pruned = True
                        child.send_signal(signal.SIGTERM)  # it saves and stops at the end of its step
        return child.returncode, pruned

    def _wait_for_run_lock(self, run_dir: Path, report: Any) -> None:
        """A trial taken over may still be trained by its worker's orphaned trainer: wait for it to let go."""
        while not self.stopped:
            try:
                RunLock(run_dir).check_free()
                return
            except UserError:
                report()
                time.sleep(self.poll)

    def _fail(self, study: Any, claim: Claim, reason: str, label: str) -> None:
        import optuna

        claim.trial.set_user_attr("error", reason)
        study.tell(claim.trial, state=optuna.trial.TrialState.FAIL)
        self.say(f"{label}: failed: {reason}")


def hand_over(study: Any, number: int) -> None:
    """A RUNNING trial whose worker is lost or stopped: FAIL, and Optuna's retry (a WAITING copy) in its place, as
    fail_stale_trials does for a stale heartbeat."""
    import optuna

    study.tell(number, state=optuna.trial.TrialState.FAIL)
    retry_callback()(study, _frozen(study, number))


def _frozen(study: Any, number: int) -> Any:
    """The study's trial numbered ``number`` as stored (a FrozenTrial)."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


class _ValidationReader:
    """A run's ``loss/val`` scalars as its trainer writes them (TensorBoard's reader, reloaded incrementally). A
    start that sets an earlier attempt aside (job.rerun: a retry of a trial lost before its first checkpoint) moves
    ``tb/`` away and makes a new one: the reader then starts again on the new folder."""

    def __init__(self, tb_dir: Path) -> None:
        self.tb_dir = tb_dir
        self._acc: Any = None
        self._folder: int | None = None  # the inode of the tb/ the reader reads

    def values(self) -> list[tuple[int, float]]:
        """(step, loss) of every validation logged so far, in the order written."""
        from tensorboard.backend.event_processing.directory_watcher import DirectoryDeletedError
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        try:
            folder = self.tb_dir.stat().st_ino
        except FileNotFoundError:  # not made yet, or set aside a moment ago
            return []
        if self._acc is None or folder != self._folder:
            self._acc, self._folder = EventAccumulator(str(self.tb_dir), size_guidance={"scalars": 0}), folder
        try:
            self._acc.Reload()
        except DirectoryDeletedError:  # moved away while read: the next look reads the new one
            self._acc = None
            return []
        if "loss/val" not in self._acc.Tags()["scalars"]:
            return []
        return [(e.step, e.value) for e in self._acc.Scalars("loss/val")]


def worker_tasks(sweep: Sweep, count: int, context: dict[str, Any]) -> list[Task]:
    """``count`` worker processes for a pool or SLURM jobs, each with the options run_suite.py was given."""
    import torchnlq

    argv = (sys.executable, "-m", "torchnlq.experiments.sweep_worker", str(context["suite"]), *context["argv"])
    source = str(Path(torchnlq.__file__).resolve().parents[1])  # this torchnlq, installed or not
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH", "")) if p)
    return [Task(f"worker-{i}", argv, env=((WORKER_ENV, str(i)), ("PYTHONPATH", path)), stop_signal="SIGUSR1")
            for i in range(count)]


def main(argv: list[str]) -> int:
    """Load the suite (as run_suite.py does, the same options) and work on its sweep."""
    from torchnlq.experiments.suite_command import load_command

    if not argv:
        raise UserError("usage: python -m torchnlq.experiments.sweep_worker SUITE.toml [run_suite.py's options]")
    sweep = load_command(argv[0], argv[1:]).sweep
    if sweep is None:
        raise UserError(f"{argv[0]} has no [sweep] table")
    return Worker(sweep, int(os.environ.get(WORKER_ENV, "0"))).run()


if __name__ == "__main__":
    sys.exit(run_cli(main))
