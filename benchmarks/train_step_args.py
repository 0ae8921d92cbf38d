"""The command line of ``python -m benchmarks.train_step``: its own flags apart from the config overrides (passed
on untouched)."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field

from torchnlq.cli import ArgumentParser
from torchnlq.errors import UserError

AUTOCAST_CHOICES = ("config", "bf16", "fp32")


@dataclass
class BenchOptions:
    """The benchmark's own flags (everything else is a config override)."""

    steps: int = 10
    warmup: int = 3
    json: str | None = None
    autocast: str = "config"
    real_data: bool = False
    compare: list[str] = field(default_factory=list)
    help: bool = False


def split_bench_args(argv: list[str]) -> tuple[BenchOptions, list[str]]:
    """(the benchmark's flags, the remaining arguments for ``load_job_config``)."""
    parser = ArgumentParser(prog="python -m benchmarks.train_step", add_help=False, allow_abbrev=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--steps", type=int, default=BenchOptions.steps)
    parser.add_argument("--warmup", type=int, default=BenchOptions.warmup)
    parser.add_argument("--json")
    parser.add_argument("--autocast", choices=AUTOCAST_CHOICES, default=BenchOptions.autocast)
    parser.add_argument("--real-data", action="store_true")
    parser.add_argument("--compare", action="append", default=[])
    # argparse would read a spec of overrides alone ("--k=v") as a flag: hand it to --compare with "=".
    words, glued = iter(argv), []
    for arg in words:
        value = next(words, None) if arg == "--compare" else None
        glued.append(arg if value is None else f"{arg}={value}")
    known, rest = parser.parse_known_args(glued)
    opts = BenchOptions(**vars(known))
    if opts.steps < 1 or opts.warmup < 0:
        raise UserError(f"--steps must be at least 1 and --warmup at least 0 (got {opts.steps}, {opts.warmup})")
    return opts, rest


def parse_variant(spec: str, default_autocast: str) -> tuple[str, list[str], str]:
    """``"label: --k=v --autocast=bf16"`` -> (label, config overrides, autocast).

    A spec that starts with ``--`` has no label; its overrides are the label.
    ``--autocast`` inside a spec applies to that variant only.
    """
    if spec.lstrip().startswith("--") or ":" not in spec:
        label, overrides = "", spec
    else:
        label, _, overrides = spec.partition(":")
    try:
        tokens = shlex.split(overrides)
    except ValueError as e:
        raise UserError(f"--compare {spec!r}: {e}") from None
    label = label.strip() or " ".join(tokens) or "base"
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--autocast", choices=AUTOCAST_CHOICES, default=default_autocast)
    try:
        known, config_args = parser.parse_known_args(tokens)
    except argparse.ArgumentError as e:
        raise UserError(f"--compare {label!r}: {e}") from None
    return label, config_args, known.autocast
