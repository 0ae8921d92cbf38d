"""The commands README.md and docs/ show work as written (the first hour of a new user).

Two levels:

* every command line in the docs (README.md and docs/*.md, indented code) is checked statically:
  the script (or the module of ``python -m benchmarks.NAME``) exists, every ``--option`` it passes
  is one its ``--help`` lists (or, for ``./run_train.sh`` and the config-driven tools, a config key
  that exists), and the config and suite files it names exist;
* the README's own commands are run as written, in order, in a copy of the checkout, as a
  newcomer would type them after ``./run_train.sh``: activating ``.venv``, the model summary,
  the checkpointed debug run, export, sampling, evaluation and TensorBoard's server. Commands
  that need a GPU, the network or a 29 B-token run are listed with the reason they are not run,
  so a new README command fails this test until it is either run here or given a reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from functools import cache
from pathlib import Path

import pytest
import torch
from helpers import REPO_ROOT

from torchnlq.config.job_config import JobConfig
from torchnlq.config.render import iter_options
from torchnlq.errors import script_command

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
COMMAND_START = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:python |\./run_train\.sh|\./run_tests\.sh|tensorboard |source )")
CONFIG_KEYS = {name for name, _, _ in iter_options(JobConfig())} | {"job.config_file"}


def documented_commands(path: Path) -> list[str]:
    """The shell commands shown in a Markdown file's indented code, continuation lines joined, comments cut."""
    return commands_in(path.read_text(encoding="utf-8"))


def commands_in(markdown: str) -> list[str]:
    """The shell commands of :func:`documented_commands`, in Markdown text."""
    commands: list[str] = []
    pending = ""
    for line in markdown.splitlines():
        if not line.startswith("    ") and not pending:
            continue
        text = line.strip()
        if pending:
            pending += " " + text.rstrip("\\").strip()
            if not text.endswith("\\"):
                commands.append(pending)
                pending = ""
            continue
        if not COMMAND_START.match(text):
            continue
        text = re.sub(r"\s+#.*$", "", text)  # a trailing comment
        if text.endswith("\\"):
            pending = text.rstrip("\\").strip()
        else:
            commands.append(text)
    return commands


ALL_COMMANDS = sorted({(path.relative_to(REPO_ROOT).as_posix(), c) for path in DOCS for c in documented_commands(path)})


#: The commands whose other arguments are a config and its --section.key overrides.
CONFIG_DRIVEN = ("scripts/run_suite.py", "scripts/model_summary.py", "benchmarks.train_step", "benchmarks.coord_check",
                 "benchmarks.cpu_allocator", "benchmarks.gpu_check", "benchmarks.versus_nanogpt")


@cache
def program_help(program: str) -> str:
    """The --help text of a script (``scripts/x.py``) or a module (``benchmarks.x``), run as a user would: with
    this interpreter, from the repository root."""
    argv = [str(REPO_ROOT / program)] if program.endswith(".py") else ["-m", program]
    done = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def module_file(module: str) -> Path | None:
    """The file ``python -m module`` runs from the repository root: the benchmarks (not installed) and torchnlq."""
    if module.split(".")[0] not in ("benchmarks", "torchnlq"):
        return None
    path = REPO_ROOT / module.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def options_of(words: list[str]) -> list[str]:
    """The ``--option`` names a command passes (``--a.b=1`` gives ``--a.b``), usage brackets dropped."""
    return [w.strip("[]").split("=", 1)[0] for w in words if w.strip("[").startswith("--")]


def test_the_docs_show_commands() -> None:
    assert len(ALL_COMMANDS) > 30  # the parser found the docs' commands (a broken parser finds none)
    assert ("README.md", "python scripts/model_summary.py train_configs/gpt_small_res_gelu.toml") in ALL_COMMANDS


@pytest.mark.integration
@pytest.mark.parametrize("where,command", ALL_COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in ALL_COMMANDS])
def test_every_documented_command_names_real_scripts_options_and_files(where: str, command: str) -> None:
    words = shlex.split(command.replace("...", ""))
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # NGPU=8 and friends
        words.pop(0)
    program = words[0]
    if program in ("source", "tensorboard", "./run_tests.sh", "pip"):
        return
    if program == "python" and words[1] == "-c":
        return  # inline Python (e.g. downloading GPT-2 with transformers): nothing of ours to check
    if program == "python" and words[1] == "-m":
        module, rest = words[2], words[3:]
        path = module_file(module)
        assert path is not None, f"{where}: python -m {module}: no such module of this checkout"
        runs = path.name == "__main__.py" or 'if __name__ == "__main__":' in path.read_text()
        assert runs, f"{where}: python -m {module} runs nothing"
        config_driven, help_text = module in CONFIG_DRIVEN, program_help(module)
    elif program == "python":
        script, rest = words[1], words[2:]
        assert (REPO_ROOT / script).is_file(), f"{where}: {script} does not exist"
        config_driven, help_text = script in CONFIG_DRIVEN, program_help(script)
    else:
        assert program == "./run_train.sh", f"{where}: unknown program in {command!r}"
        rest, config_driven, help_text = words[1:], True, ""
    for option in options_of(rest):
        known = option in help_text or (config_driven and option[2:] in CONFIG_KEYS)
        known = known or option in ("--help", "--print-config")
        program_words = " ".join(words[:len(words) - len(rest)])
        assert known, f"{where}: {command!r} passes {option}, which {program_words} does not take"
    for word in rest:
        if re.fullmatch(r"(train_configs|suites)/[\w.-]+\.toml", word):
            assert (REPO_ROOT / word).is_file(), f"{where}: {word} does not exist"


