"""Suites: grid expansion, run names, override order, validation errors, dry run, skip/resume, end to end."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchnlq.errors import UserError
from torchnlq.experiments.suite import grid_name, load_suite
from torchnlq.experiments.suite_run import main, print_commands, run_stage

from helpers import REPO_ROOT
from helpers.train import script_env, tiny_args

BASE = """
[model]
flavor = "debug"
n_layers = 1
dim = 32
n_heads = 2

[training]
steps = 10
seq_len = 32
"""


def write_suite(tmp: Path, body: str, config: str = BASE) -> Path:
    """A suite in tmp/suites/ whose config lives in tmp/configs/ (paths relative to the suite file)."""
    (tmp / "configs").mkdir(exist_ok=True)
    (tmp / "configs" / "base.toml").write_text(config)
    (tmp / "suites").mkdir(exist_ok=True)
    path = tmp / "suites" / "s.toml"
    path.write_text(body)
    return path


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_grid_expands_in_order_with_readable_distinct_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_suite(tmp_path, """
config = "../configs/base.toml"
dump_folder = "out"
overrides = ["--training.steps=7"]
baseline = "q-linear_lr1e-3_seed1"
[grid]
"model.query.type" = ["linear", "residual_mlp"]
"optimizer.lr" = [1e-3, 3e-3]
"training.seed" = [1, 2]
""")
    suite = load_suite(path)
    assert [r.name for r in suite.runs] == [
        f"q-{q}_lr{lr}_seed{s}" for q in ("linear", "residual_mlp") for lr in ("1e-3", "3e-3") for s in (1, 2)
    ]
    assert suite.baseline == "q-linear_lr1e-3_seed1" and suite.dump_folder == Path("out")
    run = suite.runs[-1]
    assert run.config == tmp_path / "configs" / "base.toml"
    assert run.steps == 7
    assert run.overrides == ("--training.steps=7", "--model.query.type=residual_mlp", "--optimizer.lr=0.003",
                             "--training.seed=2", f"--job.name={run.name}", "--job.dump_folder=out")


def test_runs_cross_grid_and_override_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_suite(tmp_path, """
config = "../configs/base.toml"
overrides = ["--training.steps", "5"]
baseline = "base"
[[runs]]
name = "base"
[[runs]]
name = "res"
overrides = ["--model.query.type=residual_mlp", "--optimizer.lr=3e-3"]
[grid]
"training.seed" = [1337, 1338]
""")
    suite = load_suite(path, ["--validation.interval=2"])
    assert [r.name for r in suite.runs] == ["base_seed1337", "base_seed1338", "res_seed1337", "res_seed1338"]
    assert suite.baseline == "base_seed1337" and suite.dump_folder == Path("outputs/s")
    # shared, then the command line's, then the run's own, then the grid, then the suite's job keys
    assert suite.runs[3].overrides == (
        "--training.steps", "5", "--validation.interval=2", "--model.query.type=residual_mlp", "--optimizer.lr=3e-3",
        "--training.seed=1338", "--job.name=res_seed1338", "--job.dump_folder=./outputs/s")
    assert [r.arm for r in suite.runs] == ["base", "base", "res", "res"]


def test_name_helpers() -> None:
    labels = {"optimizer.lr": "lr", "optimizer.weight_decay": "wd", "model.query.half_scale": "half_scale"}
    assert grid_name({"optimizer.lr": 2.6e-3, "optimizer.weight_decay": 0.03125}, labels) == "lr2.6e-3_wd0.03125"
    assert grid_name({"optimizer.lr": 5.66e-5}, labels) == "lr5.66e-5"
    assert grid_name({"model.query.half_scale": False}, labels) == "half_scale-false"


def test_values_that_print_alike_and_clashing_labels_stay_distinct(tmp_path: Path) -> None:
    path = write_suite(tmp_path, """
