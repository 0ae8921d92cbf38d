"""The optimizer: parameter groups by pattern and kind, and the registries of optimizers they are stepped by.

``optimizer.name`` names an :class:`OptimizerKind` (:data:`OPTIMIZERS`): which optimizer steps the AdamW-kind
groups and which takes the blocks' matrices by default. A group's ``optimizer`` names a :class:`GroupOptimizer`
(:data:`GROUP_OPTIMIZERS`: adamw, muon). Both registries are the one place their names are tested; the config's
choices, ``--help``, the memory estimate and the run's header read them. Groups: docs/training.md.
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchnlq.config.job_config import Optimizer, OptimizerGroup
from torchnlq.errors import ConfigError
from torchnlq.models.mup import fan_in_multipliers
from torchnlq.models.query import QueryProjection
from torchnlq.models.roles import Role, parameter_roles

#: What a group's ``kind`` can select (:func:`parameter_kinds`).
KINDS = ("hidden", "embedding", "head", "gain_bias", "query_mlp")
#: The group optimizer of the paper's groups (and the ``optimizer.name`` of the paper's runs).
ADAMW = "adamw"
#: The default groups of every run, in the paper's order (a config without groups builds its optimizer exactly).
PAPER_GROUPS = ("decay", "no_decay")


def query_branch_parameters(model: nn.Module) -> set[int]:
    """The ids of the parameters of every query's nonlinear branch (``QueryProjection.branch_matrices``)."""
    return {id(p) for module in model.modules() if isinstance(module, QueryProjection)
            for linear in module.branch_matrices().values() for p in linear.parameters()}


#: The optimizer kind of each parameter kind the model's modules declare (models/roles.py).
KIND_OF_ROLE = {"embedding": "embedding", "readout": "head", "matrix": "hidden", "vector": "gain_bias"}


def parameter_kinds(role: Role, param: torch.Tensor, branch: set[int] = frozenset()) -> set[str]:
    """The kinds of one parameter: one of hidden / embedding / head / gain_bias (by the role its module declares:
    models/roles.py; a tied head is the embedding), plus query_mlp for the matrices of a query's nonlinear branch
    (``branch``: :func:`query_branch_parameters`; W1, W2 of the paper's query)."""
    kinds = {KIND_OF_ROLE[role.kind]}
    if id(param) in branch and param.dim() >= 2:
        kinds.add("query_mlp")
    return kinds


@dataclass
class GroupPlan:
    """One parameter group as planned: its name, optimizer, LR multiplier, weight decay and parameters."""

    name: str
    optimizer: str  # its group optimizer (GROUP_OPTIMIZERS)
    weight_decay: float
    lr_multiplier: float = 1.0
    names: list[str] = field(default_factory=list)
    params: list[nn.Parameter] = field(default_factory=list)

    def describe(self) -> str:
        count = sum(p.numel() for p in self.params)
        return (f"{self.name}: {self.optimizer}, lr x{self.lr_multiplier:g}, wd {self.weight_decay:g}, "
                f"{len(self.params)} tensors, {count:,} parameters")


def _selects(entry: OptimizerGroup, name: str, role: Role, param: torch.Tensor, branch: set[int]) -> bool:
    by_name = not entry.params or any(fnmatch.fnmatchcase(name, pattern) for pattern in entry.params)
    by_kind = entry.kind is None or entry.kind in parameter_kinds(role, param, branch)
    return by_name and by_kind


