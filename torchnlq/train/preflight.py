"""Preflight checks used by the trainer, the suite runner and the tools, before any run folder or file exists.

What needs several config sections or the registries (the manager checks single values), run warnings, resume changes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torchnlq.config.job_config import Data, JobConfig, Metrics
from torchnlq.config.render import iter_options
from torchnlq.data.batches import PAPER_EVALUATION_ROWS
from torchnlq.checkpoint.checkpointer import list_checkpoints
from torchnlq.data.tokenizer import padded_vocab_size
from torchnlq.errors import ConfigError, unknown_choice
from torchnlq.interop.load import folder_model_args
from torchnlq.models.args import ModelArgs
from torchnlq.models.config import Model
from torchnlq.models.family import (
    FAMILIES,
    build_model,
    build_model_args,
    get_family,
    with_folder_model,
    with_resolved_options,
)
from torchnlq.models.mup import fan_in_multipliers
from torchnlq.models.query import ignored_knobs
from torchnlq.parallel.dist import resolve_degrees
from torchnlq.train.lr_schedule import SCHEDULES, check_schedule, lr_at
from torchnlq.train.optim import ADAMW, OPTIMIZERS, plan_groups
from torchnlq.train.registries import registry_choices, registry_fields


def check_registry_names(cfg: JobConfig) -> None:
    """A ConfigError with a did-you-mean for a registry-backed option naming nothing registered."""
    choices = registry_choices()
    for name, _, values in registry_fields(cfg):
        for value in values:
            if value is not None and value not in choices[name]:  # None: unset (model.family: the flavor's)
                raise unknown_choice(name, value, choices[name])


def check_job_config(cfg: JobConfig) -> ModelArgs:
    """Raise a one-line ConfigError for a config that cannot run; return the model's ModelArgs. Touches no file."""
    run_name = cfg.job.name
    if run_name in ("", ".", "..") or any(c in run_name for c in "/\\\0"):
        raise ConfigError(
            f"job.name={run_name!r} is not a plain folder name (the run folder is job.dump_folder/job.name); "
            "use a name without '/', '\\' or '..', and set job.dump_folder for the location"
        )
    check_registry_names(cfg)
    if cfg.data.synthetic and cfg.data.tokenizer != "byte":
        raise ConfigError('data.synthetic = true writes a byte-level corpus; set data.tokenizer = "byte"')
    if cfg.data.tokenizer == "hf" and not cfg.data.tokenizer_file:
        raise ConfigError(
            'data.tokenizer = "hf" reads a Hugging Face tokenizer.json: set data.tokenizer_file to the one the data '
            "was prepared with (it sizes the model's vocabulary)"
        )
    if cfg.lr_schedule.min_lr > cfg.optimizer.lr:
        raise ConfigError(
            f"lr_schedule.min_lr={cfg.lr_schedule.min_lr} is above optimizer.lr={cfg.optimizer.lr}: the cosine would "
            "raise the learning rate; set min_lr at most lr (the paper uses lr / 10)"
        )
    if cfg.checkpoint.export_at_end and not cfg.checkpoint.enabled:
        raise ConfigError("checkpoint.export_at_end exports the final checkpoint; set checkpoint.enabled = true")
    c, s = cfg.checkpoint, cfg.lr_schedule
    if c.load_step >= 0 and not (c.enabled and c.resume):
        why = "checkpoint.enabled = false" if not c.enabled else "checkpoint.resume = false"
        raise ConfigError(
            f"checkpoint.load_step={c.load_step} picks the checkpoint to resume from, but {why} resumes nothing; "
            "drop load_step, or enable resuming"
        )
    check_schedule(s, cfg.training.steps)
    check_wandb(cfg.metrics)
    check_optional_packages(cfg)
    if cfg.profiling.memory_snapshot and (cfg.training.device == "cpu" or not torch.cuda.is_available()):
        raise ConfigError(
            "profiling.memory_snapshot records CUDA's allocator, and this run trains on the CPU; set "
            "--profiling.memory_snapshot=false (profiling.enabled traces CPU runs)"
        )
    v = cfg.validation
    if v.enabled and v.protocol == "paper" and cfg.training.steps // v.interval >= PAPER_EVALUATION_ROWS:
        raise ConfigError(
            f"validation.protocol = 'paper' has {PAPER_EVALUATION_ROWS} rows, one per validation.interval={v.interval} "
            f"steps, too few for training.steps={cfg.training.steps:,}; raise validation.interval to at least "
            f"{cfg.training.steps // PAPER_EVALUATION_ROWS + 1} or use validation.protocol = 'fixed'"
        )
    # hf reads its tokenizer.json here (bounded, parsed once per file version): its size is the vocabulary's.
    vocab = padded_vocab_size(cfg.data.tokenizer, cfg.model.vocab_multiple, cfg.data.tokenizer_file, cfg.data.eot_token)
    args = build_model_args(section_to_build(cfg), vocab)
    if cfg.training.seq_len > args.max_seq_len:
        raise ConfigError(
            f"training.seq_len={cfg.training.seq_len} exceeds the model's max_seq_len={args.max_seq_len}; "
            "lower training.seq_len or raise model.max_seq_len"
        )
    if cfg.optimizer.groups or OPTIMIZERS[cfg.optimizer.name].hidden != ADAMW or args.parametrization == "mup":
        with torch.device("meta"):  # the parameter names and shapes, no memory: groups are checked before any file
            plan_groups(cfg.optimizer, build_model(args))
    get_family(args.family).runtime.check_parallelism(args, cfg, None)  # the family's own rules (experts)
    if args.parametrization == "mup":  # every parameter has a µP rule and the base width divides the sizes
        with torch.device("meta"):
            fan_in_multipliers(build_model(args))
    return args