config = "../configs/base.toml"
[grid]
"optimizer.lr" = [0.001, 0.0010000001]
"training.micro_batch_size" = [4]
"validation.micro_batch_size" = [4]
""")
    names = [r.name for r in load_suite(path).runs]
    assert names == ["lr1e-3_training-micro_batch_size4_validation-micro_batch_size4",
                     "lr1e-3_training-micro_batch_size4_validation-micro_batch_size4-2"]


@pytest.mark.parametrize("body, expected", [
    ('[[runs]]\nname = "a"\nconfig = "../configs/missing.toml"', "config '../configs/missing.toml' not found"),
    ('config = "../configs/base.toml"\n[grid]\n"model.query.typ" = ["linear"]', "did you mean 'type'"),
    ('config = "../configs/base.toml"\n[grid]\n"training.steps" = ["many"]', "grid key 'training.steps'"),
    ('config = "../configs/base.toml"\n[grid]\n"training.seed" = []', "non-empty list"),
    ('config = "../configs/base.toml"\nbasline = "a"', "did you mean 'baseline'"),
    ('config = "../configs/base.toml"\nbaseline = "nope"', "baseline 'nope' is not a run name"),
    ('config = "../configs/base.toml"\n[[runs]]\nname = "a"\n[[runs]]\nname = "a"', "appears twice"),
    ('config = "../configs/base.toml"\n[[runs]]\nname = "a"\noverrides = ["--job.name=x"]', "job.name"),
    ('config = "../configs/base.toml"\n[[runs]]\nname = "a"\noverrides = "--training.steps=3"', "runs[0].overrides expects a list of str"),
    ('config = "../configs/base.toml"\n[[runs]]\nname = "a"\noverrides = ["--model.n_heads=3"]', "run 'a'"),
    ('dump_folder = "x"', "give a top-level config"),
])
def test_suite_errors_are_one_line(tmp_path: Path, body: str, expected: str) -> None:
    with pytest.raises(UserError) as excinfo:
        load_suite(write_suite(tmp_path, body))
    assert expected in one_line_error(excinfo)


def test_command_line_may_not_flatten_varied_keys(tmp_path: Path) -> None:
    path = write_suite(tmp_path, """
