"""A tuned comparison: each arm at its own best setting (docs/experiments.md, "Sweeps").

When every study of a sweep is done: ``best_<arm>.toml`` (the best trial's resolved config, trainable as it is),
Optuna's plots of each study, then the reruns: each best config at ``rerun_seeds`` on the same batches, an
ordinary suite (:func:`tuned_suite`) whose end is compare_runs' table.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any, TextIO

from torchnlq.config.manager import load_job_config
from torchnlq.config.render import to_toml
from torchnlq.errors import UserError
from torchnlq.experiments.suite import Suite, SuiteRun, display_path
from torchnlq.experiments.sweep import Sweep, counted_trials, describe
from torchnlq.files import OwnedFolder, replace_file

PLOTS_FOLDER = "plots"


def best_config_path(sweep: Sweep, arm: SuiteRun) -> Path:
    return sweep.dump / f"best_{arm.name}.toml"


def best_trial(sweep: Sweep, arm: SuiteRun) -> Any:
    """The arm's best COMPLETE trial (lowest objective); one line when none completed."""
    import optuna

    study = sweep.study(arm)
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        raise UserError(f"arm '{arm.name}': none of its {len(counted_trials(study))} trials completed (see --status "
                        f"and {display_path(sweep.dump / 'logs' / arm.name)}); widen the search or raise trials")
    return min(done, key=lambda t: (t.value, t.number))


def write_best_configs(sweep: Sweep, out: TextIO) -> dict[str, Path]:
    """``<dump>/best_<arm>.toml`` for every arm: the resolved config of its best trial, named ``best_<arm>``."""
    written = {}
    for arm in sweep.arms:
        trial = best_trial(sweep, arm)
        run = sweep.trial_run(arm, trial.number, trial.params)
        cfg = load_job_config([*run.argv(), f"--job.name=best_{arm.name}", f"--job.dump_folder={sweep.dump}"])
        path = best_config_path(sweep, arm)
        header = (f"# The best of {len(counted_trials(sweep.study(arm)))} trials of study '{sweep.study_name(arm)}' "
                  f"({sweep.storage_url}): trial {trial.number}, validation loss {trial.value:.6g}\n"
                  f"# {describe(trial.params)}\n# Train it: ./run_train.sh {display_path(path)}\n")
        replace_file(path, header + to_toml(cfg))
        written[arm.name] = path
        print(f"[sweep] {arm.name}: best trial {trial.number} ({describe(trial.params)}), validation loss "
              f"{trial.value:.4f} -> {display_path(path)}", file=out, flush=True)
    return written


def write_plots(sweep: Sweep, out: TextIO) -> list[Path]:
    """Optuna's own figures of each study (objective vs trial, learning curves with the pruned ones, parameter
    importances, a slice per parameter) as PNGs in ``<dump>/plots/``; none without matplotlib (said once)."""
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import matplotlib as vis

    from torchnlq.experiments.compare_plots import pyplot

    plt = pyplot()
    if plt is None:
        print("[sweep] no plots: matplotlib is not installed (pip install -e '.[plots]')", file=out)
        return []
    folder = OwnedFolder(sweep.dump / PLOTS_FOLDER)
    figures = {
        "history": vis.plot_optimization_history,
        "intermediate": vis.plot_intermediate_values,
        "importances": lambda s: vis.plot_param_importances(s, evaluator=PedAnovaImportanceEvaluator()),
        "slice": vis.plot_slice,
    }
    written = []
    for arm in sweep.arms:
        study = sweep.study(arm)
        for kind, draw in figures.items():
            if kind == "importances" and len(sweep.spec.params) < 2:
                continue  # one parameter has all the importance
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib figures experimental
                try:
                    axes = draw(study)
                except (ValueError, RuntimeError, ZeroDivisionError) as e:  # too few trials for this figure
                    print(f"[sweep] no {kind} plot of {arm.name}: {e}", file=out)
                    continue
            first = axes.flat[0] if hasattr(axes, "flat") else axes
            if kind == "intermediate":
                first.set_xlabel("training tokens seen (the pruner's step)")
            figure = first.figure
            figure.suptitle(sweep.study_name(arm))
            png = io.BytesIO()
            figure.savefig(png, format="png", dpi=110, bbox_inches="tight")
            plt.close(figure)
            written.append(folder.write(f"{arm.name}_{kind}.png", png.getvalue()))
    if written:
        print(f"[sweep] plots: {display_path(sweep.dump / PLOTS_FOLDER)}/ ({len(written)} figures)", file=out)
    return written


def tuned_suite(sweep: Sweep) -> Suite | None:
    """The reruns as a suite of their own (same dump folder and log): ``best_<arm>_seed<S>`` for every arm and
    rerun seed, from ``best_<arm>.toml`` with ``rerun_overrides`` (another width: µP's transfer); None without
    rerun seeds."""
    seeds = sweep.spec.rerun_seeds
    if not seeds:
        return None
    suite, runs = sweep.suite, []
    for arm in sweep.arms:
        config = best_config_path(sweep, arm)
        if not config.is_file():
            raise UserError(f"{config} is missing: the studies are done but their best configs were not written; "
                            "run the same command again")
        for seed in seeds:
            name = f"best_{arm.name}_seed{seed}"
            overrides = (f"--training.seed={seed}", *sweep.spec.rerun_overrides, f"--job.name={name}",
                         f"--job.dump_folder={suite.dump_folder}")
            steps = load_job_config([str(config), *overrides]).training.steps
            runs.append(SuiteRun(name, arm.name, config, overrides, steps))
    baseline = next(r.name for r in runs if r.arm == suite.baseline)
    return Suite(suite.path, suite.name, suite.description, suite.dump_folder, runs, baseline, suite.compare_step)