def section_to_build(cfg: JobConfig) -> Model:
    """``[model]`` as it builds the model: the config's, or with ``model.from_checkpoint`` the initial load's model
    filled in where the config leaves a key unset."""
    if not cfg.model.from_checkpoint:
        return cfg.model
    if not cfg.checkpoint.initial_load_path:
        raise ConfigError("model.from_checkpoint = true takes the model from checkpoint.initial_load_path, which is "
                          "unset; give the folder (a Hugging Face folder, an export or a checkpoint)")
    own = own_checkpoint(cfg)  # a run that resumes took its model from the folder once: its record holds it
    return with_folder_model(cfg.model, folder_model_args(own or cfg.checkpoint.initial_load_path))


def own_checkpoint(cfg: JobConfig) -> Path | None:
    """The run's own checkpoint its start would resume (``load_step`` or the latest complete one), or None: a run
    from a folder (``model.from_checkpoint``) then takes the model it recorded there, so it resumes without the
    folder (moved or deleted since)."""
    c = cfg.checkpoint
    if not (c.enabled and c.resume):
        return None
    folder = Path(cfg.job.dump_folder) / cfg.job.name / "checkpoints"
    steps = list_checkpoints(folder)
    step = c.load_step if c.load_step >= 0 else (steps[-1] if steps else None)
    return folder / f"step-{step}" if step in steps else None


def resolved_config(cfg: JobConfig, args: ModelArgs) -> JobConfig:
    """``cfg`` as a run records it (config.toml, --print-config): the model options the flavor (or, with
    ``model.from_checkpoint``, the folder) gave, written out."""
    if not cfg.model.from_checkpoint:
        return dataclasses.replace(cfg, model=with_resolved_options(cfg.model, args))
    # What the run took from the folder, written out in full: its own config reproduces it without the folder.
    section = with_folder_model(cfg.model, args)
    section.from_checkpoint = False
    return dataclasses.replace(cfg, model=section)


# Characters W&B refuses in a project name (its server answers with an error once the run has started).
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"


def check_world(cfg: JobConfig, args: ModelArgs, world: int) -> None:
    """The mistakes of ``world`` processes (NGPU x NNODES) that would otherwise surface in every rank's traceback:
    degrees that do not multiply to it, and the family's own (an MoE's experts that do not split over it).
    Raises UserError/ConfigError."""
    resolve_degrees(world, cfg.parallelism)
    get_family(args.family).runtime.check_parallelism(args, cfg, world)


