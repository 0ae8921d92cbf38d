"""The command line of scripts/bench.py: its own flags apart from the config overrides.

The benchmark's flags are taken out by hand rather than with argparse, because
everything else (the config path and ``--section.key value`` overrides, with or
without ``=``) must reach :func:`torchnlq.config.manager.load_job_config`
untouched, and a mistake must be a one-line :class:`UserError`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

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


_VALUED = {"--steps": int, "--warmup": int, "--json": str, "--autocast": str, "--compare": str}


def _parse(name: str, raw: str, kind: type) -> Any:
    try:
        return kind(raw)
    except ValueError:
        raise UserError(f"{name} expects an integer, got {raw!r}") from None


def _check_autocast(value: str, where: str) -> str:
    if value not in AUTOCAST_CHOICES:
        raise UserError(f"{where}--autocast: unknown {value!r} (choices: {', '.join(AUTOCAST_CHOICES)})")
    return value


def split_bench_args(argv: list[str]) -> tuple[BenchOptions, list[str]]:
    """(the benchmark's flags, the remaining arguments for ``load_job_config``)."""
    opts, rest, i = BenchOptions(), [], 0
    while i < len(argv):
        name, has_value, value = argv[i].partition("=")
        if name in ("-h", "--help"):
            opts.help = True
        elif name == "--real-data":
            opts.real_data = True
        elif name in _VALUED:
            if not has_value:
                if i + 1 >= len(argv):
                    raise UserError(f"{name} needs a value")
                i, value = i + 1, argv[i + 1]
            parsed = _parse(name, value, _VALUED[name])
            if name == "--compare":
                opts.compare.append(parsed)
            else:
                setattr(opts, name[2:], parsed)
        else:
            rest.append(argv[i])
        i += 1
    if opts.steps < 1 or opts.warmup < 0:
        raise UserError(f"--steps must be at least 1 and --warmup at least 0 (got {opts.steps}, {opts.warmup})")
    _check_autocast(opts.autocast, "")
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
    autocast, config_args, i = default_autocast, [], 0
    while i < len(tokens):
        name, has_value, value = tokens[i].partition("=")
        if name == "--autocast":
            if not has_value:
                if i + 1 >= len(tokens):
                    raise UserError(f"--compare {label!r}: --autocast needs a value")
                i, value = i + 1, tokens[i + 1]
            autocast = _check_autocast(value, f"--compare {label!r}: ")
        else:
            config_args.append(tokens[i])
        i += 1
    return label, config_args, autocast