def plan_groups(cfg: Optimizer, model: nn.Module) -> list[GroupPlan]:
    """The parameter groups of ``model`` under ``cfg`` (trainable parameters only; a tied weight once).

    Default groups first, in the paper's order (decay, no decay), then the group of the optimizer that takes the
    hidden matrices by default (muon's), then one per ``[[optimizer.groups]]`` entry. Empty default groups are
    dropped, but the paper's two.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    roles = parameter_roles(model)
    branch = query_branch_parameters(model)
    hidden = OPTIMIZERS[cfg.name].hidden
    decay, no_decay = PAPER_GROUPS
    defaults = {decay: GroupPlan(decay, ADAMW, cfg.weight_decay), no_decay: GroupPlan(no_decay, ADAMW, 0.0)}
    if hidden != ADAMW:
        defaults[hidden] = GroupPlan(hidden, hidden, cfg.weight_decay)
    entries = [GroupPlan(e.name, e.optimizer, cfg.weight_decay if e.weight_decay is None else e.weight_decay,
                         e.lr_multiplier) for e in cfg.groups]
    names = [entry.name for entry in cfg.groups]
    reserved = {*PAPER_GROUPS, *GROUP_OPTIMIZERS}
    taken = reserved.intersection(names) or {n for n in names if names.count(n) > 1}
    if taken:  # each group's LR is logged as lr/<name>: names must tell them apart
        raise ConfigError(f"optimizer.groups name '{sorted(taken)[0]}' is used twice (or by a default group: "
                          f"{', '.join(sorted(reserved))}); give each entry its own name")
    for entry in cfg.groups:
        if not entry.params and entry.kind is None:
            raise ConfigError(f"optimizer.groups '{entry.name}' selects nothing: give it params (name patterns) "
                              f"and/or a kind ({', '.join(KINDS)})")
    claimed: dict[str, str] = {}
    for name, param in named:
        for entry, plan in zip(cfg.groups, entries):
            if _selects(entry, name, roles[name], param, branch):
                if name in claimed:
                    raise ConfigError(f"parameter {name} is claimed by optimizer.groups '{claimed[name]}' and "
                                      f"'{entry.name}'; make their patterns or kinds disjoint")
                claimed[name] = entry.name
                plan.names.append(name)
                plan.params.append(param)
        if name not in claimed:
            kinds = parameter_kinds(roles[name], param, branch)
            plan = (defaults[no_decay] if "gain_bias" in kinds else
                    defaults[hidden] if hidden != ADAMW and "hidden" in kinds else defaults[decay])
            plan.names.append(name)
            plan.params.append(param)
    for plan in entries:
        if not plan.params:
            examples = ", ".join(n for n, _ in named if n.startswith(("tok_emb", "layers.0.attn", "layers.0.mlp")))
            raise ConfigError(f"optimizer.groups '{plan.name}' matches no parameter of this model (its names: "
                              f"{examples}, ... for each layer); fix its params or kind")
        if GROUP_OPTIMIZERS[plan.optimizer].matrices_only:
            flat = [n for n, p in zip(plan.names, plan.params) if p.dim() != 2]
            if flat:
                raise ConfigError(f"optimizer.groups '{plan.name}' gives {GROUP_OPTIMIZERS[plan.optimizer].title} "
                                  f"{flat[0]}, which is not a 2-D matrix; it orthogonalises matrices: select kind = "
                                  f"\"hidden\" or 2-D patterns")
    kept = [plan for key, plan in defaults.items() if plan.params or (key in PAPER_GROUPS and not cfg.groups)]
    plans = kept + entries
    args = getattr(model, "args", None)  # a bare module (not a Decoder) is planned under the standard one
    return width_groups(cfg, plans, model) if args is not None and args.parametrization == "mup" else plans


def width_groups(cfg: Optimizer, plans: list[GroupPlan], model: nn.Module) -> list[GroupPlan]:
    """µP (models/mup.py): each group's hidden matrices in a group of their own, its LR times the group
    optimizer's width rule (AdamW 1/m, Muon 1/sqrt(m) or 1) and its weight decay over it, so that lr x wd, the
    decay per step, stays the base width's. The names: the group's, then ``<group>_hidden`` for the matrices."""
    multipliers = fan_in_multipliers(model)
    out: list[GroupPlan] = []
    for plan in plans:
        rule = GROUP_OPTIMIZERS[plan.optimizer].width_lr
        by_factor: dict[float, GroupPlan] = {}
        for name, param in zip(plan.names, plan.params):
            if name in multipliers and rule is None:
                raise ConfigError(f"model.parametrization='mup': {GROUP_OPTIMIZERS[plan.optimizer].title} has no "
                                  f"width rule for the hidden matrices ({name}); use optimizer.name = '{ADAMW}' or "
                                  "'muon', or parametrization = 'sp'")
            factor = rule(cfg, multipliers[name]) if name in multipliers else 1.0
            if factor not in by_factor:
                suffix = "" if factor == 1.0 else "_hidden" + (str(len(by_factor)) if len(by_factor) > 1 else "")
                by_factor[factor] = GroupPlan(plan.name + suffix, plan.optimizer, plan.weight_decay / factor,
                                              plan.lr_multiplier * factor)
            by_factor[factor].names.append(name)
            by_factor[factor].params.append(param)
        out += list(by_factor.values()) or [plan]
    return out


def is_paper_split(plans: list[GroupPlan]) -> bool:
    """True when ``plans`` are the paper's two groups alone (one LR for all: no per-group LRs to log)."""
    return tuple(plan.name for plan in plans) == PAPER_GROUPS


