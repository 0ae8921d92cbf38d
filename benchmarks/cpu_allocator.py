"""The CPU allocator setting (torchnlq/train/cpu_allocator.py) measured: training steps with and without it.

The setting is per process (glibc's heap), so the two arms cannot share one process: each
round runs ``python -m benchmarks.train_step`` twice, once with ``TORCHNLQ_CPU_ALLOCATOR=keep``
(the default) and once with ``default``, in a seeded random order per round, so that a load change
on a shared machine hits both arms alike. Reported: each arm's median step time over the rounds
(each round's figure is that benchmark's median step), the median of the per-round ratios, and
the median system (kernel) time per process, where page faults show up.

Usage: python -m benchmarks.cpu_allocator CONFIG [--section.key=value ...] [--rounds 12]
                                          [--steps 3] [--warmup 1] [--json OUT]
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.timing import markdown_table, median
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.errors import UserError

ARMS = ("keep", "default")
#: The checkout: the benchmarks package is not installed, so the step benchmark's process finds it on PYTHONPATH.
ROOT = Path(__file__).resolve().parents[1]


def run_arm(arm: str, bench_args: list[str], folder: Path) -> tuple[float, float]:
    """One ``benchmarks.train_step`` process with the allocator setting ``arm``: (median step ms, its system
    seconds). It runs in the user's working directory, where the config's relative paths hold."""
    out = folder / f"{arm}.json"
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TORCHNLQ_CPU_ALLOCATOR": arm, "PYTHONPATH": python_path}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
    done = subprocess.run([sys.executable, "-m", "benchmarks.train_step", *bench_args, "--json", str(out)], env=env,
                          capture_output=True, text=True)
    system = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - before
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise UserError(f"benchmarks.train_step failed ({arm}): {lines[-1] if lines else done.returncode}")
    return json.loads(out.read_text())["variants"][0]["step_ms"], system


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.cpu_allocator``."""
    parser = ArgumentParser(prog="python -m benchmarks.cpu_allocator", add_help=False, allow_abbrev=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", type=Path)
    opts, argv = parser.parse_known_args(argv)  # the rest goes to benchmarks.train_step
    if opts.help:
        print(__doc__)
        return 0
    rounds, steps, warmup, json_out = opts.rounds, opts.steps, opts.warmup, opts.json
    for name, value, minimum in (("--rounds", rounds, 1), ("--steps", steps, 1), ("--warmup", warmup, 0)):
        if value < minimum:
            raise UserError(f"{name} must be at least {minimum}, got {value}")
    if json_out and (json_out.is_dir() or not json_out.parent.is_dir()):
        raise UserError(f"--json '{json_out}' must be a file in an existing folder")
    if not argv or argv[0].startswith("-"):
        raise UserError("give a config first, e.g. train_configs/gpt_small_res_gelu.toml, then overrides")
    if not Path(argv[0]).is_file():
        raise UserError(f"config file '{argv[0]}' not found")
    bench_args = [*argv, "--training.device=cpu", "--steps", str(steps), "--warmup", str(warmup)]
    step_ms: dict[str, list[float]] = {arm: [] for arm in ARMS}
    system_s: dict[str, list[float]] = {arm: [] for arm in ARMS}
    order, rng = list(ARMS), random.Random(0)
    with tempfile.TemporaryDirectory(prefix="bench-allocator-") as tmp:
        for _ in range(rounds):
            rng.shuffle(order)
            for arm in order:
                ms, system = run_arm(arm, bench_args, Path(tmp))
                step_ms[arm].append(ms)
                system_s[arm].append(system)
    ratios = [k / d for k, d in zip(step_ms["keep"], step_ms["default"])]
    rows = [[arm, f"{median(step_ms[arm]):,.0f}", f"{median(system_s[arm]):.1f}"] for arm in ARMS]
    print(f"# {' '.join(argv)}: {rounds} rounds, {steps} timed steps after {warmup} warm-up per process")
    print(markdown_table(["TORCHNLQ_CPU_ALLOCATOR", "step (ms, median)", "system s per process"], rows,
                         right=[False, True, True]))
    print(f"keep / default, median of the per-round ratios: {median(ratios):.3f}x")
    if json_out:
        json_out.write_text(json.dumps({"step_ms": step_ms, "system_s": system_s, "ratios": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
