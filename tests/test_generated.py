"""Generated mistakes (Hypothesis): configs and option pairs, run-folder states, corrupted files.

The catalogue (tests/catalogue/) lists the documented mistakes one by one; these tests draw
the rest and hold every entry point to the same invariant: exit 0 with the promised result, or exit 2
with exactly one ``error:`` line, no traceback, and no change to any file the user owns. A fixed
seed (``derandomize``) and small example counts keep them reproducible and within CI's budget.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.train.__main__ import main as train_main
from torchnlq.train.preflight import check_job_config, config_warnings
from torchnlq.models import build_model

from helpers.checkpoints import load_script, tiny_model, write_checkpoint
from helpers.train import tiny_args

SETTINGS = dict(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def scratch() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="generated-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root`` (read through links: their targets must not change)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_outcome(code: int, err: str) -> None:
    """The promised result, or one error line; never a traceback."""
    assert "Traceback" not in err, err
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)


# ------------------------------------------------------------------ configs and option pairs

NUMBERS = st.one_of(st.integers(-3, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    ["0", "-1", "1e999", "nan", "two", "", "0x10"]))
OPTIONS = {
    "training.steps": NUMBERS, "training.seq_len": NUMBERS, "training.micro_batch_size": NUMBERS,
    "training.grad_accum_steps": NUMBERS, "optimizer.lr": NUMBERS, "optimizer.beta1": NUMBERS,
    "optimizer.beta2": NUMBERS, "lr_schedule.warmup_steps": NUMBERS, "lr_schedule.decay_steps": NUMBERS,
    "lr_schedule.min_lr": NUMBERS, "model.n_layers": NUMBERS, "model.dim": NUMBERS, "model.n_heads": NUMBERS,
    "model.n_kv_heads": NUMBERS, "model.vocab_size": NUMBERS, "model.max_seq_len": NUMBERS,
    "model.query.bottleneck_ratio": NUMBERS, "validation.interval": NUMBERS, "checkpoint.load_step": NUMBERS,
    "model.query.type": st.sampled_from(["linear", "identity", "residual", "residual_mlp", "anchored", "mlp", ""]),
    "model.query.layers": st.sampled_from(["all", "0", "0-1", "5", "1-0", "x", ""]),
    "model.positions": st.sampled_from(["learned", "rope", "alibi"]),
    "checkpoint.resume": st.sampled_from(["true", "false", "maybe"]),
    "checkpoint.enabled": st.sampled_from(["true", "false"]),
    "checkpoint.export_at_end": st.sampled_from(["true", "false"]),
    "data.tokenizer": st.sampled_from(["byte", "gpt2", "hf", "sentencepiece"]),
    # A tokenizer.json that is missing, a folder, not a file, not JSON; an eot token no vocabulary here holds.
    "data.tokenizer_file": st.sampled_from(["~/nowhere.json", "", "/dev/null", "/", "pyproject.toml"]),
    "data.eot_token": st.sampled_from(["<|endoftext|>", "", "</s>"]),
    "data.synthetic": st.sampled_from(["true", "false"]),
    "validation.protocol": st.sampled_from(["fixed", "paper", "other"]),
    "job.plugins": st.sampled_from(["", "json", "no_such_module", "../x"]),
    "data.verify_content": st.sampled_from(["true", "false", "sometimes"]),
    "data.path": st.sampled_from(["~/nowhere", "", "/dev/null"]),
    "model.query.fuse_kv": st.sampled_from(["true", "false"]),
    # The block options, the optimizer and the schedule (issues 21, 22).
    "model.norm": st.sampled_from(["layer", "rms", "batch"]),
    "model.mlp_activation": st.sampled_from(["gelu", "gelu_tanh", "swiglu", "relu"]),
    "model.mlp_multiple_of": NUMBERS,
    "model.qk_norm": st.sampled_from(["true", "false", "maybe"]),
    "model.init": st.sampled_from(["torchnlq", "depth", "paper", "nanogpt"]),
    "model.rope_scaling_factor": NUMBERS,
    "model.rope_low_freq_factor": NUMBERS,
    "model.rope_high_freq_factor": NUMBERS,
    "model.rope_original_max_seq_len": NUMBERS,
    "optimizer.name": st.sampled_from(["adamw", "adamw8bit", "muon", "sgd"]),
    "optimizer.muon_momentum": NUMBERS,
    "optimizer.muon_ns_steps": NUMBERS,
    "optimizer.muon_adjust_lr": st.sampled_from(["match_rms_adamw", "original", "kimi"]),
    "optimizer.groups": st.sampled_from(["x", "", "[]"]),
    "lr_schedule.name": st.sampled_from(["cosine", "wsd", "linear"]),
    "profiling.enabled": st.sampled_from(["true", "false", "on"]),
    "profiling.wait": NUMBERS,
    "profiling.warmup": NUMBERS,
    "profiling.active": NUMBERS,
    "profiling.repeat": NUMBERS,
    "profiling.memory_snapshot": st.sampled_from(["true", "false"]),
    "debug.deterministic": st.sampled_from(["true", "false", "yes"]),
    "job.rerun": st.sampled_from(["true", "false", "always"]),
    "lr_schedule.decay_shape": st.sampled_from(["linear", "cosine", "1-sqrt", "sqrt"]),
    "lr_schedule.decay_length": NUMBERS,
    "lr_schedule.decay_fraction": NUMBERS,
}


@settings(max_examples=150, **SETTINGS)
@given(st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.just(None), min_size=1, max_size=3).flatmap(
    lambda keys: st.fixed_dictionaries({k: OPTIONS[k] for k in keys})))
def test_any_option_values_give_a_config_or_one_line(overrides: dict[str, object]) -> None:
    """Loading and checking any combination either works or raises one UserError line (nothing runs)."""
    with scratch() as tmp:
        argv = [*tiny_args(tmp), *(f"--{k}={v}" for k, v in overrides.items())]
        try:
            cfg = load_job_config(argv)
            check_job_config(cfg)
            config_warnings(cfg)
        except UserError as e:
            assert str(e) and "\n" not in str(e), str(e)


# ------------------------------------------------------------------ run-folder states

ENTRIES = ("config.toml", "train.log", "run_info.json", ".lock", "checkpoints", "tb")
STATES = ("absent", "file", "folder", "link_to_file", "link_to_folder")


def lay_out(run: Path, user: Path, states: dict[str, str]) -> None:
    run.mkdir(parents=True)
    (user / "folder").mkdir(parents=True)
    (user / "notes.txt").write_text("the user's\n")
    (user / "folder" / "kept.txt").write_text("also the user's\n")
    for name, state in states.items():
        entry = run / name
        if state == "file":
            entry.write_text("something\n")
        elif state == "folder":
            entry.mkdir()
        elif state == "link_to_file":
            entry.symlink_to(user / "notes.txt")
        elif state == "link_to_folder":
            entry.symlink_to(user / "folder")


@pytest.mark.integration
@settings(max_examples=20, **SETTINGS)
@given(st.fixed_dictionaries({name: st.sampled_from(STATES) for name in ENTRIES}))
@example(dict.fromkeys(ENTRIES, "absent"))  # a new run
@example({**dict.fromkeys(ENTRIES[:4], "file"), "checkpoints": "folder", "tb": "link_to_folder"})  # an old run's
def test_any_run_folder_state_trains_or_is_one_line_and_user_files_stay(states: dict[str, str]) -> None:
    with scratch() as tmp:
        user = tmp / "user"
        lay_out(tmp / "outputs" / "run", user, states)
        before = snapshot(user)
        with _captured_stderr() as err:
            code = run_cli(train_main, tiny_args(tmp, steps=2, checkpoint__interval=2, validation__interval=2))
        assert_outcome(code, err.getvalue())
        if code == 0:  # the promised result: a finished run
            assert json.loads((tmp / "outputs" / "run" / "run_info.json").read_text())["finished"] is True
        assert snapshot(user) == before


@contextmanager
def _captured_stderr() -> Iterator[object]:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer), contextlib.redirect_stdout(io.StringIO()):
        yield buffer


# ------------------------------------------------------------------ corrupted files a stranger hands over

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
META_KEYS = ("model_args", "tokenizer", "step", "seq_len", "fingerprint", "validation", "world_size")


@pytest.fixture(scope="module")
def checkpoint() -> Iterator[Path]:
    with scratch() as tmp:
        yield write_checkpoint(tmp / "ckpt", tiny_model("residual_mlp"))


@settings(max_examples=40, **SETTINGS)
@given(st.sampled_from(META_KEYS), JSON)
def test_a_corrupted_checkpoint_record_is_read_or_one_line(checkpoint: Path, key: str, value: object) -> None:
    """generate.py on a checkpoint whose torchnlq.json has one entry replaced by arbitrary JSON."""
    script = load_script("generate")
    with scratch() as tmp:
        ckpt = tmp / "ckpt"
        shutil.copytree(checkpoint, ckpt)
        meta = json.loads((ckpt / "torchnlq.json").read_text())
        meta[key] = value
        (ckpt / "torchnlq.json").write_text(json.dumps(meta, allow_nan=True))
        before = snapshot(tmp)
        with _captured_stderr() as err:
            code = run_cli(script.main, [str(ckpt), "--max-new-tokens", "2", "--prompt", "a"])
        assert_outcome(code, err.getvalue())
        assert snapshot(tmp) == before


# ------------------------------------------------------------------ [[optimizer.groups]] entries in a TOML file

GROUP_VALUES = {
    "name": st.sampled_from(["g", "decay", "muon", "", 3]),
    "params": st.lists(st.sampled_from(["layers.*.attn.kv.weight", "tok_emb.*", "nope", "*", ""]), max_size=2),
    "kind": st.sampled_from(["hidden", "embedding", "head", "gain_bias", "query_mlp", "weights"]),
    "optimizer": st.sampled_from(["adamw", "muon", "sgd"]),
    "lr_multiplier": st.sampled_from([1.0, 2.0, 0.0, -1.0, "2"]),
    "weight_decay": st.sampled_from([0.0, 0.1, -0.5]),
    "lr": st.just(1.0),  # not a key of an entry
}


def _toml(value: object) -> str:
    return json.dumps(value)  # JSON scalars and lists of strings are TOML values too


@settings(max_examples=60, **SETTINGS)
@given(st.lists(st.dictionaries(st.sampled_from(sorted(GROUP_VALUES)), st.just(None), max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({k: GROUP_VALUES[k] for k in keys})), min_size=1, max_size=3),
    st.sampled_from(["adamw", "muon"]))
def test_any_optimizer_groups_give_a_config_or_one_line(entries: list[dict[str, object]], name: str) -> None:
    """Any [[optimizer.groups]] tables either build and check (every trainable parameter in exactly one group)
    or are one UserError line, before anything is written."""
    from torchnlq.train.optim import plan_groups

    with scratch() as tmp:
        tables = "".join("\n[[optimizer.groups]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in entry.items())
                         for entry in entries)
        (tmp / "g.toml").write_text(f'[optimizer]\nname = "{name}"\n{tables}')
        try:
            cfg = load_job_config([str(tmp / "g.toml"), *tiny_args(tmp)])
            args = check_job_config(cfg)
        except UserError as e:
            assert str(e) and "\n" not in str(e), str(e)
            assert sorted(p.name for p in tmp.iterdir()) == ["g.toml"]  # nothing written
            return
        model = build_model(args)
        claimed = [id(p) for plan in plan_groups(cfg.optimizer, model) for p in plan.params]
        assert sorted(claimed) == sorted(id(p) for p in model.parameters())
