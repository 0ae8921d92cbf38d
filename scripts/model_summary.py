#!/usr/bin/env python
"""Print a model's parameter shapes, counts and FLOPs per token.

Usage: python scripts/model_summary.py train_configs/gpt_small_res_gelu.toml [--model.query.type=linear ...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import run_cli  # noqa: E402
from torchnlq.train.summary import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
