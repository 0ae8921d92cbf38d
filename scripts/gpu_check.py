#!/usr/bin/env python
"""The first GPU run: device, peak, and a few steps of the default profile per query type, each with a verdict.

Usage: python scripts/gpu_check.py [CONFIG] [--section.key=value ...] [--steps N] [--warmup N]
                                   [--query-types linear,residual_mlp | all] [--device cuda|cpu]
                                   [--compile-backend inductor|aot_eager|eager] [--no-float8] [--json OUT]

Without a GPU: python scripts/gpu_check.py train_configs/debug_model.toml --device cpu (the CPU smoke mode).
See docs/performance.md, "The first GPU run".
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_check import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
