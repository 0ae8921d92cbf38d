"""Model summary of a config (library code behind ``scripts/model_summary.py``), built on meta: no memory."""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
import torch.nn as nn

from torchnlq.config.job_config import JobConfig, loss_chunk_tokens
from torchnlq.errors import UserError
from torchnlq.models.args import ModelArgs
from torchnlq.models.counts import flops_per_token, num_params
from torchnlq.models.family import build_model
from torchnlq.models.lm_loss import loss_path
from torchnlq.models.roles import COMPONENTS, parameter_roles
from torchnlq.parallel.device_memory import GIB, device_memory_bytes, minimum_state_bytes
from torchnlq.train.memory_estimate import DEFAULT_CARD_GIB, estimate_memory, fit_warning
from torchnlq.train.preflight import check_job_config, config_warnings

#: Beyond this many cards' worth of state the step on fake tensors is skipped (the lower bound says enough).
FAR_BEYOND = 4


def memory_lines(cfg: JobConfig, args: ModelArgs, processes: int,
                 card_gib: float | None) -> tuple[list[str], str | None]:
    """The memory estimate per process on the device the config trains on, and a warning if it does not fit the
    card (CUDA) or the RAM; a model whose weights, gradients and optimizer state alone exceed it :data:`FAR_BEYOND`
    times over is not stepped through (that would take as long as building it): its analytic lower bound is reported."""
    device = cfg.training.device  # where the config's run would train from here, as the trainer picks it
    if device != "auto":
        why = f"training.device = {device}"
    elif torch.cuda.is_available():
        device, why = "cuda", "training.device = auto and a GPU here"
    else:
        device, why = "cpu", "training.device = auto and no GPU here; --training.device=cuda estimates a GPU run"
    if device == "cuda":
        card_gib = DEFAULT_CARD_GIB if card_gib is None else card_gib
        capacity, where = int(card_gib * GIB), f"a {card_gib:g} GiB card"
    elif card_gib is not None:
        raise UserError(f"--card-gib is a GPU's memory, but this config trains on the CPU ({why}); drop --card-gib "
                        "or add --training.device=cuda")
    else:
        capacity, where = device_memory_bytes(torch.device("cpu")) or 0, "this machine's RAM"
    floor = minimum_state_bytes(args, processes)
    if capacity and floor > FAR_BEYOND * capacity:
        return [f"memory_estimate_gib: at least {floor / GIB:,.1f} (weights, gradients and AdamW state alone)"], (
            f"the model needs at least {floor / GIB:,.1f} GiB per process, far beyond {where}; "
            "make it smaller or shard it over more processes")
    estimate = estimate_memory(cfg, args, processes, device)
    chunk = loss_chunk_tokens(cfg.training, device)
    head = f"head loss {loss_path(chunk).describe(chunk)}"
    if cfg.training.compile:
        head = f"compiled {head}"
    lines = [
        f"memory_estimate: {estimate.describe()} (eager blocks, {head}, on {device.upper()}: {why}; micro-batch "
        f"{cfg.training.micro_batch_size} x {cfg.training.seq_len}, activation checkpointing "
        f"{cfg.activation_checkpoint.mode}, optimizer {cfg.optimizer.name})",
        f"memory_estimate_gib: {estimate.total / GIB:.2f}",
    ]
    return lines, fit_warning(estimate, capacity, where) if capacity else None


def parameter_split(model: nn.Module) -> dict[str, int]:
    """Parameters by component (:data:`~torchnlq.models.roles.COMPONENTS`, as the model's modules declare them:
    models/roles.py) of ``model`` (built on meta); their sum is its total. ``other`` is shown only when used."""
    params = dict(model.named_parameters())
    split = dict.fromkeys(COMPONENTS, 0)
    for name, role in parameter_roles(model).items():
        split[role.component] += params[name].numel()
    if not split["other"]:
        del split["other"]
    return split


def parameter_lines(cfg: JobConfig, args: ModelArgs, model: nn.Module) -> list[str]:
    """``params_<component>`` lines, and the difference from the same config with a linear query."""
    tied = " (tied: the token embedding)" if args.tie_embeddings else ""
    lines = [f"params_{component}: {count:,}{tied if component == 'head' else ''}"
             for component, count in parameter_split(model).items()]
    linear_cfg = copy.deepcopy(cfg)
    linear_cfg.model.query.type = "linear"
    linear_args = check_job_config(linear_cfg)
    linear = num_params(linear_args)
    line = (f"params_vs_linear_query: {num_params(args) - linear:+,} (the same config with model.query.type = linear "
            f"has {linear:,}")
    active = num_params(linear_args, active=True)
    if active != linear:  # an MoE: the paper's check at equal active parameters too (the query is outside experts)
        line += f"; active {num_params(args, active=True) - active:+,}, against its {active:,}"
    lines.append(line + ")")
    return lines


