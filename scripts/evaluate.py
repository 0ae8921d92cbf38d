#!/usr/bin/env python
"""Evaluate a checkpoint, an export or a Hugging Face folder torchnlq reads: validation loss on a data folder,
or multiple-choice accuracy.

--data: the validation loss and perplexity on the run's own fixed validation windows (its
seq_len, validation seed and micro-batch size, recorded in the checkpoint), so on the same data
the loss equals the val_loss training logged at that step (a Hugging Face folder records no settings:
--sequences, and --seq-len below its context). The data is tokenized already: no
tokenizer file (--tiktoken-file, $TORCHNLQ_TIKTOKEN_FILE) is needed, for any model.

--multiple-choice: the accuracy on a HellaSwag-format JSON-lines file (ctx or ctx_a + ctx_b,
endings, label), each ending scored by the log-likelihood of its tokens after the context:
acc by the sum, acc_norm by the mean per token (nanoGPT's hellaswag.py). The tokenizer is the
one the checkpoint or export carries. Nothing is written.

Examples:
    python scripts/evaluate.py outputs/run/checkpoints/step-5000 --data data/openwebtext
    python scripts/evaluate.py exports/run-5000 --multiple-choice hellaswag_val.jsonl --limit 1000
    python scripts/evaluate.py path/to/hf_llama --data data/llama_tokens --sequences 64 --seq-len 1024
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import ArgumentParser, DefaultsHelpFormatter, run_cli  # noqa: E402
from torchnlq.config.plugins import add_plugins_option, import_plugins_option  # noqa: E402
from torchnlq.errors import UserError  # noqa: E402

VALIDATION_ONLY = ("sequences", "micro_batch_size", "seed", "seq_len")
MULTIPLE_CHOICE_ONLY = ("limit", "batch_size", "tiktoken_file")


def readable_folders() -> str:
    """The Hugging Face folders torchnlq reads, named from the registered families' architectures."""
    from torchnlq.interop.hf_folder import readable_folders as named

    return named()


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description="Validation loss and perplexity of a torchnlq checkpoint or export (or "
        f"{readable_folders()}) on fixed validation "
        "sequences (--data), or its accuracy on multiple-choice questions (--multiple-choice).",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("source", metavar="CKPT_OR_EXPORT", help="a <run>/checkpoints/step-N folder, an export folder or "
                   f"{readable_folders()} (save_pretrained: safetensors)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--data", default=None, help="data folder with train.bin, val.bin and meta.json")
    what.add_argument("--multiple-choice", metavar="FILE.jsonl", default=None,
                      help="HellaSwag-format JSON lines (ctx or ctx_a + ctx_b, endings, label): print acc and acc_norm")
    val = p.add_argument_group("--data options")
    val.add_argument("--sequences", type=int, default=None, help="validation sequences (default: the run's)")
    val.add_argument("--micro-batch-size", type=int, default=None, help="sequences per forward (default: the run's)")
    val.add_argument("--seed", type=int, default=None, help="seed of the validation offsets (default: the run's)")
    val.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the run's seq_len)")
    mc = p.add_argument_group("--multiple-choice options")
    mc.add_argument("--limit", type=int, default=None, help="score only the first N rows (default: all)")
    mc.add_argument("--batch-size", type=int, default=None,
                    help="endings per forward (default: 16); memory grows with batch x max_seq_len x vocabulary")
    mc.add_argument("--tiktoken-file", default=None,
                    help="GPT-2 .tiktoken ranks file, used instead of the tokenizer the checkpoint or export carries")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    add_plugins_option(p)
    return p


def check_options(args: argparse.Namespace) -> None:
    """UserError for an option of one mode given with the other (it would be silently ignored)."""
    mode, unused = ("--data", MULTIPLE_CHOICE_ONLY) if args.data is not None else ("--multiple-choice", VALIDATION_ONLY)
    for name in unused:
        if getattr(args, name) is not None:
            raise UserError(f"--{name.replace('_', '-')} does not apply to {mode}")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    import_plugins_option(args.plugins)
    check_options(args)
    if args.multiple_choice is not None:
        from torchnlq.inference.multiple_choice import DEFAULT_BATCH_SIZE, evaluate_multiple_choice

        batch_size = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
        result = evaluate_multiple_choice(
            args.source, args.multiple_choice, args.limit, batch_size, args.device, args.tiktoken_file
        )
        print("\n".join(result.lines()))
        return 0
    from torchnlq.inference.evaluation import evaluate_source

    result = evaluate_source(
        args.source, args.data, args.sequences, args.micro_batch_size, args.seed, args.seq_len, args.device
    )
    print("\n".join(result.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
