"""[sweep]: the table's checks, the objective's step, and a tuned comparison on the CPU (each arm's best setting,
rerun at two seeds on the same batches, compared by compare_runs), checked against Optuna's own storage."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from helpers.train import scalars, script_env

from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.experiments.suite import load_suite
from torchnlq.experiments.sweep import parse_sweep

from test_executor_slurm import TINY


def sweep_suite(tmp: Path, sweep: str, runs: dict[str, list[str]] | None = None, steps: int = 12,
                overrides: list[str] = ()) -> Path:
    """A suite of tiny runs (its arms) with the given [sweep] table body."""
    runs = runs or {"linear": ["--model.query.type=linear"], "res": ["--model.query.type=residual_mlp"]}
    body = (f'config = "{REPO_ROOT / "train_configs" / "debug_model.toml"}"\ndump_folder = "runs"\n'
            f'baseline = "{next(iter(runs))}"\n'
            f'overrides = {json.dumps([*TINY, f"--training.steps={steps}", *overrides])}\n')
    for run, own in runs.items():
        body += f'[[runs]]\nname = "{run}"\noverrides = {json.dumps(own)}\n'
    (tmp / "sweep.toml").write_text(body + "[sweep]\n" + sweep)
    return tmp / "sweep.toml"


PARAMS = '[sweep.params]\n"optimizer.lr" = {low = 1e-4, high = 3e-2, log = true}\n'


@pytest.mark.parametrize("sweep,fragment", [
    ("trials = 4\n", "needs [sweep.params]"),
    (PARAMS, "needs trials"),
    ("trials = 0\n" + PARAMS, "sweep.trials must be >= 1, got 0"),
    ('trials = 2\nsampler = "tpee"\n' + PARAMS, "sweep.sampler: 'tpee' is not one of tpe, random, grid, cmaes; did you mean 'tpe'?"),
    ('trials = 2\npruner = "medain"\n' + PARAMS, "did you mean 'median'?"),
    ('trials = 2\npruner_options = {n_startup = 2}\n' + PARAMS, "unknown key 'sweep.pruner_options.n_startup'; did you mean"),
    ('trials = 2\nsampler = "grid"\n' + PARAMS, "'optimizer.lr' is a float range without a step"),
    ('trials = 9\nsampler = "grid"\n[sweep.params]\n"training.seed" = [1, 2]\n', "the grid has 2 points"),
    ('trials = 2\n[sweep.params]\n"optimizer.lr" = {low = 0.0, high = 1e-2, log = true}\n',
     "a log range needs low > 0"),
    ('trials = 2\n[sweep.params]\n"optimizer.lr" = {low = 1e-2, high = 1e-3}\n', "needs numbers low < high"),
    ('trials = 2\n[sweep.params]\n"optimizer.lrr" = {low = 1e-4, high = 1e-2}\n', "unknown key 'optimizer.lrr'"),
    ('trials = 2\n[sweep.params]\n"optimizer.name" = ["adamw", "nope"]\n', "'optimizer.name' = 'nope'"),
    ('trials = 2\n[sweep.params]\n"optimizer.name" = ["adamw", "adamw"]\n', "lists a value twice"),
    ('trials = 2\n[sweep.params]\n"job.name" = ["a", "b"]\n', "names the run, not a setting"),
    ('trials = 2\nrerun_seeds = [1, 1]\n' + PARAMS, "rerun_seeds must be a list of distinct integer seeds"),
    ('trials = 2\nobjective_token = 5\n' + PARAMS, "unknown key 'sweep.objective_token'; did you mean 'objective_tokens'?"),
    ('trials = 2\nheartbeat_seconds = 0.5\n' + PARAMS, "sweep.heartbeat_seconds expects int, got float 0.5"),
    ('trials = 2\nrerun_overrides = ["--model.dim=64"]\n' + PARAMS, "rerun_seeds is empty: give the seeds"),
    ('trials = 2\nstorage = "sqlite://"\n' + PARAMS, "is an in-memory SQLite database"),
    ('trials = 2\nstorage = "sqlite:///:memory:"\n' + PARAMS, "is an in-memory SQLite database"),
    ('trials = 2\nstorage = "sqlite:/sweep.db"\n' + PARAMS, "looks like a URL without '//'"),
    ('trials = 2\nstorage = "sqlite:sweep.db"\n' + PARAMS, "looks like a URL without '//'"),
    ('trials = 2\nstorage = "sqlite:///no/such/folder/s.db"\n' + PARAMS, "the folder no/such/folder does not exist"),
    ('trials = 2\nstorage = "no/such/folder/journal.log"\n' + PARAMS, "the folder no/such/folder does not exist"),
    ('trials = 2\nstorage = "postgresql://u@h:port/db"\n' + PARAMS, "is not an SQLAlchemy URL"),
    ('trials = 2\nrerun_seeds = [1]\nrerun_overrides = ["--optimizer.lr=0.1"]\n' + PARAMS,
     "'--optimizer.lr=0.1' must be --key=value of a setting that is neither searched nor job.*"),
    ('trials = 2\nrerun_seeds = [1]\nrerun_overrides = ["--job.name=x"]\n' + PARAMS, "neither searched nor job.*"),
    ('trials = 2\nrerun_seeds = [1]\nrerun_overrides = ["model.dim=64"]\n' + PARAMS, "must be --key=value"),
    ('trials = 2\nrerun_seeds = [1]\nrerun_overrides = ["--model.dimm=64"]\n' + PARAMS,
     "rerun_overrides: unknown key 'model.dimm' in model; did you mean 'dim'?"),
])
def test_sweep_mistakes_are_one_line(tmp_path: Path, sweep: str, fragment: str) -> None:
    with pytest.raises(UserError) as excinfo:
        suite = load_suite(sweep_suite(tmp_path, sweep))
        parse_sweep(suite, {})
    assert fragment in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_a_searched_key_set_by_an_arm_is_refused(tmp_path: Path) -> None:
    suite = load_suite(sweep_suite(tmp_path, "trials = 2\n" + PARAMS, {"a": ["--optimizer.lr=1e-3"]}))
    with pytest.raises(UserError, match="'optimizer.lr' is searched, and run 'a' sets it too"):
        parse_sweep(suite, {})


def test_the_objective_is_read_where_the_run_has_seen_the_tokens(tmp_path: Path) -> None:
    from torchnlq.experiments.sweep import objective_step

    suite = load_suite(sweep_suite(tmp_path, "trials = 2\nobjective_tokens = 1024\n" + PARAMS))
    spec = parse_sweep(suite, {})
    cfg = load_job_config(list(suite.runs[0].argv()))  # 4 x 32 tokens a step, 12 steps, validation every 4
    assert objective_step(spec, cfg, world_size=1) == 1024 // (4 * 32)
    assert objective_step(spec, cfg, world_size=2) == 4  # two ranks: twice the tokens a step
    with pytest.raises(UserError, match="is step 2, where the run does not validate"):
        objective_step(parse_sweep(suite, {"objective_tokens": "256"}), cfg, world_size=1)
    with pytest.raises(UserError, match="not a whole step of this run"):  # 9 steps on one process, 4.5 on two
        objective_step(parse_sweep(suite, {"objective_tokens": "1152"}), cfg, world_size=2)
    # Not a whole step even on one process: refused with the suite, before any trial could count against the budget.
    with pytest.raises(UserError, match=r"objective_tokens = 100 is not a whole step of run 'linear' \(128 tokens"):
        parse_sweep(suite, {"objective_tokens": "100"})


@pytest.mark.integration  # trains 8 trials and 4 reruns
def test_a_tuned_comparison_reruns_each_arms_best_at_two_seeds(tmp_path: Path) -> None:
    import optuna

    suite = sweep_suite(tmp_path, 'trials = 4\nsampler = "random"\npruner = "none"\nrerun_seeds = [1, 2]\n'
                        'poll_seconds = 0.5\n' + PARAMS + '"optimizer.weight_decay" = {low = 0.0, high = 0.2}\n')
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "run_suite.py"), str(suite)], cwd=tmp_path,
                          env=script_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    dump = tmp_path / "runs"
    storage = f"sqlite:///{dump / 'sweep.db'}"
    table = (dump / "comparison.md").read_text()
    for arm in ("linear", "res"):
        study = optuna.load_study(study_name=f"sweep/{arm}", storage=storage)
        trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        assert len(study.trials) == len(trials) == 4
        best = min(trials, key=lambda t: t.value)
        # Each trial's objective is its own run's last validation loss, as TensorBoard holds it.
        for trial in trials:
            assert trial.value == scalars(Path(trial.user_attrs["run_dir"]) / "tb")["loss/val"][12]
        cfg = load_job_config([str(dump / f"best_{arm}.toml")])
        assert cfg.optimizer.lr == best.params["optimizer.lr"]
        assert cfg.optimizer.weight_decay == best.params["optimizer.weight_decay"]
        assert cfg.model.query.type == {"linear": "linear", "res": "residual_mlp"}[arm]
        for seed in (1, 2):
            rerun = load_job_config([str(dump / f"best_{arm}_seed{seed}" / "config.toml")])
            assert (rerun.training.seed, rerun.optimizer.lr) == (seed, best.params["optimizer.lr"])
            assert json.loads((dump / f"best_{arm}_seed{seed}" / "run_info.json").read_text())["finished"]
        assert re.search(rf"\| best_{arm} \| 2 \| ", table), table
        assert (dump / "plots" / f"{arm}_history.png").stat().st_size > 1000
        assert (dump / "plots" / f"{arm}_importances.png").is_file()
    assert "(baseline)" in table.split("| best_linear |")[1].split("\n")[0]


@pytest.mark.integration  # trains 2 trials at width 32 and their best at width 64
def test_rerun_overrides_train_the_tuned_values_at_another_width(tmp_path: Path) -> None:
    """µP's transfer in one command: the trials at the base width, the best rerun at the target width with the
    trial's own learning rate (suites/mup_transfer_tiny.toml at a test's size)."""
    import optuna

    suite = sweep_suite(tmp_path, 'trials = 2\nsampler = "random"\npruner = "none"\nrerun_seeds = [1]\n'
                        'rerun_overrides = ["--model.dim=64"]\npoll_seconds = 0.5\n' + PARAMS,
                        runs={"res": ["--model.query.type=residual_mlp"]},
                        overrides=["--model.parametrization=mup", "--model.mup_base_width=32"])
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "run_suite.py"), str(suite)], cwd=tmp_path,
                          env=script_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    dump = tmp_path / "runs"
    study = optuna.load_study(study_name="sweep/res", storage=f"sqlite:///{dump / 'sweep.db'}")
    best = min(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)), key=lambda t: t.value)
    assert load_job_config([str(Path(best.user_attrs["run_dir"]) / "config.toml")]).model.dim == 32
    rerun = load_job_config([str(dump / "best_res_seed1" / "config.toml")])
    assert (rerun.model.dim, rerun.model.mup_base_width, rerun.model.parametrization) == (64, 32, "mup")
    assert rerun.optimizer.lr == best.params["optimizer.lr"] and rerun.training.seed == 1


def test_a_study_whose_trials_trained_another_arm_is_not_merged_into(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The arm's configuration (all but the searched keys) is recorded in its study; a suite edited to train
    another model afterwards is one line naming the key, before a trial of the new model joins the old ones."""
    from torchnlq.experiments.sweep import Sweep

    monkeypatch.chdir(tmp_path)
    path = sweep_suite(tmp_path, "trials = 2\n" + PARAMS, runs={"res": ["--model.query.type=residual_mlp"]})
    suite = load_suite(path)
    sweep = Sweep(suite, parse_sweep(suite, {}))
    sweep.check_studies()
    recorded = sweep.study(sweep.arms[0]).user_attrs["arm_config"]
    assert recorded["model.query.type"] == "residual_mlp" and "optimizer.lr" not in recorded  # searched: not part
    Sweep(suite, parse_sweep(suite, {"trials": "3"})).check_studies()  # the budget is not what the trials trained
    path.write_text(path.read_text().replace("--model.query.type=residual_mlp", "--model.query.type=identity"))
    edited = load_suite(path)
    with pytest.raises(UserError, match=r"its trials trained model.query.type = 'residual_mlp', and the suite's arm "
                                        r"'res' now gives 'identity'"):
        Sweep(edited, parse_sweep(edited, {})).check_studies()
