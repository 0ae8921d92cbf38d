"""The catalogue's rows of ``python scripts/run_suite.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations


import pytest

from catalogue.rows import row, suite
from catalogue.runner import mistake_tests, valid_command_test

#: A suite of one run of the shared config: a suite row adds one mistake to it.
SUITE = 'config = "{config}"\n'
#: A valid [sweep] of that run, for the rows that break one of its keys.
SWEEP = '[sweep]\ntrials = 2\n[sweep.params]\n"optimizer.lr" = {low = 1e-4, high = 1e-2, log = true}\n'

IN_PROCESS = [
    row("run_suite.py", "suite-file-not-given", [], "give the suite file first"),
    row("run_suite.py", "option-before-the-suite-file", ["--dry-run", "{tmp}/s.toml"], "give the suite file first",
        setup=suite(SUITE)),
    row("run_suite.py", "suite-file-missing", ["{tmp}/missing.toml", "--dry-run"], "suite file '{tmp}/missing.toml' not found"),
    row("run_suite.py", "suite-not-valid-toml", ["{tmp}/syntax.toml", "--dry-run"], "is not valid TOML",
        setup=suite("config = \n", "syntax.toml")),
    row("run_suite.py", "unknown-suite-key", ["{tmp}/basline.toml", "--dry-run"], "unknown key 'basline'; did you mean 'baseline'?",
        setup=suite(SUITE + 'basline = "run"\n', "basline.toml")),
    row("run_suite.py", "neither-config-nor-runs", ["{tmp}/empty.toml", "--dry-run"], "give a top-level config",
        setup=suite('dump_folder = "x"\n', "empty.toml")),
    row("run_suite.py", "run-config-missing", ["{tmp}/runcfg.toml", "--dry-run"], "config 'missing.toml' not found",
        setup=suite('[[runs]]\nname = "a"\nconfig = "missing.toml"\n', "runcfg.toml")),
    row("run_suite.py", "grid-key-typo", ["{tmp}/typ.toml", "--dry-run"], "did you mean 'type'?",
        setup=suite(SUITE + '[grid]\n"model.query.typ" = ["linear"]\n', "typ.toml")),
    row("run_suite.py", "grid-value-of-the-wrong-type", ["{tmp}/many.toml", "--dry-run"], "grid key 'training.steps' = 'many'",
        setup=suite(SUITE + '[grid]\n"training.steps" = ["many"]\n', "many.toml")),
    row("run_suite.py", "grid-empty-list", ["{tmp}/none.toml", "--dry-run"], "grid key 'training.seed' needs a non-empty list",
        setup=suite(SUITE + '[grid]\n"training.seed" = []\n', "none.toml")),
    row("run_suite.py", "grid-value-twice", ["{tmp}/twice.toml", "--dry-run"], "grid key 'training.seed' lists 1 twice",
        setup=suite(SUITE + '[grid]\n"training.seed" = [1, 2, 1]\n', "twice.toml")),
    row("run_suite.py", "grid-not-a-table", ["{tmp}/grid5.toml", "--dry-run"], "[grid] must map dotted config keys",
        setup=suite(SUITE + "grid = 5\n", "grid5.toml")),
    row("run_suite.py", "scaling-beside-runs", ["{tmp}/scr.toml", "--dry-run"], "[scaling] makes the suite's runs",
        setup=suite(SUITE + '[[runs]]\nname = "a"\n[scaling]\nsizes = ["debug"]\n', "scr.toml")),
    row("run_suite.py", "scaling-size-without-its-width", ["{tmp}/sz.toml", "--dry-run"],
        "sizes[0] = {'n_layers': 2}: give a flavor name or", setup=suite(SUITE + "[scaling]\nsizes = [{n_layers = 2}]\n",
                                                                     "sz.toml")),
    row("run_suite.py", "scaling-two-budget-rules", ["{tmp}/rules.toml", "--dry-run"],
        "gives tokens_per_parameter and tokens", setup=suite(
            SUITE + '[scaling]\nsizes = ["debug"]\ntokens = [1000]\ntokens_per_parameter = 20\n', "rules.toml")),
    row("run_suite.py", "scaling-lr-base-for-one-query", ["{tmp}/lrq.toml", "--dry-run"], "give one base per query type",
        setup=suite(SUITE + '[scaling]\nsizes = ["debug"]\nlr = {base = {linear = 1e-3}, at_dim = 128}\n', "lrq.toml")),
    row("run_suite.py", "scaling-with-a-step-override", ["{tmp}/stp.toml", "--dry-run", "--training.steps=5"],
        "--training.steps is set per run by the suite's [scaling] rules",
        setup=suite(SUITE + '[scaling]\nsizes = ["debug"]\n', "stp.toml")),
    row("run_suite.py", "baseline-not-a-run", ["{tmp}/nope.toml", "--dry-run"], "baseline 'nope' is not a run name",
        setup=suite(SUITE + 'baseline = "nope"\n', "nope.toml")),
    row("run_suite.py", "run-name-twice", ["{tmp}/dup.toml", "--dry-run"], "run name 'a' appears twice",
        setup=suite(SUITE + '[[runs]]\nname = "a"\n[[runs]]\nname = "a"\n', "dup.toml")),
    row("run_suite.py", "run-without-a-name", ["{tmp}/noname.toml", "--dry-run"], "runs[0] needs a name",
        setup=suite(SUITE + '[[runs]]\noverrides = []\n', "noname.toml")),
    row("run_suite.py", "run-sets-job-name", ["{tmp}/jobname.toml", "--dry-run"], "the suite sets job.name and job.dump_folder",
        setup=suite(SUITE + '[[runs]]\nname = "a"\noverrides = ["--job.name=x"]\n', "jobname.toml")),
    row("run_suite.py", "overrides-not-a-list", ["{tmp}/str.toml", "--dry-run"], "overrides expects a list of str, got '--training.steps=3'",
        setup=suite(SUITE + 'overrides = "--training.steps=3"\n', "str.toml")),
    row("run_suite.py", "run-override-invalid", ["{tmp}/heads.toml", "--dry-run"], "run 'a': model.n_heads=3 does not divide",
        setup=suite(SUITE + '[[runs]]\nname = "a"\noverrides = ["--model.n_heads=3"]\n', "heads.toml")),
    row("run_suite.py", "shared-overrides-set-the-dump-folder", ["{tmp}/dump.toml", "--dry-run"],
        "set the suite's dump_folder instead", setup=suite(SUITE + 'overrides = ["--job.dump_folder=x"]\n', "dump.toml")),
    row("run_suite.py", "dump-folder-not-a-string", ["{tmp}/five.toml", "--dry-run"], "dump_folder expects str, got int 5",
        setup=suite(SUITE + "dump_folder = 5\n", "five.toml")),
    row("run_suite.py", "compare-step-zero", ["{tmp}/step.toml", "--dry-run"], "compare_step must be >= 1, got 0",
        setup=suite(SUITE + "compare_step = 0\n", "step.toml")),
    row("run_suite.py", "command-line-flattens-a-varied-key", ["{tmp}/seeds.toml", "--dry-run", "--training.seed=5"],
        "--training.seed is set per run by the suite", setup=suite(SUITE + '[grid]\n"training.seed" = [1, 2]\n', "seeds.toml")),
    row("run_suite.py", "command-line-sets-job-name", ["{tmp}/s.toml", "--dry-run", "--job.name=x"],
        "the suite names its runs; do not override job.name", setup=suite(SUITE)),
    row("run_suite.py", "command-line-dump-folder-without-a-value", ["{tmp}/s.toml", "--dry-run", "--job.dump_folder"],
        "--job.dump_folder needs a value", setup=suite(SUITE)),
    row("run_suite.py", "command-line-override-typo", ["{tmp}/s.toml", "--dry-run", "--training.stesp=3"],
        "run 'run': unknown key 'training.stesp'", setup=suite(SUITE)),
    # Not a dry run: the data of every run is opened before the first launch.
    row("run_suite.py", "data-folder-missing", ["{tmp}/s.toml", "--data.path={tmp}/nowhere"],
        "run 'run': data.path '{tmp}/nowhere' does not exist", setup=suite(SUITE)),

    # The executors (docs/experiments.md, "On a cluster").
    row("run_suite.py", "executor-name-typo", ["{tmp}/s.toml", "--dry-run", "--executor", "pol"],
        "executor.type: 'pol' is not one of local, pool, slurm; did you mean 'pool'?", setup=suite(SUITE)),
    row("run_suite.py", "executor-key-typo", ["{tmp}/s.toml", "--dry-run", "--executor.workrs=2"],
        "unknown key 'executor.workrs'; did you mean 'workers'?", setup=suite(SUITE)),
    row("run_suite.py", "executor-workers-zero", ["{tmp}/s.toml", "--dry-run", "--executor.workers=0"],
        "executor.workers must be >= 1, got 0", setup=suite(SUITE)),
    row("run_suite.py", "executor-option-without-a-value", ["{tmp}/s.toml", "--dry-run", "--executor.partition"],
        "--executor.partition needs a value", setup=suite(SUITE)),
    row("run_suite.py", "executor-option-without-a-key", ["{tmp}/s.toml", "--dry-run", "--executor.=slurm"],
        "name the key, e.g. --executor.KEY=VALUE", setup=suite(SUITE)),
    row("run_suite.py", "executor-not-a-table", ["{tmp}/ex.toml", "--dry-run"], "executor must be a table",
        setup=suite(SUITE + 'executor = "slurm"\n', "ex.toml")),
    row("run_suite.py", "executor-table-key-typo", ["{tmp}/part.toml", "--dry-run"], "unknown key 'executor.partiton'; did you mean 'partition'?",
        setup=suite(SUITE + '[executor]\npartiton = "gpu"\n', "part.toml")),
    # The tables through the config's checker: a wrong type, out of range, an unknown key, an unknown executor.
    row("run_suite.py", "executor-workers-not-a-number", ["{tmp}/two.toml", "--dry-run"],
        "executor.workers expects int, got str 'two'", setup=suite(SUITE + '[executor]\nworkers = "two"\n', "two.toml")),
    row("run_suite.py", "executor-gpus-negative", ["{tmp}/s.toml", "--dry-run", "--executor.gpus_per_run=-1"],
        "executor.gpus_per_run must be >= 0, got -1", setup=suite(SUITE)),
    row("run_suite.py", "executor-type-in-the-table-unknown", ["{tmp}/k8s.toml", "--dry-run"],
        "executor.type: 'kubernetes' is not one of local, pool, slurm",
        setup=suite(SUITE + '[executor]\ntype = "kubernetes"\n', "k8s.toml")),
    row("run_suite.py", "executor-list-key-not-a-list", ["{tmp}/setup.toml", "--dry-run"],
        "executor.setup expects a list of str, got 5",
        setup=suite(SUITE + '[executor]\ntype = "slurm"\nsetup = 5\n', "setup.toml")),
    row("run_suite.py", "sweep-key-typo", ["{tmp}/trails.toml", "--dry-run"],
        "unknown key 'sweep.trails'; did you mean 'trials'?",
        setup=suite(SUITE + SWEEP.replace("trials = 2", "trails = 2"), "trails.toml")),
    row("run_suite.py", "sweep-poll-seconds-zero", ["{tmp}/sw.toml", "--dry-run", "--sweep.poll_seconds=0"],
        "sweep.poll_seconds must be > 0, got 0.0", setup=suite(SUITE + SWEEP, "sw.toml")),
    row("run_suite.py", "sweep-seeds-not-integers", ["{tmp}/seeds.toml", "--dry-run"],
        "sweep.rerun_seeds expects a list of int", setup=suite(SUITE + SWEEP.replace("trials = 2",
                                                                                     'trials = 2\nrerun_seeds = ["a"]'),
                                                               "seeds.toml")),
    row("run_suite.py", "scaling-key-typo", ["{tmp}/size.toml", "--dry-run"],
        "unknown key 'scaling.size'; did you mean 'sizes'?", setup=suite(SUITE + '[scaling]\nsize = ["debug"]\n',
                                                                         "size.toml")),
    row("run_suite.py", "scaling-warmup-not-a-number", ["{tmp}/warm.toml", "--dry-run"],
        "scaling.warmup_fraction expects float, got str 'a lot'",
        setup=suite(SUITE + '[scaling]\nsizes = ["debug"]\nwarmup_fraction = "a lot"\n', "warm.toml")),
    row("run_suite.py", "scaling-budget-zero", ["{tmp}/zero.toml", "--dry-run"], "scaling.tokens[0] must be >= 1, got 0",
        setup=suite(SUITE + '[scaling]\nsizes = ["debug"]\ntokens = [0]\n', "zero.toml")),
    row("run_suite.py", "suite-plugins-typo", ["{tmp}/plug.toml", "--dry-run"],
        "unknown key 'plugin'; did you mean 'plugins'?", setup=suite('plugin = ["x"]\n' + SUITE, "plug.toml")),
    row("run_suite.py", "suite-plugin-missing", ["{tmp}/plugs.toml", "--dry-run"],
        "plugins: cannot import 'no_such_executor'", setup=suite('plugins = ["no_such_executor"]\n' + SUITE,
                                                                 "plugs.toml")),
    row("run_suite.py", "run-name-not-a-string", ["{tmp}/name5.toml", "--dry-run"], "runs[0].name expects str, got int 5",
        setup=suite(SUITE + '[[runs]]\nname = 5\n', "name5.toml")),
    row("run_suite.py", "pool-devices-this-machine-lacks", ["{tmp}/s.toml", "--executor", "pool",
        "--executor.devices=[7]"], "executor.devices lists GPU 7, but this machine shows", setup=suite(SUITE),
        needs_no_cuda=True),
    row("run_suite.py", "wait-without-slurm", ["{tmp}/s.toml", "--wait"], "--wait is for --executor slurm",
        setup=suite(SUITE)),
    row("run_suite.py", "dry-run-and-status", ["{tmp}/s.toml", "--dry-run", "--status"], "give one of them",
        setup=suite(SUITE)),
    # Sweeps (docs/experiments.md, "Sweeps").
    row("run_suite.py", "sweep-option-without-a-sweep", ["{tmp}/s.toml", "--dry-run", "--sweep.trials=3"],
        "has no [sweep] table to change", setup=suite(SUITE)),
    row("run_suite.py", "sweep-without-params", ["{tmp}/np.toml", "--dry-run"], "needs [sweep.params]",
        setup=suite(SUITE + "[sweep]\ntrials = 2\n", "np.toml")),
    row("run_suite.py", "sweep-sampler-typo", ["{tmp}/tpe.toml", "--dry-run"], "sweep.sampler: 'tpee' is not one of tpe, random, grid, cmaes; did you mean 'tpe'?",
        setup=suite(SUITE + SWEEP.replace("trials = 2", 'trials = 2\nsampler = "tpee"'), "tpe.toml")),
    row("run_suite.py", "sweep-trials-on-the-command-line-not-a-number", ["{tmp}/sw.toml", "--dry-run",
        "--sweep.trials=many"], "--sweep.trials expects an integer, got 'many'", setup=suite(SUITE + SWEEP, "sw.toml")),
    row("run_suite.py", "sweep-heartbeat-not-a-whole-number-of-seconds", ["{tmp}/sw.toml", "--dry-run",
        "--sweep.heartbeat_seconds=0.5"], "--sweep.heartbeat_seconds expects an integer, got '0.5'",
        setup=suite(SUITE + SWEEP, "sw.toml")),
    row("run_suite.py", "sweep-storage-in-memory-sqlite", ["{tmp}/mem.toml", "--dry-run"],
        "is an in-memory SQLite database", setup=suite(SUITE + SWEEP.replace("trials = 2", 'trials = 2\nstorage = "sqlite://"'), "mem.toml")),
    row("run_suite.py", "sweep-storage-malformed-sqlite-url", ["{tmp}/url.toml"],
        "looks like a URL without '//'", setup=suite(SUITE + SWEEP.replace("trials = 2", 'trials = 2\nstorage = "sqlite:s.db"'), "url.toml")),
    row("run_suite.py", "sweep-rerun-overrides-a-searched-key", ["{tmp}/ro.toml", "--dry-run"],
        "must be --key=value of a setting that is neither searched nor job.*",
        setup=suite(SUITE + SWEEP.replace("trials = 2", 'trials = 2\nrerun_seeds = [1]\nrerun_overrides = ["--optimizer.lr=0.1"]'), "ro.toml")),
    row("run_suite.py", "sweep-objective-tokens-not-a-whole-step", ["{tmp}/ot.toml"], "is not a whole step of run",
        setup=suite(SUITE + SWEEP.replace("trials = 2", "trials = 2\nobjective_tokens = 1001"), "ot.toml")),
    row("run_suite.py", "sweep-param-range-reversed", ["{tmp}/rev.toml", "--dry-run"], "needs numbers low < high",
        setup=suite(SUITE + SWEEP.replace("low = 1e-4, high = 1e-2", "low = 1e-2, high = 1e-4"), "rev.toml")),
    row("run_suite.py", "sweep-param-unknown-key", ["{tmp}/key.toml", "--dry-run"], "unknown key 'optimizer.lrr'",
        setup=suite(SUITE + SWEEP.replace('"optimizer.lr"', '"optimizer.lrr"'), "key.toml")),
    row("run_suite.py", "sweep-pruner-option-typo", ["{tmp}/pr.toml", "--dry-run"], "did you mean 'n_startup_trials'?",
        setup=suite(SUITE + SWEEP.replace("trials = 2", "trials = 2\npruner_options = {n_startup_trial = 1}"),
                    "pr.toml")),
    row("run_suite.py", "sweep-storage-that-cannot-be-opened", ["{tmp}/sw.toml",
        "--sweep.storage=sqlite:///{tmp}/no/such/folder/x.db"], "/no/such/folder does not exist; make it",
        setup=suite(SUITE + SWEEP, "sw.toml")),
]

SUBPROCESS = [
    row("run_suite.py", "suite-file-is-a-folder", ["{tmp}", "--dry-run"], "suite file '{tmp}' not found"),
    # Only this Python on PATH: no sbatch, squeue, scontrol.
    row("run_suite.py", "slurm-commands-missing", ["{tmp}/s.toml", "--executor", "slurm"],
        "the slurm executor needs SLURM's sbatch, squeue, scontrol on PATH", setup=suite(SUITE),
        env={"PATH": "/nonexistent"}),
    # A sweep too: refused before its storage (sweep.db) or the suite's folder exists.
    row("run_suite.py", "slurm-commands-missing-for-a-sweep", ["{tmp}/sw.toml", "--executor", "slurm"],
        "the slurm executor needs SLURM's sbatch, squeue, scontrol on PATH", setup=suite(SUITE + SWEEP, "sw.toml"),
        env={"PATH": "/nonexistent"}),
]

CONTROLS = [
    pytest.param("run_suite.py", ["{tmp}/s.toml", "--dry-run"], suite(SUITE), id="suite-dry-run"),
    pytest.param("run_suite.py", ["{tmp}/sw.toml", "--dry-run", "--executor", "slurm"], suite(SUITE + SWEEP, "sw.toml"),
                 id="sweep-dry-run-on-slurm"),
    pytest.param("run_suite.py", ["{tmp}/sw.toml", "--status"], suite(SUITE + SWEEP, "sw.toml"), id="sweep-status"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)


test_the_valid_command_works = valid_command_test(CONTROLS)
