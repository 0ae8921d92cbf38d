"""Model summary: parameter shapes, parameter counts and FLOPs per token of a config, built on meta.

Library code behind ``scripts/model_summary.py``; the model is built on the
meta device, so even the largest flavor costs no memory.
"""

from __future__ import annotations

import re
import sys

import torch

from torchnlq.config.checks import check_job_config, config_warnings
from torchnlq.config.job_config import JobConfig
from torchnlq.errors import UserError
from torchnlq.models.gpt import GPT

_LAYER_PREFIX = re.compile(r"^layers\.(\d+)\.")


def summarize(cfg: JobConfig) -> list[str]:
    """The summary as ``name: value`` lines.

    First the model's sizes; then the parameter shapes, block parameters
    listed once as ``layers.*.<name>: (shape)`` since blocks are identical;
    then the totals
    ``total_params``, ``non_embedding_params`` and ``flops_per_token`` (at
    ``training.seq_len``).
    """
    args = check_job_config(cfg)  # the trainer's checks: a summary of a config that cannot run is an error
    seq_len = cfg.training.seq_len
    with torch.device("meta"):
        model = GPT(args)

    lines = [
        f"flavor: {cfg.model.flavor}",
        f"query: {args.query.type}",
        f"n_layers: {args.n_layers}",
        f"dim: {args.dim}",
        f"n_heads: {args.n_heads}",
        f"n_kv_heads: {args.n_kv_heads}",
        f"head_dim: {args.head_dim}",
        f"mlp_hidden: {args.mlp_hidden}",
        f"vocab_size: {args.vocab_size}",
        f"max_seq_len: {args.max_seq_len}",
        f"positions: {args.positions}",
        f"tie_embeddings: {args.tie_embeddings}",
    ]
    for name, param in model.named_parameters():
        match = _LAYER_PREFIX.match(name)
        if match and match.group(1) != "0":
            continue
        lines.append(f"{_LAYER_PREFIX.sub('layers.*.', name)}: {tuple(param.shape)}")
    total = model.num_params()
    if total != args.num_params():  # the analytic count is what the FLOP count uses: they must agree
        raise RuntimeError(f"analytic parameter count {args.num_params()} != built model's {total}")
    lines += [
        f"seq_len: {seq_len}",
        f"total_params: {total}",
        f"non_embedding_params: {args.num_params(non_embedding=True)}",
        f"flops_per_token: {args.flops_per_token(seq_len)}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``model_summary.py [CONFIG] [--section.key=value ...]``: print the summary; user errors exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        from torchnlq.config.checks import registry_choices
        from torchnlq.config.render import help_text

        usage = "usage: python scripts/model_summary.py [CONFIG.toml] [--section.key VALUE ...]"
        print(usage + "\n\nPrints the model's shapes, parameter counts and FLOPs per token (built on meta, no memory).")
        print("The config options are those of ./run_train.sh:\n")
        text = help_text(registries=registry_choices())
        print(text[text.index("Without CONFIG"):])
        return 0
    try:
        from torchnlq.config.manager import load_job_config

        cfg = load_job_config(argv)
        print("\n".join(summarize(cfg)))
        for warning in config_warnings(cfg):
            print(f"warning: {warning}", file=sys.stderr)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
