#!/usr/bin/env python
"""Time one attention block per query type (linear, identity, residual, residual_mlp).

Usage: python scripts/bench_attention.py [--batch 1] [--seq 1024] [--dim 768] [--heads 12] [--kv-heads N]
                                         [--rope] [--steps 20] [--warmup 3] [--compile] [--autocast fp32|bf16]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention_block import main  # noqa: E402
from torchnlq.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