def check_optional_packages(cfg: JobConfig) -> None:
    """The optional packages the config asks for are installed: torchao for an optimizer that names it (adamw8bit)
    and for float8 (it is an extra: large, CUDA-minded and noisy on import)."""
    needs = [(f"optimizer.name = {cfg.optimizer.name!r}", OPTIMIZERS[cfg.optimizer.name].package)]
    if cfg.float8.enabled:
        needs.append(("float8.enabled = true", "torchao"))
    for what, package in needs:
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(f"{what} needs the {package} package: pip install 'torchnlq[{package}]' (or pip "
                              f"install {package}); without it use optimizer.name = 'adamw' and float8.enabled = false")


def check_wandb(metrics: Metrics) -> None:
    """``metrics.wandb = true``: the package is installed and the project name is one W&B accepts."""
    if not metrics.wandb:
        return
    # Whether `import wandb` would find it, without importing it (wandb takes seconds to import).
    installed = sys.modules["wandb"] is not None if "wandb" in sys.modules else importlib.util.find_spec("wandb")
    if not installed:
        raise ConfigError(
            "metrics.wandb = true needs the wandb package: pip install 'torchnlq[wandb]' (or set metrics.wandb = false)"
        )
    project = metrics.wandb_project
    bad = sorted({c for c in project if c in WANDB_PROJECT_FORBIDDEN})
    if not project.strip() or bad or len(project) > 128:
        why = f"contains {' '.join(bad)}" if bad else ("is empty" if not project.strip() else "is over 128 characters")
        raise ConfigError(
            f"metrics.wandb_project={project!r} {why}; W&B project names are 1 to 128 characters without "
            f"{' '.join(WANDB_PROJECT_FORBIDDEN)}"
        )


# A forward pass costs about a third of a training step's forward + backward per token.
FORWARD_SHARE_OF_A_STEP = 1 / 3


