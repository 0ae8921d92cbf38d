"""Generated mistakes (Hypothesis) for evaluate.py: any source, data or multiple-choice file, options and device.

The invariant (tests/helpers/generated_tools.py): exit 0 with the report, or exit 2 with one ``error:`` line;
evaluate writes nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_generated import assert_outcome

from helpers.checkpoints import load_script
from helpers.generated_tools import (  # noqa: F401 - model_files, no_tiktoken_download: fixtures
    DEVICES, MC_ROWS, SETTINGS, SOURCES, call, int_text, model_files, no_tiktoken_download, source_path, tree,
    varied,
)


GOOD_EVALUATE = {"source": "ckpt", "mode": "data", "data": "data", "mc": "mc.jsonl", "options": {}, "device": "cpu",
                 "plugins": None}
EVALUATE = varied(GOOD_EVALUATE, {
    "source": SOURCES,
    "mode": st.sampled_from(["data", "multiple-choice", "multiple-choice", "both", "neither"]),
    "data": st.sampled_from(["data", "missing", "empty_folder", "ckpt", "mc.jsonl"]),
    "mc": st.sampled_from(["mc.jsonl", "mc_empty.jsonl", "mc_bad.jsonl", "mc_binary.jsonl", "missing", "data"]),
    "options": st.dictionaries(
        st.sampled_from(["sequences", "micro-batch-size", "seed", "seq-len", "limit", "batch-size"]),
        int_text(), max_size=3),
    "device": DEVICES,
    "plugins": st.none() | st.sampled_from(["", "json", "no_such_module_here", "../x"]),
})


def report(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.splitlines())


@settings(max_examples=40, **SETTINGS)
@given(EVALUATE)
@example(GOOD_EVALUATE)
@example({**GOOD_EVALUATE, "source": "export", "mode": "multiple-choice", "options": {"limit": "1"}})
@example({**GOOD_EVALUATE, "options": {"sequences": "3", "micro-batch-size": "1000000000000"}})
def test_evaluate_any_options_report_or_are_one_line(model_files: Path, draw: dict) -> None:
    script = load_script("evaluate")
    options = draw["options"]
    argv = [source_path(model_files, draw["source"])]
    if draw["mode"] in ("data", "both"):
        argv.append(f"--data={source_path(model_files, draw['data'])}")
    if draw["mode"] in ("multiple-choice", "both"):
        argv.append(f"--multiple-choice={source_path(model_files, draw['mc'])}")
    argv += [f"--{k}={v}" for k, v in options.items()] + [f"--device={draw['device']}"]
    argv += [f"--plugins={draw['plugins']}"] if draw["plugins"] is not None else []
    before = tree(model_files)
    code, stdout, err = call(script.main, argv)
    assert_outcome(code, err)
    assert tree(model_files) == before  # evaluate writes nothing
    if code == 0:
        result = report(stdout)
        if draw["mode"] == "data":
            assert math.isfinite(float(result["val_loss"])) and float(result["perplexity"]) > 1
            assert int(result["sequences"]) == int(options.get("sequences", 10))  # the run's recorded 10
        else:
            assert 0 <= float(result["acc"]) <= 1 and 0 <= float(result["acc_norm"]) <= 1
            assert int(result["rows"]) == min(len(MC_ROWS), int(options.get("limit", len(MC_ROWS))))


def test_evaluate_a_huge_sequence_count_is_one_line(model_files: Path) -> None:
    """10**12 sequences were an 8 TB allocation and a traceback; they are refused against the machine's memory."""
    script = load_script("evaluate")
    before = tree(model_files)
    code, _, err = call(script.main, [str(model_files / "ckpt"), f"--data={model_files / 'data'}",
                                      "--sequences=1000000000000"])
    assert code == 2 and err.startswith("error: --sequences=1000000000000 of 16 tokens take ")
    assert err.strip().endswith("of memory; lower --sequences") and len(err.strip().splitlines()) == 1, err
    assert tree(model_files) == before
