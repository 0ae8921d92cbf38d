"""What the generated-mistake tests of the tools share (tests/test_generated_<tool>.py): Hypothesis settings, the
user's tree before and after, a tool's main called in this process, the drawn option values, the tiny model files
evaluate.py and generate.py read, and a tool held at a chosen moment in a subprocess to be sent SIGTERM.

The invariant they assert, as tests/test_generated.py does for the trainer: exit 0 with the promised result, or
exit 2 with exactly one ``error:`` line, no traceback, and every file the user had still there, byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event
from hypothesis import strategies as st
from test_generated import SETTINGS as TRAINER_SETTINGS
from test_generated import scratch

from helpers import REPO_ROOT
from helpers.checkpoints import load_script, tiny_model, write_byte_data, write_checkpoint
from helpers.train import script_env
from torchnlq.cli import run_cli

SETTINGS = {**TRAINER_SETTINGS,
            "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]}


@pytest.fixture(autouse=True)
def no_tiktoken_download(monkeypatch: pytest.MonkeyPatch) -> None:
    """No drawn case may reach tiktoken's download: every gpt2 case names its ranks file."""
    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def tree(root: Path) -> dict[str, str]:
    """Every entry below ``root``: a file's sha256, ``dir``, or a link's target (links are not followed)."""
    entries: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                entries[rel] = f"link -> {os.readlink(path)}"
            elif path.is_dir():
                entries[rel] = "dir"
            else:
                entries[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return entries


def call(main, argv: list[str]) -> tuple[int, str, str]:  # noqa: ANN001 - a main(argv)
    """``run_cli(main, argv)`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(main, argv)
    if currently_in_test_context():
        event(f"exit {code}")  # --hypothesis-show-statistics: how many drawn cases succeed
    return code, out.getvalue(), err.getvalue()


def assert_kept(before: dict[str, str], after: dict[str, str], code: int, may_replace: set[str] = frozenset(),
                may_add: tuple[str, ...] = ()) -> None:
    """A refusal changes nothing at all; a success keeps every entry but ``may_replace``, adding only below
    ``may_add``."""
    if code != 0:
        assert after == before, {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys()
                                 if before.get(k) != after.get(k)}
        return
    for path, value in before.items():
        if path not in may_replace:
            assert after.get(path) == value, (path, value, after.get(path))
    added = sorted(set(after) - set(before))
    assert all(any(p == a or p.startswith(a + os.sep) for a in may_add) for p in added), (added, may_add)


def int_text(low: int = -3, high: int = 40, huge: bool = True) -> st.SearchStrategy[str]:
    """An integer option's value as typed: small numbers, and the mistakes (words, floats, hex, huge)."""
    mistakes = ["", "two", "1.5", "1e3", "0x10", "nan", " 7"]
    mistakes += ["1000000000000", "99999999999999999999"] if huge else []
    return st.one_of(st.integers(low, high).map(str), st.sampled_from(mistakes))


FLOAT_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "1", "0.5", "1e-45", "5e-324", "1e308", "nan", "-inf", "two", ""]),
)


def varied(good: dict, pools: dict[str, st.SearchStrategy], max_changes: int = 3) -> st.SearchStrategy[dict]:
    """``good`` with up to ``max_changes`` of its entries drawn from ``pools``: single mistakes, pairs and triples,
    and (a pool holds good values too) enough successes for the promised result to be checked."""
    return st.dictionaries(st.sampled_from(sorted(pools)), st.just(None), max_size=max_changes).flatmap(
        lambda keys: st.fixed_dictionaries({k: pools[k] for k in keys})).map(lambda changes: {**good, **changes})



# ------------------------------------------------------------------ the model files of evaluate.py and generate.py

MC_ROWS = [{"ctx": "The cat", "endings": ["sat.", "flew to the moon.", "ran"], "label": 0},
           {"ctx_a": "One", "ctx_b": "two", "endings": ["three", "seven"], "label": "1"}]


@pytest.fixture(scope="module")
def model_files() -> Iterator[Path]:
    """A tiny byte-tokenizer checkpoint, its export, a data folder and multiple-choice files."""
    with scratch() as tmp:
        write_checkpoint(tmp / "ckpt", tiny_model("linear"))
        code, _, err = call(load_script("convert_checkpoint").main, [str(tmp / "ckpt"), str(tmp / "export")])
        assert code == 0, err
        write_byte_data(tmp / "data")
        (tmp / "empty_folder").mkdir()
        (tmp / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MC_ROWS))
        (tmp / "mc_empty.jsonl").write_text("\n\n")
        (tmp / "mc_bad.jsonl").write_text('{"ctx": "a", "endings": ["b", "c"], "label": 5}\n{oops\n')
        (tmp / "mc_binary.jsonl").write_bytes(b"\xff\xfe\x00\x80\n")
        yield tmp


SOURCES = st.sampled_from(["ckpt", "export", "data", "missing", "mc.jsonl"])
DEVICES = st.sampled_from(["cpu", "cpu", "auto", "cuda", "cuda:9", "meta", "tpu", ""])


def source_path(root: Path, name: str) -> str:
    """A drawn source among the model files ("missing": a path that does not exist)."""
    return str(root / ("nowhere" if name == "missing" else name))


# ------------------------------------------------------------------ SIGTERM in the middle of a tool

PAUSED_RUN = r"""
import importlib, os, runpy, sys, time
from pathlib import Path

module, qualname, when, nth = os.environ["TEST_PAUSE"].split(":")
owner = importlib.import_module(module)
*parents, name = qualname.split(".")
for part in parents:
    owner = getattr(owner, part)
real, calls = getattr(owner, name), []

def pause():
    Path(os.environ["TEST_PAUSE_MARKER"]).write_text(str(os.getpid()))
    time.sleep(120)  # the test sends SIGTERM here

def paused(*args, **kwargs):
    calls.append(1)
    held = len(calls) == int(nth)
    if held and when == "before":
        pause()
    result = real(*args, **kwargs)
    if held and when == "after":
        pause()
    return result

setattr(owner, name, paused)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def terminate_at(tmp: Path, moment: str, script: str, *args: str) -> tuple[int, str]:
    """Run scripts/<script> held at ``moment`` (module:qualname:before|after:nth), SIGTERM it there; (code, output)."""
    marker = tmp / "paused"
    env = {**script_env(tmp), "TEST_PAUSE": moment, "TEST_PAUSE_MARKER": str(marker), "PYTHONPATH": str(REPO_ROOT),
           "HF_HOME": str(tmp / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("TORCHNLQ_TIKTOKEN_FILE", None)
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_RUN, str(REPO_ROOT / "scripts" / script), *args], cwd=tmp,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not marker.exists():
            output = proc.communicate(timeout=60)[0] if proc.poll() is not None else ""
            pytest.fail(f"never reached {moment}: {output}")
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    marker.unlink()
    return proc.returncode, output


def assert_terminated(code: int, output: str) -> None:
    """What SIGTERM leaves: exit code 143 and a last line ``terminated: ...``, no traceback."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 143, output
    assert "Traceback" not in output and lines[-1].startswith("terminated: "), output