def config_warnings(cfg: JobConfig, args: ModelArgs | None = None) -> list[str]:
    """Settings that are legal but do nothing, or not what they look like, in this run (``args``: the model it
    builds, :func:`check_job_config`'s, which is called when not given)."""
    args = args if args is not None else check_job_config(cfg)
    family = get_family(args.family)
    warnings = [f"parallelism.{name} is set but model.family = '{family.name}' does not read it (only "
                f"{' and '.join(repr(f.name) for f in FAMILIES.values() if name in f.runtime.parallelism_options)} "
                "does); it has no effect"
                for name in sorted({n for f in FAMILIES.values() for n in f.runtime.parallelism_options})
                if getattr(cfg.parallelism, name) and name not in family.runtime.parallelism_options]
    if family.warnings is not None:  # the family's own settings that change nothing in this model
        warnings.extend(family.warnings(args))
    ignored = ignored_knobs(cfg.model.query)
    if ignored:
        keys = ", ".join(f"model.query.{k}" for k in ignored)
        warnings.append(f"{keys} set but model.query.type={cfg.model.query.type!r} does not read it; it has no effect")
    if cfg.data.sources and cfg.data.path != Data().path:
        warnings.append(f"data.path = {cfg.data.path!r} is not read: the run trains on its [[data.sources]]; "
                        "remove data.path, or, where it comes from a config this one extends, write "
                        "unset = [\"data.path\"] at the top of this config (docs/configs.md)")
    # Runs that cannot do what they look like: a warmup as long as the run, validation dwarfing training.
    t, s, v = cfg.training, cfg.lr_schedule, cfg.validation
    if s.warmup_steps >= t.steps:
        peak = cfg.optimizer.lr * t.steps / (s.warmup_steps + 1)
        warnings.append(
            f"lr_schedule.warmup_steps={s.warmup_steps} is not shorter than training.steps={t.steps}: the learning "
            f"rate never reaches optimizer.lr={cfg.optimizer.lr:g} (it ends at {peak:.3g}); lower warmup_steps"
        )
    tail_start = SCHEDULES[s.name].decay_start(s, s.decay_steps) if s.decay_steps is not None else 0
    if tail_start > s.warmup_steps and t.steps <= tail_start:
        warnings.append(  # a trunk for branched decays, or a forgotten decay: say both, advise neither away
            f"the run stops at step {t.steps}, in the stable phase (the {s.name} decay starts at step {tail_start:,}): "
            "right for a stable run that decays branch from (docs/training.md, 'Branching decays'); for a run that "
            f"decays itself set --lr_schedule.decay_steps={t.steps}"
        )
    elif s.decay_steps is not None and s.decay_steps > t.steps and s.warmup_steps < t.steps:
        end = lr_at(t.steps - 1, cfg.optimizer.lr, s, t.steps)
        warnings.append(
            f"lr_schedule.decay_steps={s.decay_steps} is beyond training.steps={t.steps}: the run stops before the "
            f"schedule reaches min_lr (its last learning rate is {end:.3g}); set --lr_schedule.decay_steps={t.steps} "
            "for a full decay"
        )
    if v.enabled:
        between = min(v.interval, t.steps) * t.global_batch()  # sequences per process
        if v.sequences * FORWARD_SHARE_OF_A_STEP > between:
            warnings.append(
                f"each validation ({v.sequences} sequences) takes longer than the {min(v.interval, t.steps)} training "
                f"steps before it ({between} sequences per process); lower validation.sequences or raise "
                "validation.interval"
            )
    if cfg.data.tiktoken_file and cfg.data.tokenizer != "gpt2":
        warnings.append(f"data.tiktoken_file set but data.tokenizer = {cfg.data.tokenizer!r} reads no ranks; "
                        "it has no effect")
    for key in ("tokenizer_file", "eot_token"):
        if getattr(cfg.data, key) is not None and cfg.data.tokenizer != "hf":
            warnings.append(f"data.{key} set but data.tokenizer = {cfg.data.tokenizer!r} reads no tokenizer.json; "
                            "it has no effect")
    if not cfg.metrics.wandb:
        defaults = Metrics()
        unused = [k for k in ("wandb_project", "wandb_entity", "wandb_run_name", "wandb_mode")
                  if getattr(cfg.metrics, k) != getattr(defaults, k)]
        if unused:
            keys = ", ".join(f"metrics.{k}" for k in unused)
            warnings.append(f"{keys} set but metrics.wandb = false; it has no effect (set metrics.wandb = true)")
    return warnings


# Options whose change on resume has no effect, and why (everything they decide happened at step 0).
NO_EFFECT_ON_RESUME = {
    "training.seed": "the weights were initialised at step 0 and the RNG states come from the checkpoint",
    "model.init": "the weights were initialised at step 0; a resume loads them from the checkpoint",
    "job.rerun": "a run with checkpoints resumes from them; it starts again only a folder without any",
}


def resume_changes(saved: JobConfig, current: JobConfig) -> list[str]:
    """One line per option that differs from the run's saved config.toml, for the resume log."""
    old = {name: value for name, _, value in iter_options(saved)}
    lines = []
    for name, _, value in iter_options(current):
        if old.get(name) == value or name == "job.description":  # it follows the other options (manager.py)
            continue
        line = f"{name} changed on resume: {old.get(name)!r} -> {value!r}"
        if name in NO_EFFECT_ON_RESUME:
            line += f"; it has no effect ({NO_EFFECT_ON_RESUME[name]})"
        lines.append(line)
    return lines


def check_data_fits_model(data_meta: Mapping[str, Any], args: ModelArgs) -> None:
    """The token files' vocabulary must fit the model's embedding (checked once the data folder is open)."""
    if data_meta["vocab_size"] > args.vocab_size:
        raise ConfigError(
            f"model.vocab_size={args.vocab_size} is smaller than the data's {data_meta['vocab_size']} tokens; "
            "unset model.vocab_size"
        )

