"""Generated recorded configs (Hypothesis) at every door that loads a model: checkpoint.initial_load_path,
convert_checkpoint.py, generate.py, evaluate.py and upcycle.py.

Each case edits up to three entries of a real record (a checkpoint's torchnlq.json, an export's or a Hugging
Face folder's config.json, a data folder's meta.json): a value of another type or size, a key removed, a key
added, a size that no longer matches the weights; sometimes the weights of another model. The invariant is the
project's: the promised result (a sample, an export that loads, a report, a finished run), or exit 2 with one
``error:`` line and no traceback; and in both cases the source folders unchanged, and after a refusal nothing
written at all. The unit tests and catalogue rows of the same checks are tests/test_recorded_configs.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from torchnlq.cli import run_cli
from torchnlq.interop.export import export_safetensors
from torchnlq.interop.export import export_hf_standard
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.train.__main__ import main as train_main

from helpers.checkpoints import BYTE_TOKENIZER, load_script, tiny_model, write_byte_data, write_checkpoint
from test_generated import scratch
from test_recorded_configs import snapshot

SETTINGS = dict(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DELETE = "<delete>"
#: What an entry is replaced by: plausible sizes, sizes of terabytes, the wrong JSON types, and deletion.
VALUES = st.one_of(
    st.integers(-2, 70),
    st.sampled_from([320, 4096, 10**9, 10**12, 2**32, 2**63, 2**64, 32.0, 0.5, -0.5, 1e-5, 1e308, float("nan"),
                     float("inf"), "32", "x", "", "linear", "rope", "rms", "swiglu", "llama3", "paper", True, False,
                     None, [], [32], {}, {"type": "linear"}, DELETE]),
)
#: Keys a record of another torchnlq (or a stranger) might add.
EXTRA_KEYS = ("surprise", "model_args.moe_experts", "model_args.query.anchor", "validation.every", "rope_scaling.x")
#: A tiny model of each architecture: the source of every door (initial_load_path trains one like it).
GPT2_MODEL = dict(bias=True)
LLAMA_MODEL = dict(positions="rope", norm="rms", mlp_activation="swiglu", n_kv_heads=2)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def sources() -> Iterator[Path]:
    """ckpt (with its model fingerprint, as the trainer writes it), export, gpt2 (a bias model's Hugging Face
    folder), gpt2_ckpt (a torchnlq checkpoint of that bias model), llama, data, other (another model's export)."""
    with scratch() as root:
        model = tiny_model()
        write_checkpoint(root / "ckpt", model, fingerprint={"model": model.args.to_dict()})
        export_safetensors(load_model(root / "ckpt"), root / "export")
        biased = tiny_model(**GPT2_MODEL)
        export_hf_standard(LoadedModel(biased, biased.args, BYTE_TOKENIZER, {}, root, "test"), root / "gpt2", "hf-gpt2")
        llama = tiny_model(**LLAMA_MODEL)
        export_hf_standard(LoadedModel(llama, llama.args, BYTE_TOKENIZER, {}, root, "test"), root / "llama", "hf-llama")
        other = tiny_model(dim=16, n_heads=2, mlp_hidden=48)
        export_safetensors(LoadedModel(other, other.args, BYTE_TOKENIZER, {}, root, "test"), root / "other")
        write_byte_data(root / "data")
        yield root


def paths(d: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted path of every entry of a JSON object, nested ones included."""
    found = []
    for key, value in d.items():
        found.append(prefix + key)
        if isinstance(value, dict):
            found += paths(value, f"{prefix}{key}.")
    return found


def apply(d: dict[str, Any], path: str, value: Any) -> None:
    """Set (or with DELETE remove) the dotted ``path``; a parent that is not an object is replaced by one."""
    *parents, last = path.split(".")
    for part in parents:
        if not isinstance(d.get(part), dict):
            d[part] = {}
        d = d[part]
    if isinstance(value, str) and value == DELETE:
        d.pop(last, None)
    else:
        d[last] = value


def edited_copy(sources: Path, name: str, file: str, data: st.DataObject, tmp: Path, weights: bool = True) -> Path:
    """A copy of source ``name`` in ``tmp`` with up to three drawn edits of its JSON ``file`` (and, drawn, the
    safetensors weights of another model)."""
    folder = tmp / name
    shutil.copytree(sources / name, folder)
    record = json.loads((folder / file).read_text())
    changes = data.draw(st.lists(st.tuples(st.sampled_from(sorted(paths(record)) + list(EXTRA_KEYS)), VALUES),
                                 max_size=3), label="changes")
    for path, value in changes:
        apply(record, path, value)
    (folder / file).write_text(json.dumps(record, allow_nan=True))
    if weights and (folder / "model.safetensors").is_file() and data.draw(st.booleans(), label="other weights"):
        shutil.copy(sources / "other" / "model.safetensors", folder / "model.safetensors")
    return folder


def call(main, argv: list[str]) -> tuple[int, str, str]:  # noqa: ANN001 - a main(argv)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(main, argv)
    event(f"exit {code}")  # --hypothesis-show-statistics: how many drawn cases load
    return code, out.getvalue(), err.getvalue()


def assert_outcome(code: int, out: str, err: str, before: dict[str, str], tmp: Path) -> None:
    """The promised result (checked by the caller), or exit 2, one error line, nothing written."""
    assert "Traceback" not in out + err, err
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
        assert snapshot(tmp) == before


def before_of(before: dict[str, str], name: str) -> dict[str, str]:
    """The entries of folder ``name`` in a snapshot of its parent, relative to the folder."""
    return {k[len(name) + 1:]: v for k, v in before.items() if k.startswith(name + "/")}


@settings(max_examples=60, **SETTINGS)
@given(st.sampled_from([("ckpt", "torchnlq.json"), ("export", "config.json")]), st.data())
def test_generate_samples_or_is_one_line(sources: Path, source: tuple[str, str], data: st.DataObject) -> None:
    shared = snapshot(sources)
    with scratch() as tmp:
        folder = edited_copy(sources, *source, data, tmp)
        before = snapshot(tmp)
        code, out, err = call(load_script("generate").main, [str(folder), "--prompt=ab", "--max-new-tokens=3"])
        assert_outcome(code, out, err, before, tmp)
        if code == 0:
            assert out.startswith("ab")
        assert snapshot(folder) == before_of(before, folder.name)
    assert snapshot(sources) == shared


@settings(max_examples=60, **SETTINGS)
@given(st.sampled_from([("ckpt", "torchnlq.json"), ("export", "config.json")]), st.sampled_from(["safetensors", "hf"]),
       st.data())
def test_convert_checkpoint_exports_or_is_one_line(sources: Path, source: tuple[str, str], form: str,
                                                   data: st.DataObject) -> None:
    with scratch() as tmp:
        folder = edited_copy(sources, *source, data, tmp)
        before = snapshot(tmp)
        argv = [str(folder), str(tmp / "out"), f"--format={form}"]
        code, out, err = call(load_script("convert_checkpoint").main, argv)
        assert_outcome(code, out, err, before, tmp)
        assert snapshot(folder) == before_of(before, folder.name)
        if code == 0 and form == "safetensors":  # the promised result: an export that loads, of the same size
            assert load_model(tmp / "out").model.num_params() == load_model(folder).model.num_params()
        elif code == 0:
            assert (tmp / "out" / "config.json").is_file() and (tmp / "out" / "model.safetensors").is_file()


@settings(max_examples=60, **SETTINGS)
@given(st.sampled_from([("ckpt", "torchnlq.json"), ("export", "config.json"), ("data", "meta.json")]), st.data())
def test_evaluate_reports_or_is_one_line(sources: Path, source: tuple[str, str], data: st.DataObject) -> None:
    with scratch() as tmp:
        folder = edited_copy(sources, *source, data, tmp)
        model, data_folder = (sources / "ckpt", folder) if source[0] == "data" else (folder, sources / "data")
        extra = ["--sequences=4"] if source[0] == "export" else []  # an export records no validation settings
        before = snapshot(tmp)
        code, out, err = call(load_script("evaluate").main, [str(model), f"--data={data_folder}", *extra])
        assert_outcome(code, out, err, before, tmp)
        assert snapshot(tmp) == before  # evaluate writes nothing, ever
        if code == 0:
            assert math.isfinite(float(dict(line.split(": ", 1) for line in out.splitlines())["val_loss"]))


@settings(max_examples=60, **SETTINGS)
@given(st.sampled_from([("gpt2", "config.json"), ("llama", "config.json"), ("ckpt", "torchnlq.json")]),
       st.sampled_from(["linear", "anchored"]), st.data())
def test_upcycle_exports_or_is_one_line(sources: Path, source: tuple[str, str], query: str,
                                        data: st.DataObject) -> None:
    with scratch() as tmp:
        folder = edited_copy(sources, *source, data, tmp)
        before = snapshot(tmp)
        code, out, err = call(load_script("upcycle").main, [str(folder), str(tmp / "out"), f"--query={query}"])
        assert_outcome(code, out, err, before, tmp)
        assert snapshot(folder) == before_of(before, folder.name)
        if code == 0:  # an export that loads, with the query asked for
            assert load_model(tmp / "out").args.query.type == query


def train_argv(tmp: Path, source: Path, model: dict[str, Any], data: Path, model_only: bool) -> list[str]:
    """Two steps of the tiny model ``source`` holds, starting from its weights (with ``model_only`` false, from its
    optimizer state and step too: the checkpointer's own load)."""
    args = tiny_model(**model).args
    options = {
        "job.dump_folder": tmp / "outputs", "job.name": "run", "model.flavor": "debug", "model.n_layers": args.n_layers,
        "model.dim": args.dim, "model.n_heads": args.n_heads, "model.n_kv_heads": args.n_kv_heads,
        "model.vocab_size": args.vocab_size, "model.max_seq_len": args.max_seq_len, "model.init_std": args.init_std,
        "model.mlp_hidden": args.mlp_hidden, "model.bias": args.bias, "model.positions": args.positions,
        "model.norm": args.norm, "model.mlp_activation": args.mlp_activation, "model.query.type": "linear",
        "training.steps": 2, "training.seq_len": 16, "training.micro_batch_size": 2, "training.device": "cpu",
        "lr_schedule.warmup_steps": 1, "data.path": data, "data.tokenizer": "byte", "validation.enabled": False,
        "checkpoint.enabled": False, "checkpoint.initial_load_path": source,
        "checkpoint.initial_load_model_only": model_only, "metrics.tensorboard": False,
    }
    return [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()]


@pytest.mark.integration  # trains, once per example
@settings(max_examples=30, **SETTINGS)
@given(st.sampled_from([("ckpt", "torchnlq.json", {}), ("export", "config.json", {}),
                        ("gpt2", "config.json", GPT2_MODEL), ("llama", "config.json", LLAMA_MODEL)]),
       st.sampled_from([True, True, True, False]), st.data())
def test_initial_load_path_trains_or_is_one_line(sources: Path, source: tuple[str, str, dict], model_only: bool,
                                                 data: st.DataObject) -> None:
    name, file, model = source
    with scratch() as tmp:
        folder = edited_copy(sources, name, file, data, tmp, weights=name != "ckpt")
        before = snapshot(tmp)
        code, out, err = call(train_main, train_argv(tmp, folder, model, sources / "data", model_only))
        assert_outcome(code, out, err, before, tmp)
        assert snapshot(folder) == before_of(before, folder.name)
        if code == 0:  # the promised result: a finished run that records where its weights came from
            info = json.loads((tmp / "outputs" / "run" / "run_info.json").read_text())
            assert info["finished"] is True and info["initialized_from"] == str(folder)
