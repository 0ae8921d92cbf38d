"""One worker of a sweep: ``python -m torchnlq.experiments.sweep_worker SUITE.toml [run_suite.py's options]``.

A worker takes trials until every arm's study has used its budget: it asks a study for a trial, trains it with
run_train.sh in its own run folder, reports each validation loss to the study's pruner (read from the run's
TensorBoard events as the run writes them), stops a pruned run (it saves and exits), and tells the study how the
trial ended. Any number of workers (a pool's, SLURM jobs) share the studies:

- asking for a trial happens under the suite's lock (suite_log.suite_lock), after counting the study's trials,
  so the budget is never overrun;
- each trial a worker runs is claimed by an ``flock`` on ``<dump>/.sweep/claims/<arm>/trial-N.lock``, released
  when the worker exits however it exits. A RUNNING trial whose claim is free lost its worker: the next worker
  claims it and resumes its run folder (from its checkpoint, or from step 0 without one: the same batches give
  the same run), so a killed worker's trial is finished once, never counted twice. A trial whose run fails is
  marked FAIL with the run's last line.
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
from torchnlq.experiments.suite import is_finished, launcher_command, read_run_info
from torchnlq.experiments.suite_log import last_line
from torchnlq.experiments.sweep import Arm, Sweep, describe, objective_step, tokens_per_step
from torchnlq.files import make_folder, open_append
from torchnlq.train.preflight import check_job_config
from torchnlq.train.run_lock import RunLock

CLAIMS_FOLDER = ".sweep/claims"
#: A worker's index among its siblings (in its messages).
WORKER_ENV = "TORCHNLQ_WORKER"


@dataclass
class Claim:
    """A trial this worker runs, held by the flock on ``fd``."""

    arm: Arm
    number: int
    trial_id: int
    params: dict[str, Any]
    resumed: bool
    fd: int

    def release(self) -> None:
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

    def _claim_path(self, arm: Arm, number: int) -> Path:
        return self.sweep.dump / CLAIMS_FOLDER / arm.name / f"trial-{number}.lock"

    def _try_claim(self, arm: Arm, number: int) -> int | None:
        path = self._claim_path(arm, number)
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
        """Under the suite's lock: a RUNNING trial that lost its worker, else a new trial of a study with budget
        left, else None."""
        with suite_log.suite_lock(self.sweep.dump):
            for arm in self.sweep.arms:
                study = self.sweep.study(arm)
                for trial in study.get_trials(deepcopy=False, states=(_state("RUNNING"),)):
                    fd = self._try_claim(arm, trial.number)
                    if fd is not None:
                        return Claim(arm, trial.number, trial._trial_id, dict(trial.params), True, fd)
            for arm in self.sweep.arms:
                study = self.sweep.study(arm)
                count = len(study.get_trials(deepcopy=False))
                if count >= self.sweep.spec.trials:
                    continue
                # A sampler seeded by the trial's index: one worker's sweep is reproducible, and workers never
                # draw alike (each trial has its own seed, whichever worker asks).
                study = self.sweep.study(arm, sampler_seed=self.sweep.spec.seed + count)
                trial = study.ask()
                params = {p.key: p.suggest(trial) for p in self.sweep.spec.params}
                trial.set_user_attr("run_dir", str(self.sweep.trial_dir(arm, trial.number).resolve()))
                fd = self._try_claim(arm, trial.number)
                if fd is None:  # pragma: no cover - a new trial's claim is free (the lock is held)
                    raise RuntimeError(f"the claim of new trial {trial.number} is held")
                return Claim(arm, trial.number, trial._trial_id, params, False, fd)
        return None

    def others_running(self) -> bool:
        return any(c["RUNNING"] or c["WAITING"] for c in self.sweep.counts().values())

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
                    if self.others_running():  # another worker's trial: stay to take it over if that worker dies
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
        """Stop after the current run has saved; the trial stays RUNNING for the next worker to resume."""
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

        sweep, arm = self.sweep, claim.arm
        study = sweep.study(arm)
        trial = optuna.Trial(study, claim.trial_id)
        run = sweep.trial_run(arm, claim.number, claim.params)
        run_dir = sweep.trial_dir(arm, claim.number)
        label = f"{arm.name} trial {claim.number} ({describe(claim.params)})"
        try:  # a drawn value the config cannot run with fails here, before a process starts
            cfg = load_job_config(list(run.argv()))
            check_job_config(cfg)
            step = objective_step(sweep.spec, cfg, self.world_size)
        except UserError as e:
            self._fail(study, claim, str(e), label)
            return
        per_step = tokens_per_step(cfg, self.world_size)
        reported = set(study.get_trials(deepcopy=False)[claim.number].intermediate_values)
        monitor = _ValidationReader(run_dir / "tb")

        def report() -> bool:
            """Report new validation losses; True when the pruner says stop."""
            for at, value in monitor.new_values():
                tokens = at * per_step
                if at > 0 and tokens not in reported:
                    trial.report(value, tokens)
                    reported.add(tokens)
            return bool(reported) and trial.should_prune()

        pruned = False
        code = 0
        log = sweep.dump / LOGS_FOLDER / arm.name / f"{run_dir.name}.out"
        if claim.resumed:
            self.say(f"{label}: taken over from a worker that stopped")
            self._wait_for_run_lock(run_dir, report)
        if not is_finished(read_run_info(run_dir), run.steps):
            if report():
                pruned = True
            else:
                self.say(f"{label}: {'resumed' if claim.resumed else 'started'}, output in {log}")
                code, pruned = self._train(run, log, report)
        if is_finished(read_run_info(run_dir), run.steps):
            # The run reached its end before a stop took effect (a stop then may even kill the ending process):
            # its result is known, and counts as such.
            pruned, code = False, 0
        elif self.stopped and not pruned:
            return
        if pruned:
            study.tell(claim.number, state=optuna.trial.TrialState.PRUNED)
            info = read_run_info(run_dir) or {}
            self.say(f"{label}: pruned at step {info.get('step', '?')}")
            return
        if code != 0:
            self._fail(study, claim, last_line(log) or f"run_train.sh exited {code}", label)
            return
        report()
        from torchnlq.experiments.compare import read_scalars

        value = read_scalars(run_dir / "tb").get("loss/val", {}).get(step) if (run_dir / "tb").is_dir() else None
        if value is None:
            self._fail(study, claim, f"{run_dir} logged no validation loss at step {step}", label)
            return
        study.tell(claim.number, value)
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

        optuna.Trial(study, claim.trial_id).set_user_attr("error", reason)
        study.tell(claim.number, state=optuna.trial.TrialState.FAIL)
        self.say(f"{label}: failed: {reason}")


def _state(name: str) -> Any:
    import optuna

    return optuna.trial.TrialState[name]


class _ValidationReader:
    """A run's ``loss/val`` scalars as its trainer writes them (TensorBoard's reader, reloaded incrementally)."""

    def __init__(self, tb_dir: Path) -> None:
        self.tb_dir = tb_dir
        self._acc: Any = None
        self._seen: set[int] = set()

    def new_values(self) -> list[tuple[int, float]]:
        if self._acc is None:
            if not self.tb_dir.is_dir():
                return []
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            self._acc = EventAccumulator(str(self.tb_dir), size_guidance={"scalars": 0})
        self._acc.Reload()
        if "loss/val" not in self._acc.Tags()["scalars"]:
            return []
        fresh = [(e.step, e.value) for e in self._acc.Scalars("loss/val") if e.step not in self._seen]
        self._seen.update(step for step, _ in fresh)
        return fresh


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
