"""Tokenize a dataset into train.bin / val.bin / meta.json for torchnlq.

Examples:
    python scripts/prepare_data.py --out data/openwebtext                      # the paper's data
    python scripts/prepare_data.py --out data/shakespeare --files input.txt --val-fraction 0.1 \\
        --text-split paragraph --tiktoken-file ../shared/data/gpt2.tiktoken   # offline, local text

--out must be a new or empty folder; --overwrite lets it be a previous token folder (only its
train.bin, val.bin and meta.json are replaced). A repeated --files adds to the list.
See docs/data.md for the format and the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import ArgumentParser, run_cli  # noqa: E402  (imports no datasets: HF_HOME is set below first)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description="Tokenize a Hugging Face dataset or local files into uint16 token files (train.bin, val.bin, meta.json).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True,
                   help="output folder (becomes data.path); must be new or empty unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace train.bin, val.bin and meta.json of a previous token folder at --out "
                   "(never any other folder; other files in it are kept)")
    p.add_argument("--dataset", default="openwebtext", help="Hugging Face dataset name (ignored with --files)")
    p.add_argument("--dataset-config", default=None, help="Hugging Face dataset config name, if it has several")
    p.add_argument("--files", nargs="+", action="extend", default=None,
                   help="local .txt or .json/.jsonl files instead of --dataset; a repeated --files adds to the list "
                   "(a file named twice is an error)")
    p.add_argument("--text-field", default="text", help="field holding the document text (JSON/JSONL and hub datasets)")
    p.add_argument("--text-split", default="file", choices=("file", "paragraph", "line"),
                   help="how a local text file becomes documents: whole file, blank-line separated paragraphs, or lines")
    p.add_argument("--tokenizer", default="gpt2", choices=("gpt2", "byte"), help="tokenizer")
    p.add_argument("--tiktoken-file", default=None,
                   help="local GPT-2 .tiktoken ranks file for offline use (default: $TORCHNLQ_TIKTOKEN_FILE, else tiktoken's download)")
    p.add_argument("--val-fraction", type=float, default=0.0005,
                   help="fraction of documents split off as validation when the dataset has no validation split")
    p.add_argument("--split-seed", type=int, default=2357, help="seed of that split (the paper's)")
    p.add_argument("--num-proc", type=int, default=min(8, os.cpu_count() or 1), help="tokenizer processes")
    p.add_argument("--cache-dir", default=None,
                   help="Hugging Face cache (downloads, arrow files); default OUT/hf_cache, delete it after to save space")
    return p


def main(argv: list[str]) -> int:
    """Parse ``argv`` and prepare the data; a UserError becomes ``error: ...`` and exit 2 (run_cli)."""
    args = build_parser().parse_args(argv)
    cache_dir = Path(args.cache_dir or Path(args.out) / "hf_cache").expanduser()
    # datasets reads HF_HOME when imported: keep its hub downloads and module
    # cache with the rest of the cache unless the user chose a home already.
    os.environ.setdefault("HF_HOME", str(cache_dir / "home"))

    from torchnlq.data.prepare import prepare_dataset

    meta = prepare_dataset(
        args.out, dataset=args.dataset, dataset_config=args.dataset_config, files=args.files,
        text_field=args.text_field, text_split=args.text_split, tokenizer=args.tokenizer,
        tiktoken_file=args.tiktoken_file, val_fraction=args.val_fraction, split_seed=args.split_seed,
        num_proc=args.num_proc, cache_dir=cache_dir, overwrite=args.overwrite,
    )
    t = meta["tokens"]
    print(f"wrote {args.out}: train {t['train']:,} tokens, val {t['val']:,} tokens ({meta['tokenizer']})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
