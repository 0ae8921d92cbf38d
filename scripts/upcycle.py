#!/usr/bin/env python
"""Bring a pretrained model into torchnlq, optionally with the anchored nonlinear query.

Examples:
    python scripts/upcycle.py hf/gpt2 exports/gpt2                          # a Hugging Face GPT-2 folder, as is
    python scripts/upcycle.py hf/gpt2 exports/gpt2-anchored --query anchored # + f on every block, f = 0 at start
    python scripts/upcycle.py hf/gpt2 exports/gpt2-anchored6 --query anchored --layers 6-11 --freeze-anchor
    python scripts/upcycle.py outputs/run/checkpoints/step-5000 exports/run-anchored --query anchored
    python scripts/upcycle.py hf/llama exports/llama-anchored --query anchored  # a Llama, Qwen3 folder... too

SOURCE is a Hugging Face folder torchnlq reads (--help names them; save_pretrained: config.json + model.safetensors;
pytorch_model.bin is never unpickled) or a torchnlq checkpoint or export with a linear query. OUT is a
safetensors export whose logits equal SOURCE's, with SOURCE's tokenizer (a tokenizer.json with its special
tokens and chat template, a checkpoint's ranks); a folder saved without one whose vocabulary is GPT-2's
gets GPT-2's (--tiktoken-file, else $TORCHNLQ_TIKTOKEN_FILE or tiktoken's cache). Train from it with
--checkpoint.initial_load_path OUT and the same [model] settings (train_configs/gpt2_small_anchored.toml).
See docs/reproduce.md ("Beyond the paper: starting from a pretrained GPT-2").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import ArgumentParser, DefaultsHelpFormatter, run_cli  # noqa: E402


def readable_folders() -> str:
    """The Hugging Face folders torchnlq reads, named from the registered families' architectures."""
    from torchnlq.interop.hf_folder import readable_folders as named

    return named()


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description=f"Import {readable_folders()} (or a linear-query torchnlq model) as a "
        "torchnlq export, "
        "optionally giving its queries the anchored nonlinear branch Q = X·W_Q + f(X) with f = 0 at the start.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE", help=f"{readable_folders()}, or a torchnlq "
                   "checkpoint or export")
    p.add_argument("out", metavar="OUT", help="output export folder (new, or a previous export with --overwrite)")
    p.add_argument("--query", default="linear", choices=("linear", "anchored"), help="the query of the result")
    p.add_argument("--layers", default="all", help="anchored: the blocks that get f ('all', '6-11', '0,3,11')")
    p.add_argument("--bottleneck-ratio", type=float, default=0.5, help="anchored: f's width r as a fraction of d")
    p.add_argument("--activation", default="gelu", help="anchored: f's activation")
    p.add_argument("--freeze-anchor", action="store_true", help="anchored: record train_anchor = false (W_Q frozen)")
    p.add_argument("--seed", type=int, default=0, help="seed of f's initial weights")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="dtype of the stored weights")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it is a previous torchnlq export")
    p.add_argument("--tiktoken-file", default=None, help="GPT-2 .tiktoken ranks file: the tokenizer of a GPT-2 "
                   "folder saved without one (default: $TORCHNLQ_TIKTOKEN_FILE, then tiktoken's cache)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from torchnlq.interop.export import check_export_folder, export_safetensors
    from torchnlq.interop.upcycle import check_carries_tokenizer, upcycle
    from torchnlq.config.job_config import Query
    from torchnlq.errors import UserError

    if not args.bottleneck_ratio > 0 or args.bottleneck_ratio != args.bottleneck_ratio:
        raise UserError(f"--bottleneck-ratio must be positive, got {args.bottleneck_ratio}")
    if not 0 <= args.seed < 2**63:
        raise UserError(f"--seed must be in 0..2^63-1, got {args.seed}")
    check_export_folder(args.out, args.source, args.overwrite)  # before the (slow) load
    query = Query(type="linear")
    if args.query == "anchored":
        query = Query(type="anchored", layers=args.layers, bottleneck_ratio=args.bottleneck_ratio,
                      activation=args.activation, train_anchor=not args.freeze_anchor)
    loaded = upcycle(args.source, query, args.seed)
    check_carries_tokenizer(loaded)
    loaded.tiktoken_file = args.tiktoken_file
    out = export_safetensors(loaded, args.out, args.dtype, overwrite=args.overwrite)  # a refusal leaves no folder
    print(f"wrote {out} (query {loaded.args.query.type}, {loaded.model.num_params():,} parameters, {args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