def test_readme_activates_the_environment_before_the_first_tool_command() -> None:
    commands = documented_commands(REPO_ROOT / "README.md")
    first_tool = next(i for i, c in enumerate(commands) if c.startswith(("python ", "tensorboard ")))
    assert any(c.startswith("source .venv/bin/activate") for c in commands[:first_tool])


@pytest.mark.parametrize("activated", [False, True])
def test_hints_name_a_python_that_can_import_torchnlq(monkeypatch: pytest.MonkeyPatch, activated: bool) -> None:
    monkeypatch.setattr(sys, "prefix", "/opt/proj/.venv")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.chdir("/")
    if activated:
        monkeypatch.setenv("VIRTUAL_ENV", "/opt/proj/.venv")
    else:
        monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    expected = "python" if activated else "opt/proj/.venv/bin/python"
    assert script_command("scripts/x.py --a") == f"{expected} scripts/x.py --a"


# --------------------------------------------------------------------- the README, run as written
# Commands the flow below does not run, each with its reason.
NOT_RUN = {
    "./run_tests.sh": "the test suite itself",
    "./run_train.sh train_configs/gpt_small_res_gelu.toml": "29 B tokens on a GPU",
    "./run_train.sh train_configs/gpt_small_res_gelu.toml --training.steps 2000 --lr_schedule.warmup_steps 100 --lr_schedule.decay_steps 2000 --job.name quick":
        "gpt_small for 2000 steps: hours on this CPU",
    "NGPU=8": "eight GPUs",
    "NNODES=2": "two nodes",
    "python scripts/prepare_data.py --out ./data/openwebtext": "the network and 80 GB",
    "./run_train.sh train_configs/gpt_small_": "a Table 1 run: 29 B tokens on a GPU",
    "python scripts/run_suite.py suites/table1.toml": "seven Table 1 runs",
    "python scripts/convert_checkpoint.py CKPT OUT --format hf-gpt2": "needs a linear-query model: tests/test_export.py",
    "python scripts/convert_checkpoint.py CKPT OUT --format hf-llama": "needs a linear-query Llama-style model: tests/test_hf_llama.py",
    "python scripts/convert_checkpoint.py CKPT OUT --format hf-qwen3": "needs a QK-norm Llama-style model: tests/test_hf_qwen3.py",
    "python -m benchmarks.gpu_check": "a GPU: tests/test_gpu_check.py runs its CPU smoke mode",
    # The quickstart's commands, run as written by test_the_readme_quickstart_runs_as_written.
    "python scripts/prepare_data.py --files data/tinyshakespeare.txt": "the quickstart (its own test)",
    "OMP_NUM_THREADS=1 python scripts/run_suite.py suites/quickstart.toml": "the quickstart (its own test)",
    "python scripts/generate.py outputs/suites/quickstart/": "the quickstart (its own test)",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy_checkout(dest: Path) -> None:
    """The tracked (and new, unignored) files of this checkout, as a fresh clone has them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, listed.split("\0")):
        src = REPO_ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _fresh_clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the checkout with its .venv set up, and the environment of a newcomer's shell in it."""
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("needs the checkout's git metadata to copy it")
    clone = tmp_path / "clone"
    _copy_checkout(clone)
    # This interpreter's environment is the clone's .venv, already set up (as ./run_train.sh would
    # leave it); PYTHONPATH makes its torchnlq the clone's, as the clone's own editable install would.
    venv = clone / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(
        f'export VIRTUAL_ENV="{sys.prefix}"\nexport PATH="{Path(sys.executable).parent}:$PATH"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(clone), "OMP_NUM_THREADS": "1", "HOME": str(tmp_path),
           "TORCHNLQ_CACHE": str(tmp_path / "cache"), "MPLCONFIGDIR": str(tmp_path / "mpl")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return clone, env


@pytest.mark.integration
def test_the_readme_commands_run_as_written(tmp_path: Path) -> None:
    clone, env = _fresh_clone(tmp_path)
    readme = documented_commands(REPO_ROOT / "README.md")
    skipped = {c: next((why for key, why in NOT_RUN.items() if c.startswith(key)), None) for c in readme}
    to_run = [c for c in readme if skipped[c] is None]
    assert to_run[0] == "./run_train.sh", "the README starts with the debug run"
    run_shell("./run_train.sh", clone, env, timeout=600)
    activated = False
    for command in to_run[1:]:
        if command.startswith("source "):
            activated = True
            continue
        assert activated, f"{command!r} comes before the README activates .venv"
        line = f"source .venv/bin/activate && {command}"
        if command.startswith("tensorboard "):
            check_tensorboard(command, clone, env)
            continue
        run_shell(line, clone, env, timeout=300)
    assert (clone / "exports/debug_ckpt/model.safetensors").is_file()


def run_shell(line: str, cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run one command line in bash as typed; it must exit 0 (output returned for the message)."""
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def check_tensorboard(command: str, cwd: Path, env: dict[str, str]) -> None:
    """Start the documented TensorBoard server and ask its HTTP API for the debug run's scalars."""
    port = _free_port()
    line = f"source .venv/bin/activate && exec {command} --port {port} --bind_all=false --host 127.0.0.1"
    line = line.replace("--bind_all=false ", "")
    server = subprocess.Popen(["bash", "-c", line], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        tags: dict = {}
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    tags = json.load(r)
                if tags:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        runs = [run for run in tags if run.startswith("debug_model")]
        assert runs and "loss/train" in tags[runs[0]], tags
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


# --------------------------------------------------------------------- the README's quickstart, run as written
QUICKSTART_TITLE = "## Quickstart on real text (CPU)"
# The README downloads Tiny Shakespeare here; its offline path, a copy of a file the user has, is what this test takes.
QUICKSTART_TEXT = "data/tinyshakespeare.txt"
# The quickstart's 400 steps of the CPU study's model take minutes; here the same commands train a model and
# batch this small (added to the copy's suite file), so its steps, checkpoint paths and comparison are the real ones.
SMALL_RUNS = ["--model.n_layers=1", "--model.dim=64", "--training.micro_batch_size=4", "--training.seq_len=64",
              "--validation.sequences=32", "--validation.micro_batch_size=32"]


def quickstart_commands() -> list[str]:
    """The commands of the README's quickstart section, in order."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert QUICKSTART_TITLE in readme, f"README.md lost its section {QUICKSTART_TITLE!r}"
    section = readme.split(QUICKSTART_TITLE, 1)[1].split("\n## ", 1)[0]
    return commands_in(section)


def byte_unigram_entropy(text: bytes) -> float:
    """Nats per byte of the best model that ignores context: the bar any trained model must be under."""
    counts = torch.bincount(torch.frombuffer(bytearray(text), dtype=torch.uint8).long(), minlength=256).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


@pytest.mark.integration
def test_the_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    """Prepare Tiny Shakespeare, train the linear and the paper's query, compare, sample: the README's commands."""
    from helpers.data import SHAKESPEARE

    if not SHAKESPEARE.is_file():
        pytest.skip(f"needs Tiny Shakespeare at {SHAKESPEARE} (the quickstart's corpus; no network here)")
    commands = quickstart_commands()
    scripts = [next(w for w in c.split() if w.startswith("scripts/")) for c in commands]
    assert scripts == ["scripts/prepare_data.py", "scripts/run_suite.py", "scripts/generate.py"]
    clone, env = _fresh_clone(tmp_path)
    (clone / QUICKSTART_TEXT).parent.mkdir()
    shutil.copy(SHAKESPEARE, clone / QUICKSTART_TEXT)
    suite = clone / "suites/quickstart.toml"
    suite.write_text(suite.read_text().replace('baseline = "linear"\n',
                                               f'baseline = "linear"\noverrides = {json.dumps(SMALL_RUNS)}\n'))
    outputs = [run_shell(f"source .venv/bin/activate && {command}", clone, env, timeout=600) for command in commands]

    dump = clone / "outputs/suites/quickstart"
    bar = byte_unigram_entropy(SHAKESPEARE.read_bytes())
    for arm, query in (("linear", "linear"), ("res_gelu", "residual_mlp")):
        info = json.loads((dump / arm / "run_info.json").read_text())
        assert (info["finished"], info["step"], info["query_type"]) == (True, 400, query)
        assert info["last_val_loss"] < bar, f"{arm} did not learn: {info['last_val_loss']} >= unigram {bar:.3f}"
    comparison = (dump / "comparison.md").read_text()
    assert "| linear" in comparison and "| res_gelu" in comparison
    prompt = re.search(r'--prompt "([^"]+)"', commands[2]).group(1)
    assert prompt in outputs[2] and len(outputs[2].split(prompt, 1)[1].strip()) > 50, outputs[2]
