"""``python -m torchnlq.inference.lm_eval_adapter``: lm-eval's command line, with ``--model torchnlq`` known.

torchnlq's own mistakes are one ``error:`` line and exit 2; lm-eval reports its mistakes its own way.
"""

from __future__ import annotations

import sys

from torchnlq.cli import run_cli
from torchnlq.errors import UserError


def main(argv: list[str]) -> int:
    """Register the ``torchnlq`` model, then run lm-eval's CLI on ``argv``."""
    try:
        from lm_eval.__main__ import cli_evaluate

        import torchnlq.inference.lm_eval_adapter.model  # noqa: F401  (registers "torchnlq")
    except ImportError as e:
        raise UserError(f"lm-eval is not installed ({e}); pip install -e '.[eval]' (or pip install lm-eval)") from None
    # lm-eval's CLI reads sys.argv itself (and inserts "run" when no subcommand is given).
    sys.argv = ["lm-eval", *argv]
    cli_evaluate()  # argparse's --help and usage errors leave through SystemExit, with its code
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