def group_label(cfg: Optimizer, plan: GroupPlan) -> str:
    """What steps the group: its group optimizer, AdamW's groups named by the kind's optimizer (adamw8bit)."""
    return OPTIMIZERS[cfg.name].adamw_label if plan.optimizer == ADAMW else plan.optimizer


def optimizer_state_bytes(cfg: Optimizer, plans: list[GroupPlan]) -> int:
    """The optimizer state of the groups ``plans`` (the memory estimate's, from :func:`plan_groups` on meta)."""
    kind = OPTIMIZERS[cfg.name]
    return sum(GROUP_OPTIMIZERS[plan.optimizer].state_bytes(kind, p.numel()) for plan in plans for p in plan.params)


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
    """The plans' names in the order of :func:`build_optimizer`'s ``param_groups`` (by group optimizer, in
    :data:`GROUP_OPTIMIZERS` order)."""
    return [p.name for kind in GROUP_OPTIMIZERS for p in plans if p.optimizer == kind]


def _torch_groups(plans: list[GroupPlan]) -> list[dict[str, Any]]:
    groups = []
    for plan in plans:
        group: dict[str, Any] = {"params": plan.params, "weight_decay": plan.weight_decay}
        if plan.lr_multiplier != 1.0:
            group["lr_multiplier"] = plan.lr_multiplier  # read by set_lr; absent means 1 (the paper's groups)
        groups.append(group)
    return groups


def _torch_adamw(cfg: Optimizer, groups: list[dict], device_type: str) -> torch.optim.Optimizer:
    fused = cfg.fused if cfg.fused is not None else device_type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)


