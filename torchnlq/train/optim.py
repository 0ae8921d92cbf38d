"""The optimizer: parameter groups by pattern and kind, AdamW / AdamW8bit / Muon, and the LR schedules.

Groups: docs/training.md; ``adamw8bit`` is torchao's ``AdamW8bit`` (~2 bytes of state per parameter instead of 8).
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchnlq.config.job_config import LRSchedule, Optimizer, OptimizerGroup
from torchnlq.errors import ConfigError
from torchnlq.models.query import QueryProjection

#: What a group's ``kind`` can select (:func:`parameter_kinds`).
KINDS = ("hidden", "embedding", "head", "gain_bias", "query_mlp")


def query_branch_parameters(model: nn.Module) -> set[int]:
    """The ids of the parameters of every query's nonlinear branch (``QueryProjection.branch_matrices``)."""
    return {id(p) for module in model.modules() if isinstance(module, QueryProjection)
            for linear in module.branch_matrices().values() for p in linear.parameters()}


def parameter_kinds(name: str, param: torch.Tensor, branch: set[int] = frozenset()) -> set[str]:
    """The kinds of one parameter: one of hidden / embedding / head / gain_bias, plus query_mlp for the matrices of a
    query's nonlinear branch (``branch``: :func:`query_branch_parameters`; W1, W2 of the paper's query)."""
    if param.dim() < 2:
        kinds = {"gain_bias"}
    elif name in ("tok_emb.weight", "pos_emb.weight"):
        kinds = {"embedding"}  # a tied head is this tensor
    elif name == "lm_head.weight":
        kinds = {"head"}
    else:
        kinds = {"hidden"}
    if id(param) in branch and param.dim() >= 2:
        kinds.add("query_mlp")
    return kinds


@dataclass
class GroupPlan:
    """One parameter group as planned: its name, optimizer, LR multiplier, weight decay and parameters."""

    name: str
    optimizer: str  # "adamw" (or adamw8bit's AdamW8bit) or "muon"
    weight_decay: float
    lr_multiplier: float = 1.0
    names: list[str] = field(default_factory=list)
    params: list[nn.Parameter] = field(default_factory=list)

    def describe(self) -> str:
        count = sum(p.numel() for p in self.params)
        return (f"{self.name}: {self.optimizer}, lr x{self.lr_multiplier:g}, wd {self.weight_decay:g}, "
                f"{len(self.params)} tensors, {count:,} parameters")


def _selects(entry: OptimizerGroup, name: str, param: torch.Tensor, branch: set[int]) -> bool:
    by_name = not entry.params or any(fnmatch.fnmatchcase(name, pattern) for pattern in entry.params)
    by_kind = entry.kind is None or entry.kind in parameter_kinds(name, param, branch)
    return by_name and by_kind


def plan_groups(cfg: Optimizer, model: nn.Module) -> list[GroupPlan]:
    """The parameter groups of ``model`` under ``cfg`` (trainable parameters only; a tied weight once).

    Default groups first, in the paper's order (decay, no decay: a config without groups builds its optimizer
    exactly), then one per ``[[optimizer.groups]]`` entry. Empty default groups are dropped, but the paper's two.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    branch = query_branch_parameters(model)
    default_hidden = "muon" if cfg.name == "muon" else "adamw"
    defaults = {
        "decay": GroupPlan("decay", "adamw", cfg.weight_decay),
        "no_decay": GroupPlan("no_decay", "adamw", 0.0),
    }
    if default_hidden == "muon":
        defaults["muon"] = GroupPlan("muon", "muon", cfg.weight_decay)
    entries = [GroupPlan(e.name, e.optimizer, cfg.weight_decay if e.weight_decay is None else e.weight_decay,
                         e.lr_multiplier) for e in cfg.groups]
    names = [entry.name for entry in cfg.groups]
    taken = {"decay", "no_decay", "muon"}.intersection(names) or {n for n in names if names.count(n) > 1}
    if taken:  # each group's LR is logged as lr/<name>: names must tell them apart
        raise ConfigError(f"optimizer.groups name '{sorted(taken)[0]}' is used twice (or by a default group: decay, "
                          "no_decay, muon); give each entry its own name")
    for entry in cfg.groups:
        if not entry.params and entry.kind is None:
            raise ConfigError(f"optimizer.groups '{entry.name}' selects nothing: give it params (name patterns) "
                              f"and/or a kind ({', '.join(KINDS)})")
    claimed: dict[str, str] = {}
    for name, param in named:
        for entry, plan in zip(cfg.groups, entries):
            if _selects(entry, name, param, branch):
                if name in claimed:
                    raise ConfigError(f"parameter {name} is claimed by optimizer.groups '{claimed[name]}' and "
                                      f"'{entry.name}'; make their patterns or kinds disjoint")
                claimed[name] = entry.name
                plan.names.append(name)
                plan.params.append(param)
        if name not in claimed:
            kinds = parameter_kinds(name, param, branch)
            plan = (defaults["no_decay"] if "gain_bias" in kinds else
                    defaults["muon"] if default_hidden == "muon" and "hidden" in kinds else defaults["decay"])
            plan.names.append(name)
            plan.params.append(param)
    for plan in entries:
        if not plan.params:
            examples = ", ".join(n for n, _ in named if n.startswith(("tok_emb", "layers.0.attn", "layers.0.mlp")))
            raise ConfigError(f"optimizer.groups '{plan.name}' matches no parameter of this model (its names: "
                              f"{examples}, ... for each layer); fix its params or kind")
        if plan.optimizer == "muon":
            flat = [n for n, p in zip(plan.names, plan.params) if p.dim() != 2]
            if flat:
                raise ConfigError(f"optimizer.groups '{plan.name}' gives Muon {flat[0]}, which is not a 2-D matrix; "
                                  "Muon orthogonalises matrices: select kind = \"hidden\" or 2-D patterns")
    kept = [plan for key, plan in defaults.items() if plan.params or (key != "muon" and not cfg.groups)]
    return kept + entries


class OptimizerSet:
    """Several torch optimizers stepped as one (Muon for the hidden matrices, AdamW for the rest).

    Iterable: DCP's ``get_state_dict(model, optimizers)`` keeps them all in the checkpoint's optimizer entry.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's groups, in order (the LR is set through them)."""
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)


