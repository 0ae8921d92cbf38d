"""Model summary: parameter shapes, parameter counts and FLOPs per token of a config, built on meta.

Library code behind ``scripts/model_summary.py``; the model is built on the
meta device, so even the largest flavor costs no memory.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import torch

from torchnlq.config.checks import check_job_config, config_warnings
from torchnlq.config.job_config import JobConfig
from torchnlq.errors import UserError
from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT
from torchnlq.parallel.memory_estimate import DEFAULT_CARD_GIB, GIB, estimate_memory, fit_warning

_LAYER_PREFIX = re.compile(r"^layers\.(\d+)\.")


def memory_lines(cfg: JobConfig, args: ModelArgs, processes: int, card_gib: float) -> tuple[list[str], str | None]:
    """The memory estimate per process on CUDA (torchnlq.parallel.memory_estimate) and a warning if it does not fit."""
    estimate = estimate_memory(cfg, args, processes, "cuda")
    lines = [
        f"memory_estimate: {estimate.describe()} (eager step on CUDA, micro-batch "
        f"{cfg.training.micro_batch_size} x {cfg.training.seq_len}, activation checkpointing "
        f"{cfg.activation_checkpoint.mode}, optimizer {cfg.optimizer.name})",
        f"memory_estimate_gib: {estimate.total / GIB:.2f}",
    ]
    return lines, fit_warning(estimate, int(card_gib * GIB), f"a {card_gib:g} GiB card")


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

        usage = ("usage: python scripts/model_summary.py [CONFIG.toml] [--section.key VALUE ...] [--processes N] "
                 "[--card-gib G]")
        print(usage + "\n\nPrints the model's shapes, parameter counts and FLOPs per token (built on meta, no memory),")
        print("and the peak memory per process of a training step on N CUDA processes (FSDP for N > 1; default 1),")
        print(f"with a warning when it does not fit a card of G GiB (default {DEFAULT_CARD_GIB:g}).")
        print("The config options are those of ./run_train.sh:\n")
        text = help_text(registries=registry_choices())
        print(text[text.index("Without CONFIG"):])
        return 0
    try:
        from torchnlq.config.manager import load_job_config

        argv, processes = _pop_option(argv, "--processes", int, 1)
        argv, card_gib = _pop_option(argv, "--card-gib", float, DEFAULT_CARD_GIB)
        cfg = load_job_config(argv)
        print("\n".join(summarize(cfg)))
        lines, too_big = memory_lines(cfg, check_job_config(cfg), processes, card_gib)
        print("\n".join(lines))
        for warning in config_warnings(cfg) + ([too_big] if too_big else []):
            print(f"warning: {warning}", file=sys.stderr)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _pop_option(argv: list[str], name: str, kind: type, default: Any) -> tuple[list[str], Any]:
    """Take ``name VALUE`` / ``name=VALUE`` out of ``argv`` (a positive number); the rest goes to the config."""
    rest, value, i = [], default, 0
    while i < len(argv):
        arg = argv[i]
        if arg == name or arg.startswith(name + "="):
            if "=" in arg:
                raw = arg.split("=", 1)[1]
            elif i + 1 < len(argv):
                raw, i = argv[i + 1], i + 1
            else:
                raise UserError(f"{name} needs a value")
            try:
                value = kind(raw)
            except ValueError:
                raise UserError(f"{name} expects a positive {'integer' if kind is int else 'number'}, got {raw!r}") from None
            if not value > 0 or value != value or value == float("inf"):
                raise UserError(f"{name} expects a positive {'integer' if kind is int else 'number'}, got {raw!r}")
        else:
            rest.append(arg)
        i += 1
    return rest, value
