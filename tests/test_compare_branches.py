"""compare_runs on a trunk and its branches (issue 40.4): each run is read at its own last validation.

docs/training.md: "Compare the branches and their stable run ..., each branch at its last validation". Drawn here:
a stable trunk, branch points, each branch's length and validation interval (so branches often share validation
steps after the branch point, where a longer branch is still decaying); the comparison must read every run at
the largest step it validated at, name that step, and compute the relative improvement from those losses.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from helpers.runs import branch, make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchnlq.experiments.compare import compare, compare_runs, load_run, markdown_table

SETTINGS = dict(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@st.composite
def trunk_and_branches(draw: st.DrawFn) -> tuple[dict[int, float], list[tuple[int, dict[int, float]]]]:
    """The trunk's validation losses and, per branch, its branch point and validation losses (from the point on)."""
    interval = draw(st.sampled_from([50, 100]))
    trunk_end = interval * draw(st.integers(3, 8))
    trunk = {s: 4.0 - s / 1e4 for s in range(interval, trunk_end + 1, interval)}
    branches = []
    for _ in range(draw(st.integers(1, 3))):
        at = interval * draw(st.integers(1, trunk_end // interval - 1))
        every = draw(st.sampled_from([25, 50, 100]))
        end = at + every * draw(st.integers(1, 6))
        later = range(at + every, end + 1, every)
        losses = {at: trunk[at]} | {s: trunk[at] - draw(st.floats(0.01, 0.5)) for s in later}
        branches.append((at, losses))
    return trunk, branches


@settings(max_examples=15, **SETTINGS)
@given(case=trunk_and_branches(), baseline_is_trunk=st.booleans())
def test_a_trunk_and_its_branches_are_each_read_at_their_last_validation(tmp_path_factory, case,
                                                                         baseline_is_trunk) -> None:
    trunk_val, branches = case
    root = tmp_path_factory.mktemp("branches")
    trunk = make_run(root, "stable", dict(trunk_val), "--lr_schedule.name=wsd")
    runs = [trunk] + [branch(root, f"decay{i}", trunk, at, dict(val), f"--optimizer.weight_decay=0.{i + 1}")
                      for i, (at, val) in enumerate(branches)]  # an arm each (a weight decay of its own)
    expected = {"stable": trunk_val} | {f"decay{i}": val for i, (_, val) in enumerate(branches)}
    base = "stable" if baseline_is_trunk else "decay0"
    loaded = [load_run(p) for p in runs]  # compare() itself: the plots and files are test_compare.py's
    groups, _, at = compare(loaded, next(r for r in loaded if r.name == base))
    read = {r.name: (at.of(r), r.val[at.of(r)]) for r in loaded}
    for name, val in expected.items():  # the last validation of each, whatever steps the others share
        assert read[name][0] == max(val) and read[name][1] == pytest.approx(val[max(val)])
    assert at.header == "val loss @ last validation" and "every run is compared at its own last validation" in at.how
    table = {line.split("|")[1].strip(): line for line in markdown_table(groups, at).splitlines()[2:]}
    step_column = len({step for step, _ in read.values()}) > 1  # shown where the runs' steps differ
    for name, (step, loss) in read.items():  # the step, and the improvement from the losses read there
        gain = "0 (baseline)" if name == base else f"{100 * (read[base][1] - loss) / read[base][1]:+.2f}%"
        assert (f"| {step} " if step_column else "") + f"| {loss:.4f} | {gain} |" in table[name]


def test_runs_without_a_branch_still_compare_at_their_last_common_step(tmp_path: Path) -> None:
    a = make_run(tmp_path, "a", {100: 3.0, 200: 2.8, 300: 2.7})
    b = make_run(tmp_path, "b", {100: 3.1, 200: 2.9}, "--training.seed=2", "--optimizer.lr=0.001")
    compare_runs([a, b], "a", tmp_path / "cmp")
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO((tmp_path / "cmp" / "runs.csv").read_text()))}
    assert (rows["a"]["step"], rows["b"]["step"]) == ("200", "200")
    assert "the last validation step common to all runs" in (tmp_path / "cmp" / "comparison.md").read_text()
