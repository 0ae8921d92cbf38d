#!/usr/bin/env python
"""Convert a training checkpoint (or an export, or a Hugging Face folder torchnlq reads) into a model folder.

Examples:
    python scripts/convert_checkpoint.py outputs/run/checkpoints/step-5000 exports/run-5000
    python scripts/convert_checkpoint.py outputs/run/checkpoints/step-5000 exports/run-bf16 --dtype bf16
    python scripts/convert_checkpoint.py outputs/run/checkpoints/step-5000 exports/run-hf --format hf
    python scripts/convert_checkpoint.py outputs/run/checkpoints/step-5000 exports/run-gpt2 --format hf-gpt2
    python scripts/convert_checkpoint.py outputs/llama/checkpoints/step-100 exports/llama --format hf-llama
    python scripts/convert_checkpoint.py outputs/qknorm/checkpoints/step-100 exports/qwen3 --format hf-qwen3

OUT must be a new folder, or with --overwrite a previous export (only its files are replaced).
Refused even with --overwrite: the checkpoint itself or a folder containing or inside it, the
run folder and its checkpoints/ folder, the current directory, the home folder and their
parents, and any folder that is not a torchnlq export. See docs/checkpoints.md ("Export and use").
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import ArgumentParser, DefaultsHelpFormatter, run_cli  # noqa: E402
from torchnlq.config.plugins import add_plugins_option, import_plugins_option  # noqa: E402

#: --format -> (module, function) of its writer, each (source, out, dtype, overwrite=...) -> the folder written; the
#: standard Hugging Face architectures of the model families (hf-gpt2, hf-llama, ...) are added by standard_formats().
FORMATS = {
    "safetensors": ("torchnlq.interop.export", "export_safetensors"),
    "hf": ("torchnlq.interop.hf_export", "export_hf"),
}


def readable_folders() -> str:
    """The Hugging Face folders torchnlq reads, named from the registered families' architectures."""
    from torchnlq.interop.hf_folder import readable_folders as named

    return named()


def standard_formats() -> dict[str, str]:
    """The families' standard Hugging Face architectures: format -> transformers class (hf-llama: LlamaForCausalLM)."""
    from torchnlq.interop.hf_folder import standard_architectures

    return {name: arch.architecture for name, arch in standard_architectures().items()}


def build_parser() -> argparse.ArgumentParser:
    standard = standard_formats()
    p = ArgumentParser(
        description="Convert a torchnlq checkpoint into safetensors (torchnlq.load_pretrained), "
        "a Hugging Face transformers folder of any model (hf: AutoModelForCausalLM.from_pretrained, carrying "
        "torchnlq's model code) or a standard Hugging Face folder of a linear-query model without remote code ("
        + "; ".join(f"{name}: transformers.{cls}" for name, cls in standard.items()) + ").",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("checkpoint", metavar="CKPT", help="a <run>/checkpoints/step-N folder, a safetensors export or "
                   f"{readable_folders()}")
    p.add_argument("out", metavar="OUT", help="output folder (new, or a previous export with --overwrite)")
    p.add_argument("--format", default="safetensors", choices=(*FORMATS, *standard), help="output format")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="dtype of the stored weights")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it is a previous torchnlq export "
                   "(never any other folder)")
    p.add_argument("--tiktoken-file", default=None, help="GPT-2 .tiktoken ranks file, for a gpt2 model that carries "
                   "none (default: $TORCHNLQ_TIKTOKEN_FILE, then tiktoken's cache)")
    add_plugins_option(p)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    import_plugins_option(args.plugins)
    from torchnlq.interop.export import check_export_folder
    from torchnlq.interop.load import load_model

    check_export_folder(args.out, args.checkpoint, args.overwrite)  # before the (slow) load

    loaded = load_model(args.checkpoint)
    loaded.tiktoken_file = args.tiktoken_file
    if args.format in FORMATS:  # the writers' refusals leave no folder behind (export.atomic_folder)
        module, writer = FORMATS[args.format]
        export = getattr(importlib.import_module(module), writer)  # imported on use: --help stays fast
        out = export(loaded, args.out, args.dtype, overwrite=args.overwrite)
    else:
        from torchnlq.interop.export import export_hf_standard

        out = export_hf_standard(loaded, args.out, args.format, args.dtype, overwrite=args.overwrite)
    step = loaded.meta.get("step", "?")
    print(f"wrote {out} ({args.format}, {args.dtype}, {loaded.model.num_params():,} parameters, step {step})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
