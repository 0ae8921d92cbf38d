"""Tokenize a dataset into train.bin / val.bin / meta.json for torchnlq, or adopt a nanoGPT data folder.

Examples:
    python scripts/prepare_data.py --out data/openwebtext                      # the paper's data
    python scripts/prepare_data.py --out data/shakespeare --files input.txt --val-fraction 0.1 \\
        --text-split paragraph --tiktoken-file ../shared/data/gpt2.tiktoken   # offline, local text
    python scripts/prepare_data.py --adopt ../nanoGPT/data/openwebtext         # nanoGPT's train.bin/val.bin
    python scripts/prepare_data.py --out data/wiki-llama3 --files wiki.txt --tokenizer hf \\
        --tokenizer-file llama3/tokenizer.json --eot-token "<|end_of_text|>"   # any tokenizer.json

--out must be a new or empty folder; --overwrite lets it be a previous token folder (only its
train.bin, val.bin and meta.json are replaced). A repeated --files adds to the list. When done
it prints the documents and tokens of every input file and split.

--adopt checks an existing nanoGPT folder's train.bin and val.bin (uint16 ids of --tokenizer)
and writes only meta.json beside them (--overwrite replaces an existing one); meta.pkl is
never read. See docs/data.md for the format and the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

# torchnlq.cli imports no datasets: HF_HOME is set below first.
from torchnlq.cli import ArgumentParser, DefaultsHelpFormatter, run_cli  # noqa: E402
from torchnlq.errors import UserError  # noqa: E402

# Options that say how to tokenize: an adopted folder is already tokenized, so they cannot apply.
PREPARE_ONLY = ("dataset", "dataset_config", "files", "text_field", "text_split", "tiktoken_file", "tokenizer_file",
                "eot_token", "val_fraction", "split_seed", "num_proc", "cache_dir")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description="Tokenize a Hugging Face dataset or local files into token files (train.bin, val.bin: uint16, "
        "or uint32 for a vocabulary above 65,536; meta.json), or adopt a nanoGPT data folder (--adopt).",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--out", default=None,
                   help="output folder (becomes data.path); must be new or empty unless --overwrite")
    p.add_argument("--adopt", default=None, metavar="FOLDER",
                   help="instead of --out: an existing nanoGPT data folder (train.bin, val.bin of uint16 --tokenizer "
                   "ids); its files are checked and only meta.json is written beside them (meta.pkl is never read)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace train.bin, val.bin and meta.json of a previous token folder at --out "
                   "(never any other folder; other files in it are kept); with --adopt, replace its meta.json")
    p.add_argument("--dataset", default="openwebtext", help="Hugging Face dataset name (ignored with --files)")
    p.add_argument("--dataset-config", default=None, help="Hugging Face dataset config name, if it has several")
    p.add_argument("--files", nargs="+", action="extend", default=None,
                   help="local .txt or .json/.jsonl files instead of --dataset; a repeated --files adds to the list "
                   "(a file named twice is an error)")
    p.add_argument("--text-field", default="text", help="field holding the document text (JSON/JSONL and hub datasets)")
    p.add_argument("--text-split", default="file", choices=("file", "paragraph", "line"),
                   help="how a local text file becomes documents: whole file, paragraphs (separated by blank or "
                   "whitespace-only lines), or lines")
    p.add_argument("--tokenizer", default="gpt2", choices=("gpt2", "byte", "hf"),
                   help="tokenizer: gpt2 (tiktoken), byte, or hf (the Hugging Face tokenizer.json of --tokenizer-file)")
    p.add_argument("--tokenizer-file", default=None, metavar="TOKENIZER.json",
                   help="--tokenizer hf: a Hugging Face tokenizer.json (e.g. a Llama 3 model folder's); train with "
                   "data.tokenizer_file set to the same file")
    p.add_argument("--eot-token", default=None, metavar="TEXT",
                   help="--tokenizer hf: the token appended after each document (default: the first of "
                   "<|endoftext|>, <|end_of_text|>, </s>, <eos> in the vocabulary)")
    p.add_argument("--tiktoken-file", default=None,
                   help="local GPT-2 .tiktoken ranks file for offline use "
                   "(default: $TORCHNLQ_TIKTOKEN_FILE, else tiktoken's download)")
    p.add_argument("--val-fraction", type=float, default=0.0005,
                   help="fraction of documents split off as validation when the dataset has no validation split")
    p.add_argument("--split-seed", type=int, default=2357, help="seed of that split (the paper's)")
    p.add_argument("--num-proc", type=int, default=min(8, os.cpu_count() or 1), help="tokenizer processes")
    p.add_argument("--cache-dir", default=None,
                   help="Hugging Face cache (downloads, arrow files); default OUT/hf_cache, "
                   "delete it after to save space")
    return p


def adopt(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--adopt FOLDER``: refuse tokenizing options, check the folder, write its meta.json, print the counts."""
    if args.out is not None:
        raise UserError("--adopt and --out exclude each other: --adopt writes meta.json into an existing nanoGPT "
                        "folder, --out tokenizes text into a new one; give one of them")
    # An option left at its default was not given (or given as the default, which changes nothing).
    given = [name for name in PREPARE_ONLY if getattr(args, name) != parser.get_default(name)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UserError(f"{flag} does not apply to --adopt: the folder is already tokenized and is taken as it is; "
                        f"drop {flag} (or prepare text with --out)")
    from torchnlq.data.adopt_nanogpt import adopt_folder, format_adoption

    meta, notes = adopt_folder(args.adopt, args.tokenizer, overwrite=args.overwrite)
    print(format_adoption(meta, args.adopt, notes))
    return 0


def main(argv: list[str]) -> int:
    """Parse ``argv`` and prepare (or adopt) the data; a UserError becomes ``error: ...`` and exit 2 (run_cli)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.adopt is not None:
        return adopt(parser, args)
    if args.out is None:
        raise UserError("one of --out (tokenize into a new folder) or --adopt (adopt a nanoGPT folder) is required "
                        "(see prepare_data.py --help)")
    cache_dir = Path(args.cache_dir or Path(args.out) / "hf_cache").expanduser()
    # datasets reads HF_HOME when imported: keep its hub downloads and module
    # cache with the rest of the cache unless the user chose a home already.
    os.environ.setdefault("HF_HOME", str(cache_dir / "home"))

    from torchnlq.data.prepare import format_report, prepare_dataset

    meta = prepare_dataset(
        args.out, dataset=args.dataset, dataset_config=args.dataset_config, files=args.files,
        text_field=args.text_field, text_split=args.text_split, tokenizer=args.tokenizer,
        tiktoken_file=args.tiktoken_file, tokenizer_file=args.tokenizer_file, eot_token=args.eot_token,
        val_fraction=args.val_fraction, split_seed=args.split_seed,
        num_proc=args.num_proc, cache_dir=cache_dir, overwrite=args.overwrite,
    )
    print(format_report(meta, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
