#!/usr/bin/env python
"""Validation loss and perplexity of a checkpoint or export on a prepared data folder.

Uses the run's own fixed validation windows (its seq_len, validation seed and
micro-batch size, recorded in the checkpoint), so on the same data the loss
equals the val_loss training logged at that step. The data is tokenized already:
no tokenizer file (--tiktoken-file, $TORCHNLQ_TIKTOKEN_FILE) is needed, for any model.

Example:
    python scripts/evaluate.py outputs/run/checkpoints/step-5000 --data data/openwebtext
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import ArgumentParser, run_cli  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description="Loss and perplexity of a torchnlq checkpoint or export on fixed validation sequences.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("source", metavar="CKPT_OR_EXPORT", help="a <run>/checkpoints/step-N folder or an export folder")
    p.add_argument("--data", required=True, help="data folder with train.bin, val.bin and meta.json")
    p.add_argument("--sequences", type=int, default=None, help="validation sequences (default: the run's)")
    p.add_argument("--micro-batch-size", type=int, default=None, help="sequences per forward (default: the run's)")
    p.add_argument("--seed", type=int, default=None, help="seed of the validation offsets (default: the run's)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the run's seq_len)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from torchnlq.inference.evaluation import evaluate_source

    result = evaluate_source(
        args.source, args.data, args.sequences, args.micro_batch_size, args.seed, args.seq_len, args.device
    )
    print("\n".join(result.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