def group_names(plans: list[GroupPlan]) -> list[str]:
    """The plans' names in the order of :func:`build_optimizer`'s ``param_groups`` (AdamW's, then Muon's)."""
    return [p.name for p in plans if p.optimizer == "adamw"] + [p.name for p in plans if p.optimizer == "muon"]


def _torch_groups(plans: list[GroupPlan]) -> list[dict[str, Any]]:
    groups = []
    for plan in plans:
        group: dict[str, Any] = {"params": plan.params, "weight_decay": plan.weight_decay}
        if plan.lr_multiplier != 1.0:
            group["lr_multiplier"] = plan.lr_multiplier  # read by set_lr; absent means 1 (the paper's groups)
        groups.append(group)
    return groups


def _adamw(cfg: Optimizer, groups: list[dict], device_type: str) -> torch.optim.Optimizer:
    if cfg.name == "adamw8bit":
        if cfg.fused:
            raise ConfigError("optimizer.fused = true is torch's fused AdamW kernel; unset it with optimizer.name = 'adamw8bit'")
        from torchnlq.parallel.float8 import quiet_torchao_import

        with quiet_torchao_import():
            from torchao.optim import AdamW8bit
        # Its state subclass warns once per compile that AOT autograd's cache cannot hash it: harmless, not actionable.
        warnings.filterwarnings("ignore", message="OptimState8bit does not implement _stable_hash_for_caching")
        return AdamW8bit(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
    fused = cfg.fused if cfg.fused is not None else device_type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)


def build_optimizer(cfg: Optimizer, model: nn.Module, device_type: str,
                    plans: list[GroupPlan] | None = None) -> torch.optim.Optimizer | OptimizerSet:
    """The optimizer over ``plans`` (default :func:`plan_groups`): AdamW (fused on CUDA by default) or AdamW8bit;
    with a Muon group, torch's Muon for it and AdamW for the rest (:class:`OptimizerSet`)."""
    plans = plan_groups(cfg, model) if plans is None else plans
    adam_plans = [p for p in plans if p.optimizer == "adamw"]
    muon_plans = [p for p in plans if p.optimizer == "muon"]
    if not muon_plans:
        return _adamw(cfg, _torch_groups(plans), device_type)
    sharded = [plan.names[i] for plan in muon_plans for i, p in enumerate(plan.params) if _is_sharded(p)]
    if sharded:
        # torch's Muon orthogonalises the tensor it is given: under FSDP that is a shard of the matrix, not
        # the matrix, which is another (wrong) update. Refused rather than silently computed.
        raise ConfigError(f"Muon cannot orthogonalise FSDP-sharded matrices ({sharded[0]} is a shard): train Muon "
                          "on one process (or replicated: parallelism.dp_shard = 1), or use optimizer.name = 'adamw'")
    muon = torch.optim.Muon(
        _torch_groups(muon_plans), lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
        nesterov=cfg.muon_nesterov, ns_steps=cfg.muon_ns_steps, adjust_lr_fn=cfg.muon_adjust_lr,
    )
    return OptimizerSet([_adamw(cfg, _torch_groups(adam_plans), device_type), muon] if adam_plans else [muon])


def _is_sharded(param: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return False
    mesh = param.device_mesh
    return any(isinstance(p, Shard) and mesh.size(dim) > 1 for dim, p in enumerate(param.placements))


def lr_at(it: int, peak_lr: float, cfg: LRSchedule, total_steps: int) -> float:
    """Learning rate of iteration ``it`` (0-based), before a group's multiplier.

    Both warm up linearly (nanoGPT's ``peak·(it + 1)/(warmup + 1)``) and reach ``min_lr`` at ``decay_steps``
    (unset: the run's steps); ``cosine`` (the paper's) decays from the warmup's end, ``wsd`` over its last steps.
    """
    warmup = cfg.warmup_steps
    end = cfg.decay_steps if cfg.decay_steps is not None else total_steps
    if it < warmup:
        return peak_lr * (it + 1) / (warmup + 1)
    if it >= end or end <= warmup:
        return cfg.min_lr
    if cfg.name == "wsd":
        start = end - decay_length(cfg, end)
        if it < start:
            return peak_lr
        progress = (it - start) / (end - start)
        if cfg.decay_shape == "linear":
            return peak_lr - (peak_lr - cfg.min_lr) * progress
        if cfg.decay_shape == "1-sqrt":
            return cfg.min_lr + (peak_lr - cfg.min_lr) * (1.0 - math.sqrt(progress))
    else:
        progress = (it - warmup) / (end - warmup)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak_lr - cfg.min_lr)


def decay_length(cfg: LRSchedule, end: int) -> int:
    """Steps of the WSD decay tail: ``decay_length``, else ``decay_fraction`` of the schedule's end (at least 1)."""
    if cfg.decay_length is not None:
        return cfg.decay_length
    return max(1, round(cfg.decay_fraction * end))


def set_lr(optimizer: torch.optim.Optimizer | OptimizerSet, lr: float) -> None:
    """Set every parameter group's learning rate to ``lr`` times its multiplier (torchao's tensor LR in place)."""
    for group in optimizer.param_groups:
        value = lr * group.get("lr_multiplier", 1.0)
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value
