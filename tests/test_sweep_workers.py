"""Several sweep workers on one study: a pool's, and SLURM jobs'. Counted in Optuna's own storage: every trial
once, none lost or duplicated, pruned trials stopped early in their folders, the best trial's objective its run's
logged validation loss, and a worker killed in the middle of a trial loses nothing: Optuna's heartbeat finds it
lost, and its retry resumes the trial's run folder from its checkpoint."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from helpers.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture
from helpers.train import scalars, script_env

from test_executor_slurm import ON_SLURM, wait_until
from test_sweep import PARAMS, sweep_suite

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")]
#: Validation (the pruner's input) and checkpoints every 6 steps; a floor every drawn LR is above.
SHORT = ["--validation.interval=6", "--checkpoint.interval=6", "--lr_schedule.min_lr=1e-6"]


def held(tmp: Path) -> dict[str, str]:
    """Each trial is held 1.5 s after the step that follows a validation: the tiny runs would otherwise end
    before a worker reads their first validation loss, and the pruner could stop none of them."""
    pauses = tmp / "pauses"
    pauses.mkdir()
    return {"TORCHNLQ_PAUSE_AT": "step:7,step:13,step:19", "TORCHNLQ_PAUSE_DIR": str(pauses),
            "TORCHNLQ_PAUSE_SECONDS": "1.5"}

STEPS = 24
#: Eight trials of one arm, a median pruner that may stop any trial worse than the median so far.
#: A heartbeat every second: a killed worker's trial is stale (Optuna's grace period, two beats) 2 s after its last.
SWEEP = ('trials = 8\nsampler = "random"\npruner = "median"\npruner_options = {n_startup_trials = 1}\n'
         'poll_seconds = 0.5\nheartbeat_seconds = 1\n' + PARAMS.replace("1e-4", "1e-5"))


def load_trials(dump: Path) -> list:
    import optuna

    return optuna.load_study(study_name="sweep/linear", storage=f"sqlite:///{dump / 'sweep.db'}").get_trials()


def retried(trials: list) -> dict[int, int]:
    """Optuna's retries: the number of each retrying trial's original (RetryHeartbeatStaleTrialCallback)."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback as Retry

    return {t.number: Retry.retried_trial_number(t) for t in trials if Retry.retried_trial_number(t) is not None}


def check_the_study(dump: Path, lost: int = 0) -> list:
    """Every trial of the one study once (an attempt whose worker was lost, of ``lost`` of them, FAIL and retried
    in its own folder), the budget exactly, finished, its folder matching its state; returns the trials counted."""
    import optuna

    study = optuna.load_study(study_name="sweep/linear", storage=f"sqlite:///{dump / 'sweep.db'}")
    attempts = study.get_trials()
    assert sorted(t.number for t in attempts) == list(range(8 + lost))  # none lost, none twice
    retries = retried(attempts)
    given_way = {n for t in attempts for n in t.system_attrs.get("retry_history", [])}
    assert len(retries) == len(given_way) == lost and all(attempts[n].state.name == "FAIL" for n in given_way)
    trials = [t for t in attempts if t.number not in given_way]
    assert len(trials) == 8  # the budget, exactly
    ends = [(t.number, t.state.name, t.user_attrs.get("error")) for t in trials]
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}, ends
    folders = [t.user_attrs["run_dir"] for t in trials]
    assert len(set(folders)) == 8
    assert all(Path(f).name == f"trial-{retries.get(t.number, t.number)}" for f, t in zip(folders, trials))
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert pruned and complete
    for trial in pruned:  # stopped early: fewer steps in its folder than the run's length
        info = json.loads((Path(trial.user_attrs["run_dir"]) / "run_info.json").read_text())
        assert not info["finished"] and info["step"] < STEPS, info
    for trial in complete:
        info = json.loads((Path(trial.user_attrs["run_dir"]) / "run_info.json").read_text())
        assert info["finished"] and info["step"] == STEPS
    best = study.best_trial
    run = Path(best.user_attrs["run_dir"])
    assert best.value == scalars(run / "tb")["loss/val"][STEPS]  # its own run's logged validation loss
    logged = re.findall(rf"step\s+{STEPS}/{STEPS}\s+val_loss (\d+\.\d+)", (run / "train.log").read_text())
    assert logged == [f"{best.value:.4f}"]
    return trials


