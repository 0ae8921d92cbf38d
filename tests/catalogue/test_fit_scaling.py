"""The catalogue's rows of ``python scripts/fit_scaling.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import folders, row, write
from catalogue.runner import mistake_tests

IN_PROCESS = [
    row("fit_scaling.py", "no-runs", [], "the following arguments are required: runs"),
    row("fit_scaling.py", "run-folder-missing", ["{tmp}/nowhere"],
        "'{tmp}/nowhere' is neither a run folder (with run_info.json) nor a folder of runs"),
    row("fit_scaling.py", "empty-folder-of-runs", ["{tmp}/empty"], "'{tmp}/empty' is neither a run folder",
        setup=folders("empty")),
    row("fit_scaling.py", "run-without-its-compute", ["{runs}/a", "{runs}/b"], "records no flops_per_token"),
    row("fit_scaling.py", "at-flops-negative", ["{runs}/a", "--at-flops=-1e18"],
        "--at-flops must be a positive number of FLOPs, got -1e+18"),
    row("fit_scaling.py", "at-flops-not-a-number", ["{runs}/a", "--at-flops", "lots"],
        "argument --at-flops: invalid float value: 'lots'"),
    row("fit_scaling.py", "out-is-a-file", ["{runs}/a", "--out", "{tmp}/notes.txt"],
        "--out '{tmp}/notes.txt' exists and is not a folder", setup=write({"notes.txt": "mine"})),
    row("fit_scaling.py", "out-is-a-fitted-run", ["{runs}/a", "{runs}/b", "--out", "{runs}/b"],
        "is inside the run folder '{runs}/b' being compared"),
    row("fit_scaling.py", "runs-of-other-data", ["{runs}/a", "{runs}/other_batches"],
        "the runs saw different training batches"),
    row("fit_scaling.py", "allow-exact-fits-given-a-value", ["{runs}/a", "--allow-exact-fits=yes"],
        "argument --allow-exact-fits: ignored explicit argument 'yes'"),
]

SUBPROCESS = [
    row("fit_scaling.py", "run-folder-missing-in-a-process", ["{tmp}/elsewhere"],
        "'{tmp}/elsewhere' is neither a run folder (with run_info.json) nor a folder of runs"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