def layer_ranges(indices: list[int]) -> str:
    """Block indices as ranges: [0, 1, 2, 5] -> "0-2,5"."""
    ranges: list[list[int]] = []
    for i in indices:
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def shape_lines(model: nn.Module) -> list[str]:
    """``name: (shape)`` per parameter; the blocks' once per kind of block (``layers.*.`` when all are alike, else
    ``layers.<indices>.``)."""
    lines = [f"{name}: {tuple(p.shape)}" for name, p in model.named_parameters() if not name.startswith("layers.")]
    kinds: dict[tuple, list[int]] = {}
    for index, block in enumerate(model.layers):
        kinds.setdefault(tuple((n, tuple(p.shape)) for n, p in block.named_parameters()), []).append(index)
    at = next((i for i, line in enumerate(lines) if not line.startswith(("tok_emb", "pos_emb"))), len(lines))
    for kind, indices in kinds.items():
        label = "*" if len(kinds) == 1 else layer_ranges(indices)
        lines[at:at] = [f"layers.{label}.{name}: {shape}" for name, shape in kind]
        at += len(kind)
    return lines


def summarize(cfg: JobConfig) -> list[str]:
    """The summary as ``name: value`` lines: sizes, parameter shapes (blocks once per kind), totals."""
    args = check_job_config(cfg)  # the trainer's checks: a summary of a config that cannot run is an error
    seq_len = cfg.training.seq_len
    with torch.device("meta"):  # shapes only: no memory
        model = build_model(args)
    sizes = ("family", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "mlp_hidden", "vocab_size",
             "max_seq_len", "positions", "tie_embeddings")
    lines = [f"flavor: {cfg.model.flavor}", f"query: {args.query.type}", *(f"{k}: {getattr(args, k)}" for k in sizes)]
    lines += shape_lines(model)
    active = num_params(args, active=True)
    lines += [
        f"seq_len: {seq_len:,}",
        f"total_params: {num_params(args):,}",
        *([f"active_params: {active:,} (per token)"] if active != num_params(args) else []),
        f"non_embedding_params: {num_params(args, non_embedding=True):,}",
        *parameter_lines(cfg, args, model),
        f"flops_per_token: {flops_per_token(args, seq_len):,}",
    ]
    return lines


#: The summary's --help on a missing CONFIG: not the trainer's (run_train.sh's default is a file, not these).
NO_CONFIG_HELP = ("Without CONFIG, the summary is of the built-in defaults below, not of ./run_train.sh's default "
                  "train_configs/debug_model.toml (pass that file for the trainer's model). ")


def assumed_config(path: str | None) -> str:
    """The summary's first line: which config it describes. Without one, the built-in defaults, which are not the
    model ./run_train.sh trains without one (train_configs/debug_model.toml): said, so the two are not confused."""
    if path is not None:
        return f"config: {path}"
    return ("config: none, the built-in defaults (./run_train.sh without CONFIG trains train_configs/debug_model.toml "
            "instead: pass it to summarise that model)")


def main(argv: list[str] | None = None) -> int:
    """``model_summary.py [CONFIG] [--section.key=value ...]``: print the summary; user errors exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        from torchnlq.train.registries import registry_choices
        from torchnlq.config.render import help_text

        usage = ("usage: python scripts/model_summary.py [CONFIG.toml] [--section.key VALUE ...] [--processes N] "
                 "[--card-gib G]")
        print(usage + "\n\nPrints the model's shapes, parameter counts (by component, and against a linear query) and")
        print("FLOPs per token (built on meta, no memory), and the peak memory per process of a training step on N")
        print("processes (FSDP for N > 1; default 1) of the config's training.device (auto: CUDA if this machine has")
        print("one; bf16 autocast only on CUDA), with a warning when it does not fit a card of G GiB (CUDA; default")
        print(f"{DEFAULT_CARD_GIB:g}) or this machine's RAM (CPU).")
        print("The config options are those of ./run_train.sh:\n")
        text = help_text(registries=registry_choices())
        options = text[text.index("Without CONFIG"):]
        print(NO_CONFIG_HELP + options[options.index(". ") + 2:])
        return 0
    try:
        from torchnlq.config.manager import config_path, load_job_config

        argv, processes = _pop_option(argv, "--processes", int, 1)
        argv, card_gib = _pop_option(argv, "--card-gib", float, None)
        cfg = load_job_config(argv)
        summary = [assumed_config(config_path(argv)), *summarize(cfg)]
        args = check_job_config(cfg)
        lines, too_big = memory_lines(cfg, args, processes, card_gib)  # a mistake before any output
        print("\n".join(summary + lines))
        for warning in config_warnings(cfg, args) + ([too_big] if too_big else []):
            print(f"warning: {warning}", file=sys.stderr)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _pop_option(argv: list[str], name: str, kind: type, default: Any) -> tuple[list[str], Any]:
    """Take ``name VALUE`` / ``name=VALUE`` out of ``argv`` (a positive number); the rest goes to the config."""
    import argparse

    from torchnlq.cli import ArgumentParser

    def positive(raw: str) -> Any:
        try:
            value = kind(raw)
        except ValueError:
            value = 0
        if not 0 < value < float("inf"):  # nan and inf too
            what = "integer" if kind is int else "number"
            raise argparse.ArgumentTypeError(f"expects a positive {what}, got {raw!r}")
        return value

    parser = ArgumentParser(prog="model_summary.py", add_help=False, allow_abbrev=False)
    parser.add_argument(name, dest="value", type=positive, default=default)
    known, rest = parser.parse_known_args(argv)
    return rest, known.value
