"""The catalogue's rows of ``python scripts/run_suite.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations


import pytest

from catalogue.rows import row, suite
from catalogue.runner import mistake_tests, valid_command_test

#: A suite of one run of the shared config: a suite row adds one mistake to it.
SUITE = 'config = "{config}"\n'

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
    row("run_suite.py", "overrides-not-a-list", ["{tmp}/str.toml", "--dry-run"], "overrides must be a list of strings",
        setup=suite(SUITE + 'overrides = "--training.steps=3"\n', "str.toml")),
    row("run_suite.py", "run-override-invalid", ["{tmp}/heads.toml", "--dry-run"], "run 'a': model.n_heads=3 does not divide",
        setup=suite(SUITE + '[[runs]]\nname = "a"\noverrides = ["--model.n_heads=3"]\n', "heads.toml")),
    row("run_suite.py", "shared-overrides-set-the-dump-folder", ["{tmp}/dump.toml", "--dry-run"],
        "set the suite's dump_folder instead", setup=suite(SUITE + 'overrides = ["--job.dump_folder=x"]\n', "dump.toml")),
    row("run_suite.py", "dump-folder-not-a-string", ["{tmp}/five.toml", "--dry-run"], "dump_folder must be a string, got 5",
        setup=suite(SUITE + "dump_folder = 5\n", "five.toml")),
    row("run_suite.py", "compare-step-zero", ["{tmp}/step.toml", "--dry-run"], "compare_step must be a positive integer step, got 0",
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
]

SUBPROCESS = [
    row("run_suite.py", "suite-file-is-a-folder", ["{tmp}", "--dry-run"], "suite file '{tmp}' not found"),
]

CONTROLS = [
    pytest.param("run_suite.py", ["{tmp}/s.toml", "--dry-run"], suite(SUITE), id="suite-dry-run"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)


test_the_valid_command_works = valid_command_test(CONTROLS)
