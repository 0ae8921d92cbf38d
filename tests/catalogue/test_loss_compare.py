"""The catalogue's rows of ``python scripts/loss_compare.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row, write
from catalogue.runner import mistake_tests

IN_PROCESS = [
    row("loss_compare.py", "side-missing", ["{tmp}/nowhere", "{runs}/a"],
        "A '{tmp}/nowhere' is neither a run folder, a loss file (.json), a config (.toml) nor REF:CONFIG"),
    row("loss_compare.py", "one-side-only", ["{runs}/a"], "the following arguments are required: B"),
    row("loss_compare.py", "unknown-commit", ["no-such-ref:train_configs/debug_model.toml", "{runs}/a"],
        "'no-such-ref' is not a commit of the git checkout"),
    row("loss_compare.py", "commit-without-the-config", ["HEAD:train_configs/nowhere.toml", "{runs}/a"],
        "commit HEAD has no file 'train_configs/nowhere.toml'"),
    row("loss_compare.py", "run-folder-without-training-losses", ["{runs}/a", "{runs}/b"],
        "'{runs}/a' holds no training losses (loss/train"),
    row("loss_compare.py", "loss-file-corrupt", ["{tmp}/l.json", "{runs}/a"], "'{tmp}/l.json' is corrupt",
        setup=write({"l.json": "{oops"})),
    row("loss_compare.py", "loss-file-of-a-list", ["{tmp}/list.json", "{runs}/a"],
        "'{tmp}/list.json' is not a loss file: its train_loss must map steps to losses",
        setup=write({"list.json": '{"train_loss": [5.7, 5.2]}'})),
    row("loss_compare.py", "set-not-key-value", ["{config}", "{config}", "--set", "training.steps"],
        "--set 'training.steps' is not KEY=VALUE"),
    # Both sides' overrides are checked before side A trains.
    row("loss_compare.py", "set-b-typo", ["{config}", "{config}", "--set-b", "training.stesp=3"],
        "unknown key 'training.stesp'"),
    row("loss_compare.py", "set-a-for-a-side-that-is-read", ["{runs}/a", "{config}", "--set-a", "training.steps=3"],
        "--set-a applies to a side that trains (a config or REF:CONFIG), not to A '{runs}/a'"),
    row("loss_compare.py", "set-for-two-sides-that-are-read", ["{runs}/a", "{runs}/b", "--set", "training.steps=3"],
        "--set applies to the sides that train (a config or REF:CONFIG); A and B are both read"),
    row("loss_compare.py", "tolerance-negative", ["{runs}/a", "{runs}/b", "--tolerance=-1e-5"],
        "--tolerance must be a finite number at least 0, got -1e-05"),
    row("loss_compare.py", "tolerance-nan", ["{runs}/a", "{runs}/b", "--tolerance", "nan"],
        "--tolerance must be a finite number at least 0, got nan"),
]

SUBPROCESS = [
    # A side that trains and fails: the trainer's own error line, in loss_compare's one line.
    row("loss_compare.py", "trained-side-fails", ["{config}", "{runs}/a", "--set", "data.path={tmp}/nowhere"],
        "the run of A ({config}) failed with exit code 2: error: data.path '{tmp}/nowhere' does not exist"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
