"""``python -m torchnlq.train [CONFIG.toml] [--section.key value ...]`` (what run_train.sh calls)."""

from __future__ import annotations

import sys

from torchnlq.cli import run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.config.render import help_text


def main(args: list[str]) -> int:
    """Parse the config and train; ``--help``/``-h`` prints every option instead."""
    if "--help" in args or "-h" in args:
        from torchnlq.config.checks import registry_choices

        print(help_text(registries=registry_choices()))
        return 0
    cfg = load_job_config(args)
    # Heavy imports only when training (config errors stay fast).
    from torchnlq.parallel.dist import destroy_distributed
    from torchnlq.train.trainer import Trainer

    try:
        Trainer(cfg).train()
    finally:
        destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
