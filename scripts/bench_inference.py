#!/usr/bin/env python
"""Prefill and KV-cache decoding speed per query type (linear, identity, residual, residual_mlp, GQA).

Usage: python scripts/bench_inference.py [--layers 12] [--dim 768] [--heads 12] [--batch 1] [--prompt 128]
                                         [--decode 32] [--rounds 12] [--compile] [--autocast fp32|bf16]
                                         [--variants ...] [--json OUT]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.inference_speed import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