def test_two_pool_workers_share_a_study_and_a_killed_workers_trial_is_finished_once(tmp_path: Path) -> None:
    suite = sweep_suite(tmp_path, SWEEP, {"linear": ["--model.query.type=linear"]}, steps=STEPS,
                        overrides=SHORT)
    env = {**script_env(tmp_path), **held(tmp_path)}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / "run_suite.py"), str(suite), "--executor",
                             "pool", "--executor.workers=2"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: (tmp_path / "pauses" / "step-7-rank0").is_file(), "a trial to reach step 7", timeout=300)
    running = [t for t in load_trials(tmp_path / "runs") if t.state.name == "RUNNING"]
    assert running
    victim = (f"trial-{running[0].number}", running[0].user_attrs["worker"]["pid"])  # who runs it, as it says
    os.kill(victim[1], signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    print(f"8 trials on 2 pool workers, one killed: {time.monotonic() - t0:.1f}s")
    assert proc.returncode == 0, out[-3000:]
    assert "worker-" in out and "exit -9" in out
    trials = check_the_study(tmp_path / "runs", lost=1)
    killed = next(t for t in trials if Path(t.user_attrs["run_dir"]).name == victim[0])
    assert retried(trials) == {killed.number: int(victim[0].split("-")[1])}  # its retry, in its folder
    workers = "".join(p.read_text() for p in (tmp_path / "runs" / "logs").glob("worker-*.out"))
    assert f"linear trial {killed.number} (" in workers and "taken over from a worker that stopped" in workers
    assert killed.state.name in ("COMPLETE", "PRUNED")


#: Where in its trial a worker and its trainer are lost (SIGKILL to both, as a lost machine): the trainer held at a
#: pause point (torchnlq/pause_points.py), checkpoints and validations every 6 steps. Each: (the pause point, the
#: step the retry's run resumes from, or None: it starts again from step 0, or "done": it does not train again).
PHASES = {
    "before-its-first-checkpoint": ("step:3", None),
    "between-checkpoints": ("step:9", 6),
    "during-validation": ("validation:12", 6),  # step 12's checkpoint is saved after its validation
    "after-its-last-step": ("export:24", "done"),  # run_info.json says finished; the study does not know yet
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_lost_workers_trial_is_taken_over_at_every_phase_of_its_trial(tmp_path: Path, phase: str) -> None:
    """Worker and trainer killed at ``phase``: the other worker (waiting, the budget being one trial) finds the trial
    stale no sooner than Optuna's grace period, retries it in the same folder, resumes its latest checkpoint (or starts
    it again, or, a finished run, only reads its result), and the study ends with the one trial COMPLETE, its value
    the run's logged final validation loss."""
    point, resumes = PHASES[phase]
    # A beat every 2 s (stale after 4): a beat a busy machine delays must not fail the retry too.
    suite = sweep_suite(tmp_path, 'trials = 1\nsampler = "random"\npruner = "none"\npoll_seconds = 0.5\n'
                        'heartbeat_seconds = 2\n' + PARAMS.replace("1e-4", "1e-5"),
                        {"linear": ["--model.query.type=linear"]}, steps=STEPS,
                        overrides=[*SHORT, "--checkpoint.export_at_end=true"])
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    env = {**script_env(tmp_path), "TORCHNLQ_PAUSE_AT": point, "TORCHNLQ_PAUSE_DIR": str(pauses),
           "TORCHNLQ_PAUSE_SECONDS": "60", "TORCHNLQ_PAUSE_ONCE": "1"}  # held there until killed; the retry passes
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / "run_suite.py"), str(suite), "--executor",
                             "pool", "--executor.workers=2"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    marker = pauses / f"{point.replace(':', '-')}-rank0"
    try:
        wait_until(marker.is_file, f"the trainer at {point}", timeout=300)
        (victim,) = load_trials(tmp_path / "runs")
        run_dir = Path(victim.user_attrs["run_dir"])
        os.kill(victim.user_attrs["worker"]["pid"], signal.SIGKILL)
        os.killpg(os.getpgid(int(marker.read_text())), signal.SIGKILL)  # run_train.sh's processes: their session
        killed_at = datetime.datetime.now()
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    trials = load_trials(tmp_path / "runs")
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"], out[-3000:]  # the budget: one trial, retried once
    retry = trials[1]
    assert retried([retry]) == {1: 0} and retry.params == victim.params
    assert Path(retry.user_attrs["run_dir"]) == run_dir
    assert retry.datetime_start - killed_at >= datetime.timedelta(seconds=2)  # stale: no beat for Optuna's grace
    log = (run_dir / "train.log").read_text()
    resumed = re.findall(r"resumed from \S+ \(step (\d+)\b", log)
    starts = log.count("| 1 process(es) on cpu |")
    if resumes == "done":  # finished before the kill: read, not trained again
        assert (starts, resumed) == (1, []), log[-2000:]
    elif resumes is None:  # nothing saved yet: the same folder trained again from step 0, the first start set aside
        assert (starts, resumed) == (1, []), log[-2000:]  # (a suite's run command sets job.rerun: suite.py)
        assert f"started again from step 0 (job.rerun); the earlier run is in {run_dir.relative_to(tmp_path)}" \
            "/previous-1" in log, log[:2000]
        assert (run_dir / "previous-1" / "train.log").is_file()
    else:
        assert (starts, resumed) == (2, [str(resumes)]), log[-2000:]
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["finished"] and info["step"] == STEPS
    assert retry.value == scalars(run_dir / "tb")["loss/val"][STEPS]


def test_two_slurm_workers_share_one_study(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    suite = sweep_suite(tmp_path, SWEEP, {"linear": ["--model.query.type=linear"]}, steps=STEPS,
                        overrides=SHORT)
    env = {**script_env(tmp_path), **slurm_cluster.env, **held(tmp_path)}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "run_suite.py"), str(suite), *ON_SLURM,
                           "--executor.workers=2", "--wait"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    print(f"8 trials on 2 SLURM workers: {time.monotonic() - t0:.1f}s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check_the_study(tmp_path / "runs")
    log = (tmp_path / "runs" / "suite.log").read_text()
    assert "worker-0 submitted job=" in log and "worker-1 submitted job=" in log
    # The last worker to finish wrote the best config (no rerun seeds: that is the sweep's result).
    assert (tmp_path / "runs" / "best_linear.toml").is_file()
    assert slurm_cluster.jobs() == {}
