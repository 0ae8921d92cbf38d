"""Start-up time of torchnlq's commands against ``python -c "import torch"``, interleaved.

    python -m benchmarks.startup [--rounds N] [--only NAME,...]

Every command is a fresh process; each round runs all of them once in a shuffled order, so a load
change hits each alike (:func:`benchmarks.timing.interleave`). Figures are medians over rounds: wall
seconds, CPU seconds of the process (user + system, from ``getrusage`` of the children), and the
median of the per-round ratios of wall time to ``import torch`` in the same round. The commands:

- ``import torch``: the reference, the floor of anything that uses torch;
- ``<script> --help`` for each user-facing script, and ``run_train.sh``'s ``python -m torchnlq.train --help``;
- ``generate.py``: 20 new tokens from the export of a short debug run (made once, in a temporary folder);
- ``first step``: the debug run (``train_configs/debug_model.toml``) from process start to its first
  logged step (``--training.steps 1``), on its synthetic corpus, made beforehand (in the temporary folder)
  as set-up.

Targets (issue 23): generate within 1.6x of import torch, every ``--help`` within 1.5x, the first
step within 5 s of start on an idle machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.timing import (
    children_cpu_seconds,
    describe_machine,
    interleave,
    machine_info,
    markdown_table,
    median,
)
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
HELP_SCRIPTS = ["generate", "evaluate", "convert_checkpoint", "compare_runs", "model_summary", "prepare_data",
                "run_suite", "upcycle"]
DEBUG_CONFIG = "train_configs/debug_model.toml"
FIRST_STEP = re.compile(rb"step +1/")


class Command:
    """One command line, timed as a fresh process; ``until`` ends the timing at the first output line matching it."""

    def __init__(self, name: str, argv: list[str] | Callable[[], list[str]], env: dict[str, str],
                 until: re.Pattern[bytes] | None = None):
        self.name, self.argv, self.env, self.until = name, argv, env, until
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def run(self) -> float:
        """Run once; record and return the wall seconds."""
        argv = self.argv() if callable(self.argv) else self.argv
        cpu0, start = children_cpu_seconds(), time.perf_counter()
        with subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) as proc:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if self.until is not None and self.until.search(line):
                    break
            wall = time.perf_counter() - start
            proc.stdout.read()  # the rest of the run (its clean-up) is not timed but must finish
            rc = proc.wait()
        if rc == 0 and self.until is not None and not self.until.search(lines[-1] if lines else b""):
            raise UserError(f"'{' '.join(argv)}' never printed a line matching {self.until.pattern!r}")
        if rc != 0:
            raise UserError(f"'{' '.join(argv)}' exited {rc}: {b''.join(lines[-3:]).decode(errors='replace')}")
        self.wall.append(wall)
        self.cpu.append(children_cpu_seconds() - cpu0)
        return wall


def _setup(tmp: Path, env: dict[str, str]) -> Path:
    """The debug corpus and a short debug run's export (what generate.py samples from); returns the export."""
    run = [sys.executable, "-m", "torchnlq.train", DEBUG_CONFIG, f"--data.path={tmp / 'synthetic'}",
           "--training.steps=2", "--checkpoint.enabled",
           "--checkpoint.export_at_end", f"--job.dump_folder={tmp}", "--job.name=export"]
    done = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"the set-up run failed: {done.stderr.strip().splitlines()[-1:]}")
    return tmp / "export" / "export"


def build_commands(tmp: Path, only: set[str] | None) -> list[Command]:
    """The reference first, then every command this benchmark times (``only``: by name)."""
    env = {**os.environ, "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}
    py = sys.executable
    commands = [Command("import torch", [py, "-c", "import torch"], env)]
    wanted = lambda name: only is None or name in only  # noqa: E731
    for script in HELP_SCRIPTS:
        if wanted(f"{script} --help"):
            commands.append(Command(f"{script} --help", [py, f"scripts/{script}.py", "--help"], env))
    if wanted("train --help"):
        commands.append(Command("train --help", [py, "-m", "torchnlq.train", "--help"], env))
    if wanted("generate") or wanted("first step"):
        export = _setup(tmp, env)
        if wanted("generate"):
            commands.append(Command("generate 20 tokens", [py, "scripts/generate.py", str(export), "--prompt", "The",
                                                            "--max-new-tokens", "20"], env))
        if wanted("first step"):
            rounds = iter(range(1_000_000))
            base = [py, "-m", "torchnlq.train", DEBUG_CONFIG, f"--data.path={tmp / 'synthetic'}",
                    "--training.steps=1", "--metrics.log_interval=1",
                    "--validation.enabled=false", f"--job.dump_folder={tmp / 'first'}"]
            # A fresh run folder per round: a finished run does not train again.
            commands.append(Command("first step", lambda: [*base, f"--job.name=r{next(rounds)}"], env, FIRST_STEP))
    return commands


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.startup``."""
    parser = ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of every command (default: 12)")
    parser.add_argument("--only", default=None, help="comma-separated command names (default: all); "
                        "e.g. 'generate,first step,generate --help'")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {args.rounds}")
    only = {name.strip() for name in args.only.split(",")} if args.only else None
    with tempfile.TemporaryDirectory(prefix="torchnlq-startup-") as tmp:
        commands = build_commands(Path(tmp), only)
        if len(commands) == 1:
            raise UserError(f"--only {args.only!r} names no command; names: generate, first step, train --help, "
                            + ", ".join(f"{s} --help" for s in HELP_SCRIPTS))
        runs: list[Callable[[], float]] = [c.run for c in commands]
        interleave(runs, args.rounds)
    reference = commands[0]
    rows = []
    for c in commands:
        ratio = median([w / r for w, r in zip(c.wall, reference.wall)])
        rows.append([c.name, f"{median(c.wall):.2f}", f"{median(c.cpu):.2f}", f"{ratio:.2f}×"])
    import torch

    info = machine_info(torch.device("cpu"))
    print(f"# start-up: median of {args.rounds} interleaved rounds; {describe_machine(info)}")
    print(markdown_table(["command", "wall (s)", "CPU (s)", "wall vs import torch"], rows,
                         right=[False, True, True, True]))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
