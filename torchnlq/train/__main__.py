"""``python -m torchnlq.train [CONFIG.toml] [--section.key value ...]`` (what run_train.sh calls)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.config.render import help_text, to_toml

PRINT_CONFIG = "--print-config"


def preflight(args: list[str]) -> int:
    """Check a config and its data in one process, before torchrun starts several: one ``error:`` line."""
    from torchnlq.data.loader import data_meta
    from torchnlq.train.preflight import check_data_fits_model, check_job_config, check_world
    from torchnlq.train.run_lock import RunLock, check_run_folder

    cfg = load_job_config(args)
    model_args = check_job_config(cfg)
    world = os.environ.get("TORCHNLQ_WORLD_SIZE")  # run_train.sh: NGPU x NNODES, the processes torchrun will start
    if world:
        check_world(cfg, model_args, int(world))
    run_dir = Path(cfg.job.dump_folder) / cfg.job.name
    check_run_folder(run_dir)
    check_data_fits_model(data_meta(cfg.data, cfg.training.seq_len), model_args)
    if run_dir.is_dir():  # another trainer on this run: one line here, not a torchrun report
        RunLock(run_dir).check_free()
    return 0


def _make_tmpdir() -> None:
    """Create run_train.sh's $TMPDIR now that the run is known to start (a mistake leaves no folder behind)."""
    folder = os.environ.get("TMPDIR")
    if os.environ.get("TORCHNLQ_MAKE_TMPDIR") == "1" and folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        tempfile.tempdir = None  # it fell back to the system's folder while this one was missing


def show_help(args: list[str]) -> int:
    """Every option with its default; with a config on the command line, also the values it sets."""
    from torchnlq.train.registries import registry_choices

    rest = [a for a in args if a not in ("--help", "-h")]
    cfg = load_job_config(rest) if rest else None
    source = " ".join(rest)
    print(help_text(cfg, registries=registry_choices(), source=f"'{source}'" if cfg else None))
    return 0


def print_config(args: list[str]) -> int:
    """Print the resolved config as TOML (what the run would save as config.toml) and exit; writes nothing."""
    from torchnlq.train.preflight import check_job_config, config_warnings, resolved_config

    cfg = load_job_config(args)
    model_args = check_job_config(cfg)  # the same checks as a run: a config that cannot run is an error here too
    for warning in config_warnings(cfg, model_args):
        print(f"warning: {warning}", file=sys.stderr)
    print(to_toml(resolved_config(cfg, model_args)), end="")
    return 0


def main(args: list[str]) -> int:
    """Parse the config and train; ``--help``/``-h`` prints every option, ``--print-config`` the resolved TOML."""
    if "--help" in args or "-h" in args:
        return show_help(args)
    if PRINT_CONFIG in args:
        return print_config([a for a in args if a != PRINT_CONFIG])
    if "--preflight" in args:
        return preflight([a for a in args if a != "--preflight"])
    cfg = load_job_config(args)
    # Heavy imports only when training (config errors stay fast).
    from torchnlq.parallel.dist import destroy_distributed
    from torchnlq.train.trainer import Trainer

    try:
        trainer = Trainer(cfg)
        _make_tmpdir()
        trainer.train()
    finally:
        destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