config = "../configs/base.toml"
[[runs]]
name = "a"
[[runs]]
name = "b"
overrides = ["--optimizer.lr=3e-3"]
""")
    with pytest.raises(UserError, match="optimizer.lr"):
        load_suite(path, ["--optimizer.lr=1e-3"])
    with pytest.raises(UserError, match="job.name"):
        load_suite(path, ["--job.name=x"])
    moved = load_suite(path, ["--job.dump_folder", "elsewhere", "--training.steps=3"])
    assert moved.dump_folder == Path("elsewhere") and moved.runs[0].steps == 3
    assert moved.runs[0].overrides[-1] == "--job.dump_folder=elsewhere"


def fake_launcher(tmp: Path, exit_code: int = 0) -> Path:
    """A stand-in for run_train.sh that records its arguments."""
    script = tmp / "fake_train.sh"
    script.write_text(f'#!/usr/bin/env bash\necho "$@" >> "{tmp}/launches.txt"\nexit {exit_code}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def write_info(run_dir: Path, step: int, steps: int, finished: bool) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run_info.json").write_text(json.dumps({"step": step, "steps": steps, "finished": finished}))


@pytest.mark.parametrize("logged, saved, expected", [
    (None, [], "interrupted at step 4/10; no checkpoint: the same command starts it again"),
    (7, [], "interrupted at step 7/10; no checkpoint: the same command starts it again"),
    (9, [4, 8], "interrupted at step 9/10; the same command resumes it from step-8"),
    (9, [4, "8.partial"], "interrupted at step 9/10; the same command resumes it from step-4"),
])
def test_an_unfinished_run_is_described_from_its_folder_not_its_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: int | None, saved: list, expected: str) -> None:
    """A run killed (SIGKILL: no last record) after its record said step 4: the dry run and --status report the
    step its log reached and the last complete checkpoint, which is where the same command resumes."""
    from torchnlq.experiments.suite_status import run_state

    monkeypatch.chdir(tmp_path)
    suite = load_suite(write_suite(tmp_path, 'config = "../configs/base.toml"\ndump_folder = "out"\n'
                                              '[grid]\n"training.seed" = [1]\n'))
    run_dir = tmp_path / "out" / "seed1"
    write_info(run_dir, 4, 10, False)
    if logged is not None:
        (run_dir / "train.log").write_text("".join(f"12:00:00 step {s:>6}/10  loss 3.0\n" for s in range(1, logged + 1)))
    for step in saved:
        folder = run_dir / "checkpoints" / f"step-{step}"
        folder.mkdir(parents=True)
        for name in ("torchnlq.json", ".metadata"):
            (folder / name).write_text("{}")
    buf = io.StringIO()
    print_commands(suite, fake_launcher(tmp_path), out=buf)
    assert buf.getvalue().splitlines()[1].startswith(f"# 1/1 seed1: {expected}")
    assert run_state(suite.runs[0], run_dir, [], None, tmp_path / "out").startswith(expected)


def test_dry_run_and_skip_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_suite(tmp_path, """
config = "../configs/base.toml"
dump_folder = "out"
[grid]
"training.seed" = [1, 2, 3, 4]
""")
    suite = load_suite(path)
    write_info(tmp_path / "out" / "seed1", 10, 10, True)  # done: skipped
    write_info(tmp_path / "out" / "seed2", 4, 10, False)  # interrupted: resumed by the same command
    write_info(tmp_path / "out" / "seed3", 5, 5, True)  # finished at fewer steps: trains on
    launcher = fake_launcher(tmp_path)

    buf = io.StringIO()
    print_commands(suite, launcher, out=buf)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 + 2 * 4
    assert lines[1] == "# 1/4 seed1: finished (skipped)"
    assert lines[3].startswith("# 2/4 seed2: interrupted at step 4/10")
    assert lines[5].startswith("# 3/4 seed3: finished at 5 steps")
    assert lines[7] == "# 4/4 seed4: new"
    assert lines[8] == "./fake_train.sh configs/base.toml --training.seed=4 --job.name=seed4 --job.dump_folder=out --job.rerun=true"
    assert not (tmp_path / "launches.txt").exists()  # a dry run launches nothing

    assert run_stage(suite, launcher=launcher, compare=False, out=io.StringIO()) == 0
    launched = (tmp_path / "launches.txt").read_text().splitlines()
    assert [line.split("--job.name=")[1].split()[0] for line in launched] == ["seed2", "seed3", "seed4"]
    assert "seed4 exit=0" in (tmp_path / "out" / "suite.log").read_text()


def test_failed_run_does_not_stop_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_suite(tmp_path, 'config = "../configs/base.toml"\n[grid]\n"training.seed" = [1, 2]')
    out = io.StringIO()
    assert run_stage(load_suite(path), launcher=fake_launcher(tmp_path, exit_code=3), out=out) == 1
    assert len((tmp_path / "launches.txt").read_text().splitlines()) == 2
    assert "failed: seed1, seed2" in out.getvalue() and "no comparison" in out.getvalue()


@pytest.mark.integration  # a Python subprocess running the suite
def test_signal_reaches_the_run_once_and_stops_the_suite(tmp_path: Path) -> None:
    path = write_suite(tmp_path, 'config = "../configs/base.toml"\ndump_folder = "out"\n[grid]\n"training.seed" = [1, 2]')
    script = tmp_path / "slow_train.sh"  # stands in for a trainer that saves and exits on SIGINT
    script.write_text(
        f'#!/usr/bin/env bash\ntrap \'echo INT >> "{tmp_path}/signals.txt"; kill $!; exit 0\' INT\n'
        f'echo "$@" >> "{tmp_path}/launches.txt"\nsleep 60 & wait\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    code = ("import sys; from pathlib import Path; from torchnlq.experiments.suite import load_suite; "
            "from torchnlq.experiments.suite_run import run_stage; "
            f"sys.exit(run_stage(load_suite({str(path)!r}), launcher=Path({str(script)!r}), compare=False))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "launches.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert (tmp_path / "signals.txt").read_text() == "INT\n"  # forwarded exactly once
    assert len((tmp_path / "launches.txt").read_text().splitlines()) == 1  # the second run never started
    assert "stopped_by=SIGINT" in (tmp_path / "out" / "suite.log").read_text()


def test_signal_while_the_run_starts_is_forwarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGINT between the suite's decision to launch and the child existing reaches the child."""
    import torchnlq.experiments.executors as executors

    class SignalTooEarly(Exception):
        pass

    def too_early(signum: int, frame: object) -> None:
        raise SignalTooEarly  # the suite had no handler yet: a real suite would have died here

    real_popen = subprocess.Popen

    def popen_after_a_signal(*args: object, **kwargs: object) -> subprocess.Popen:
        os.kill(os.getpid(), signal.SIGINT)  # delivered before the child exists
        return real_popen(*args, **kwargs)

    previous = signal.signal(signal.SIGINT, too_early)
    try:
        monkeypatch.setattr(executors.subprocess, "Popen", popen_after_a_signal)
        start = time.monotonic()
        with executors.Children() as children:
            code = children.start(["sleep", "30"]).wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert children.received == ["SIGINT"] and code == -signal.SIGINT  # the child got it and stopped
    assert time.monotonic() - start < 20


