#!/usr/bin/env python
"""Sample text from a checkpoint, an export or a Hugging Face folder torchnlq reads, with a KV cache.

Examples:
    python scripts/generate.py outputs/run/checkpoints/step-5000 --prompt "To be" --max-new-tokens 50
    python scripts/generate.py exports/run-5000 --prompt "Once" --temperature 0        # greedy
    python scripts/generate.py old-checkpoint --prompt "The" --tiktoken-file ../shared/data/gpt2.tiktoken
    python scripts/generate.py path/to/hf_llama --prompt "Once" --temperature 0   # save_pretrained, safetensors

Prints the prompt followed by the continuation on stdout; a note on stderr
says when sampling stopped early (end-of-text or a full context). The tokenizer
is the one the checkpoint or export carries (a gpt2 checkpoint's tokenizer.tiktoken,
an export's vocab.json, the tokenizer.json of a model trained with data.tokenizer = "hf" or of a
Hugging Face folder);
--tiktoken-file is needed only for a gpt2 model saved without it (before torchnlq carried
it, or by a run that could not find it); it (or $TORCHNLQ_TIKTOKEN_FILE) also gives GPT-2's
tokenizer to a model that records none (an import of a GPT-2 folder saved without one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torchnlq.cli import ArgumentParser, DefaultsHelpFormatter, run_cli  # noqa: E402
from torchnlq.config.plugins import add_plugins_option, import_plugins_option  # noqa: E402


def readable_folders() -> str:
    """The Hugging Face folders torchnlq reads, named from the registered families' architectures."""
    from torchnlq.interop.hf_folder import readable_folders as named

    return named()


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description="Sample a continuation of a prompt from a torchnlq checkpoint or export, or "
        f"{readable_folders()}.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("source", metavar="CKPT_OR_EXPORT", help="a <run>/checkpoints/step-N folder, an export folder or "
                   f"{readable_folders()} (save_pretrained: safetensors)")
    p.add_argument("--prompt", default="", help="text to continue (empty: start from end-of-text)")
    p.add_argument("--max-new-tokens", type=int, default=100, help="tokens to sample at most")
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature; 0 is greedy (argmax)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens only")
    p.add_argument("--seed", type=int, default=1337, help="sampling seed: the same seed gives the same text")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    add_plugins_option(p)
    p.add_argument("--tiktoken-file", default=None,
                   help="GPT-2 .tiktoken ranks file, used instead of the ones the checkpoint or export carries; "
                   "needed only for a gpt2 model that carries none, or one that records no tokenizer "
                   "(default then: $TORCHNLQ_TIKTOKEN_FILE)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    import_plugins_option(args.plugins)
    from torchnlq.interop.load import load_model
    from torchnlq.inference.sampling import check_sampling, generate_text, stop_note

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.seed)  # before the (slow) load
    loaded = load_model(args.source, args.device)
    text, result = generate_text(
        loaded, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
        tiktoken_file=args.tiktoken_file,
    )
    print(text)
    note = stop_note(result, loaded.args.max_seq_len)
    if note:
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
