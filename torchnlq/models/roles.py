"""Parameter roles: what each parameter of a model is, declared by the modules that hold it, not read from names.

A role is a *component* (where the parameter computes: the summary's parameter split) and a *kind* (what it is to
an optimizer or an initialisation: an embedding table, the readout, a matrix, a vector such as a gain or a bias).
The summary (train/summary.py), the optimizer's group kinds (train/optim.py) and the initialisations read roles,
so a family's block whose feed-forward is called ``ffn`` is counted and optimised as one called ``mlp``.

How a module declares them (both optional class attributes of any ``nn.Module``):

- ``component``: the component of every parameter below it, unless a module further down says another;
- ``child_components``: the components of some of its direct children or own parameters, by attribute name
  (Attention: its ``query`` is ``attention_query``, its ``q_norm`` and ``k_norm`` are ``norms``).

The deepest declaration on a parameter's path wins; with none, a norm's parameters are ``norms``, an embedding
table's ``embeddings``, and anything else ``other``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch.nn as nn

#: The components, in the summary's order (``params_<component>`` lines).
COMPONENTS = ("embeddings", "attention_query", "norms", "attention_kv_out", "experts", "router", "mlp", "head",
              "other")
#: The kinds: ``embedding`` (a lookup table), ``readout`` (the LM head's own matrix), ``matrix`` (every other tensor
#: of 2 or more dimensions: hidden and expert weights), ``vector`` (gains, biases: fewer than 2 dimensions).
KINDS = ("embedding", "readout", "matrix", "vector")
#: Modules whose parameters are norms' when nothing above declares otherwise.
NORM_TYPES: tuple[type, ...] = (nn.LayerNorm, nn.RMSNorm)


@dataclass(frozen=True)
class Role:
    """The role of one parameter: its component (:data:`COMPONENTS`) and kind (:data:`KINDS`)."""

    component: str
    kind: str


def parameter_roles(model: nn.Module) -> dict[str, Role]:
    """The role of each parameter of ``model`` by its ``named_parameters`` name (a tied weight once, under its first
    name: the token embedding's)."""
    roles: dict[str, Role] = {}
    seen: set[int] = set()

    def walk(module: nn.Module, prefix: str, inherited: str | None) -> None:
        declared = getattr(module, "component", None) or inherited
        children: Mapping[str, str] = getattr(module, "child_components", {})
        for name, param in module.named_parameters(recurse=False):
            if param is None or id(param) in seen:
                continue
            seen.add(id(param))
            component = children.get(name) or declared or _by_type(module)
            roles[prefix + name] = Role(component, _kind(module, component, param))
        for name, child in module.named_children():
            walk(child, f"{prefix}{name}.", children.get(name) or declared)

    walk(model, "", None)
    return roles


def _by_type(module: nn.Module) -> str:
    if isinstance(module, NORM_TYPES):
        return "norms"
    if isinstance(module, nn.Embedding):
        return "embeddings"
    return "other"


def _kind(module: nn.Module, component: str, param: nn.Parameter) -> str:
    if isinstance(module, nn.Embedding):
        return "embedding"
    if param.dim() < 2:
        return "vector"
    return "readout" if component == "head" else "matrix"