def test_cli_dry_run_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from torchnlq.cli import run_cli

    monkeypatch.chdir(tmp_path)
    path = write_suite(tmp_path, 'config = "../configs/base.toml"\n[grid]\n"training.seed" = [1, 2]')
    assert run_cli(main, [str(path), "--dry-run", "--training.steps", "3"]) == 0
    assert "--training.steps 3 --training.seed=2 --job.name=seed2" in capsys.readouterr().out
    assert run_cli(main, [str(tmp_path / "none.toml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("suite", sorted((REPO_ROOT / "suites").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_suites_load(suite: Path) -> None:
    loaded = load_suite(suite)
    assert loaded.baseline in {r.name for r in loaded.runs}
    assert len({r.name for r in loaded.runs}) == len(loaded.runs) >= 2
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.preflight import check_job_config

    for run in loaded.runs:  # every run's command line is a config that can run
        check_job_config(load_job_config(list(run.argv())))


def test_shakespeare_suite_keeps_the_data_order_and_matches_parameters() -> None:
    from torchnlq.config.manager import load_job_config
    from torchnlq.data.tokenizer import padded_vocab_size
    from torchnlq.models import build_model_args, num_params

    suite = load_suite(REPO_ROOT / "suites" / "shakespeare_tiny.toml")
    assert len(suite.runs) == 15
    params = {}
    for run in suite.runs:
        cfg = load_job_config(run.argv())
        assert cfg.data.seed == 42 and cfg.validation.seed == 2357
        params[run.arm] = num_params(build_model_args(cfg.model, padded_vocab_size("byte", cfg.model.vocab_multiple)),
                                     non_embedding=True)
    assert params["mlp_matched"] == params["res_gelu_lr3e-3"] > params["baseline"]


@pytest.mark.integration  # scripts/run_suite.py launching two real training runs
def test_end_to_end_two_tiny_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = [a for a in tiny_args(tmp_path, steps=8, checkpoint__enabled=False)
              if not a.startswith(("--job.name", "--job.dump_folder"))]
    suite = tmp_path / "two.toml"
    suite.write_text(
        f'config = "{REPO_ROOT / "train_configs" / "debug_model.toml"}"\ndump_folder = "runs"\nbaseline = "linear"\n'
        f"overrides = {json.dumps(shared)}\n"
        '[[runs]]\nname = "linear"\noverrides = ["--model.query.type=linear"]\n'
        '[[runs]]\nname = "res"\noverrides = ["--model.query.type=residual_mlp"]\n'
    )
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "run_suite.py"), str(suite)]
    env = script_env(tmp_path)
    env["OMP_NUM_THREADS"] = "1"  # tiny matmuls: one thread is fastest, and the machine is shared
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in ("linear", "res"):
        info = json.loads((tmp_path / "runs" / name / "run_info.json").read_text())
        assert info["finished"] and info["step"] == 8
    table = (tmp_path / "runs" / "comparison.md").read_text()
    assert "| linear | 1 | linear |" in table and "| res | 1 | residual_mlp |" in table and "@ 8 |" in table

    # Everything is finished: a second pass launches nothing (a launcher that fails would show).
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert run_stage(load_suite(suite), launcher=fake_launcher(tmp_path, exit_code=3), compare=False, out=out) == 0
    assert out.getvalue().count("finished (skipped)") == 2 and not (tmp_path / "launches.txt").exists()
    assert os.path.getsize(tmp_path / "runs" / "comparison.csv") > 0
    # The suite edited after its runs finished: a changed run is refused before anything launches, rather
    # than reported as the new configuration's result.
    suite.write_text(suite.read_text().replace("--model.query.type=residual_mlp", "--model.query.type=identity"))
    with pytest.raises(UserError, match=r"run 'res' finished with another configuration than the suite now gives it "
                                        r"\(model.query.type: 'residual_mlp' -> 'identity'\)"):
        run_stage(load_suite(suite), launcher=fake_launcher(tmp_path, exit_code=3), compare=False, out=io.StringIO())
    assert not (tmp_path / "launches.txt").exists()


def test_the_docs_list_every_key_of_a_suite_file_as_declared() -> None:
    """docs/experiments.md's reference of the suite's keys and tables is the declarations' (gen_config_docs.py)."""
    from torchnlq.experiments.suite_command import suite_reference

    reference = suite_reference()
    assert "| `partition` | unset |" in reference and "| `trials` | unset | ≥ 1 |" in reference
    assert reference in (REPO_ROOT / "docs" / "experiments.md").read_text(), \
        "docs/experiments.md is stale: regenerate it with python scripts/gen_config_docs.py"
