"""The catalogue's rows of ``python scripts/model_summary.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations


import pytest

from catalogue.rows import row, write
from catalogue.runner import mistake_tests, valid_command_test

IN_PROCESS = [
    row("model_summary.py", "config-file-missing", ["nowhere.toml"], "config file 'nowhere.toml' not found"),
    row("model_summary.py", "processes-not-a-number", ["--processes", "two"], "argument --processes: expects a positive integer, got 'two'"),
    row("model_summary.py", "processes-zero", ["--processes=0"], "argument --processes: expects a positive integer, got '0'"),
    row("model_summary.py", "processes-without-a-value", ["--processes"], "argument --processes: expected one argument"),
    row("model_summary.py", "card-gib-not-finite", ["--card-gib=nan"], "argument --card-gib: expects a positive number, got 'nan'"),
    row("model_summary.py", "card-gib-for-a-cpu-run", ["--training.device=cpu", "--card-gib=24"],
        "--card-gib is a GPU's memory, but this config trains on the CPU (training.device = cpu); drop --card-gib or "
        "add --training.device=cuda"),
    row("model_summary.py", "toml-syntax-error", ["{tmp}/syntax.toml"], "is not valid TOML",
        setup=write({"syntax.toml": "[model\n"})),
    row("model_summary.py", "unknown-key", ["--model.dimm=64"], "unknown key 'model.dimm' in model; did you mean 'dim'?"),
    row("model_summary.py", "unknown-flavor", ["--model.flavor=gpt_huge"], "model.flavor: unknown 'gpt_huge'"),
    row("model_summary.py", "unknown-model-family", ["--model.family=moee"], "model.family: unknown 'moee'"),
    row("model_summary.py", "the-old-block-option", ["--model.block=prenorm"], "model.block was removed: families are model.family now"),
    row("model_summary.py", "heads-do-not-divide-dim", ["--model.dim=100", "--model.n_heads=3"],
        "model.n_heads=3 does not divide model.dim=100"),
    row("model_summary.py", "seq-len-above-the-positions", ["--training.seq_len=2048"], "exceeds the model's max_seq_len=256"),
    row("model_summary.py", "bare-section", ["--model"], "option '--model' must be --section.key"),
    row("model_summary.py", "two-config-files", ["a.toml", "b.toml"], "two config files given ('a.toml' and 'b.toml')"),
]

SUBPROCESS = [
    row("model_summary.py", "unknown-section", ["--modell.dim=64"], "unknown section 'modell' in config; did you mean 'model'?"),
]

CONTROLS = [
    pytest.param("model_summary.py", [], None, id="model-summary"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)


test_the_valid_command_works = valid_command_test(CONTROLS)