def _adamw8bit(cfg: Optimizer, groups: list[dict], device_type: str) -> torch.optim.Optimizer:
    if cfg.fused:
        raise ConfigError(f"optimizer.fused = true is torch's fused AdamW kernel; unset it with optimizer.name = "
                          f"{cfg.name!r}")
    from torchnlq.parallel.float8 import quiet_torchao_import

    with quiet_torchao_import():
        from torchao.optim import AdamW8bit
    # Its state subclass warns once per compile that AOT autograd's cache cannot hash it: harmless, not actionable.
    warnings.filterwarnings("ignore", message="OptimState8bit does not implement _stable_hash_for_caching")
    return AdamW8bit(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _adamw8bit_state(numel: int) -> int:
    """torchao's 8-bit AdamW: a byte per state element plus an fp32 scale per block, from 4096 elements on."""
    return 2 * (numel + 4 * math.ceil(numel / 256)) if numel >= 4096 else 8 * numel


@dataclass(frozen=True)
class OptimizerKind:
    """One ``optimizer.name``: what steps its AdamW-kind groups, and which group optimizer takes the blocks' matrices
    by default."""

    description: str
    #: The group optimizer of the hidden matrices by default (a key of GROUP_OPTIMIZERS).
    hidden: str
    #: (cfg, torch param groups, device type) -> the optimizer of the AdamW-kind groups.
    build_adamw: Callable[[Optimizer, list[dict], str], torch.optim.Optimizer]
    #: Bytes of state of its AdamW-kind groups per tensor of ``numel`` elements.
    adamw_state: Callable[[int], int]
    #: The name its AdamW-kind groups are reported under (the run header, torchnlq.json).
    adamw_label: str
    #: The optional package it needs (an extra of torchnlq's of the same name), checked before the run starts.
    package: str | None = None


@dataclass(frozen=True)
class GroupOptimizer:
    """One group optimizer (``[[optimizer.groups]] optimizer``): how it is built and what state it holds."""

    #: Its name in messages.
    title: str
    #: (cfg, kind, torch param groups, device type) -> a torch optimizer.
    build: Callable[[Optimizer, OptimizerKind, list[dict], str], torch.optim.Optimizer]
    #: (kind, numel) -> bytes of state per tensor.
    state_bytes: Callable[[OptimizerKind, int], int]
    #: Only whole 2-D matrices: no other tensors, and no FSDP shards (Muon orthogonalises the tensor it is given;
    #: under FSDP that is a shard of the matrix, another and wrong update).
    matrices_only: bool = False
    #: µP's rule: (cfg, a hidden matrix's fan-in multiplier m) -> its LR factor; None: no rule (µP refused).
    width_lr: Callable[[Optimizer, float], float] | None = None


def _muon(cfg: Optimizer, kind: OptimizerKind, groups: list[dict], device_type: str) -> torch.optim.Optimizer:
    return torch.optim.Muon(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                            nesterov=cfg.muon_nesterov, ns_steps=cfg.muon_ns_steps, adjust_lr_fn=cfg.muon_adjust_lr)


#: ``[[optimizer.groups]] optimizer``: the optimizers a group is stepped by, in the order of ``param_groups``.
GROUP_OPTIMIZERS: dict[str, GroupOptimizer] = {
    ADAMW: GroupOptimizer("AdamW", build=lambda cfg, kind, groups, device: kind.build_adamw(cfg, groups, device),
                          state_bytes=lambda kind, numel: kind.adamw_state(numel), width_lr=lambda cfg, m: 1.0 / m),
    "muon": GroupOptimizer("Muon", build=_muon, state_bytes=lambda kind, numel: 4 * numel, matrices_only=True,
                           width_lr=lambda cfg, m: _muon_width_lr(cfg, m)),
}


def _muon_width_lr(cfg: Optimizer, m: float) -> float:
    """Muon under µP (the spectral condition, Yang, Simon & Bernstein: a hidden update's spectral norm stays
    Θ(1)): its orthogonalised update has spectral norm 1 times the adjust_lr scale; match_rms_adamw's
    0.2·sqrt(max(rows, cols)) grows as sqrt(m), so the LR falls as 1/sqrt(m); the original sqrt(max(1, rows/cols))
    does not grow with a hidden matrix's width, so the LR stays."""
    return 1.0 / math.sqrt(m) if cfg.muon_adjust_lr == "match_rms_adamw" else 1.0
#: ``optimizer.name``.
OPTIMIZERS: dict[str, OptimizerKind] = {
    ADAMW: OptimizerKind("torch's AdamW (fused on CUDA by default)", ADAMW, _torch_adamw, lambda n: 8 * n, ADAMW),
    "adamw8bit": OptimizerKind("torchao's 8-bit AdamW states (~2 bytes per parameter instead of 8)", ADAMW,
                               _adamw8bit, _adamw8bit_state, "adamw8bit", package="torchao"),
    "muon": OptimizerKind("torch's Muon for the blocks' 2-D matrices, AdamW for embeddings, head, gains and biases "
                          "(modded-nanogpt's split)", "muon", _torch_adamw, lambda n: 8 * n, ADAMW),
}


def build_optimizer(cfg: Optimizer, model: nn.Module, device_type: str,
                    plans: list[GroupPlan] | None = None) -> torch.optim.Optimizer | OptimizerSet:
    """The optimizer over ``plans`` (default :func:`plan_groups`): one torch optimizer per group optimizer in use
    (:class:`OptimizerSet` when there are several: Muon for its groups, AdamW for the rest)."""
    plans = plan_groups(cfg, model) if plans is None else plans
    kind = OPTIMIZERS[cfg.name]
    sharded = [(plan, name) for plan in plans if GROUP_OPTIMIZERS[plan.optimizer].matrices_only
               for name, p in zip(plan.names, plan.params) if _is_sharded(p)]
    if sharded:  # refused rather than silently computed (GroupOptimizer.matrices_only)
        plan, name = sharded[0]
        raise ConfigError(f"{GROUP_OPTIMIZERS[plan.optimizer].title} cannot orthogonalise FSDP-sharded matrices "
                          f"({name} is a shard): train "
                          f"it on one process (or replicated: parallelism.dp_shard = 1), or use optimizer.name = "
                          f"'{ADAMW}'")
    optimizers = [GROUP_OPTIMIZERS[name].build(cfg, kind, _torch_groups(used), device_type)
                  for name in GROUP_OPTIMIZERS if (used := [p for p in plans if p.optimizer == name])]
    return optimizers[0] if len(optimizers) == 1 else OptimizerSet(optimizers)


def _is_sharded(param: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return False
    mesh = param.device_mesh
    return any(isinstance(p, Shard) and mesh.size(dim) > 1 for dim, p in enumerate(param.placements))


def set_lr(optimizer: torch.optim.Optimizer | OptimizerSet, lr: float) -> None:
    """Set every parameter group's learning rate to ``lr`` times its multiplier (torchao's tensor LR in place)."""
    for group in optimizer.param_groups:
        value = lr * group.get("lr_multiplier", 1.0)
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value
