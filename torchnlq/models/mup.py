"""µP, the Maximal Update Parametrization (Yang et al., Tensor Programs IV/V), for every family and query type.

``model.parametrization = "mup"`` with ``model.mup_base_width`` (the width where µP is the standard model). The
model is compared with itself at the base width (:func:`base_model_args`: every width-like size divided by
m = dim / base), parameter by parameter, as microsoft's ``mup`` package compares "base shapes": a tensor whose
last two dimensions both grow with the width is a *hidden matrix* (its fan-in multiplier is how much its fan-in
grew); the others are *vector-like* (embedding tables, gains, biases) or *readouts* (a matrix that maps the width
to a fixed size: the LM head, an MoE's router). Then (docs/mup.md has the derivation):

- init: a hidden matrix is drawn as the standard model draws it, times 1/sqrt(fan-in multiplier);
- forward: the embedding times ``mup_input_multiplier``, the logits times ``mup_output_multiplier / m``, a
  router's logits times 1/m, attention scores at sqrt(base head_dim) / head_dim instead of 1/sqrt(head_dim);
- optimizer (train/optim.py reads :func:`fan_in_multipliers`): a hidden matrix's LR over its multiplier (AdamW)
  or over its square root (Muon's match_rms_adamw scale; Keller Jordan's original scale needs none).

At the base width every multiplier is 1, and the model is the standard one bit for bit. Roles come from what the
modules declare (models/roles.py): a parameter without one, or a readout that is neither the head nor a router,
is refused, as is a base width that does not divide the width-like sizes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import fields
from fractions import Fraction

import torch
import torch.nn as nn

from .args import ModelArgs
from .errors import ConfigError
from .roles import parameter_roles
from .sections import sections_read_by

#: The readouts µP knows how to scale (their forward carries the 1/m): the LM head and an MoE's router.
READOUT_COMPONENTS = ("head", "router")
_CACHE: dict[str, dict[str, float]] = {}


def base_model_args(args: ModelArgs) -> ModelArgs:
    """``args`` at its base width under the standard parametrization: dim, head_dim, mlp_hidden and every
    width-like option of its family's sections (``option(width=True)``) divided by m. ConfigError when one of
    them does not divide."""
    base, m = args.mup_base_width, Fraction(args.dim, args.mup_base_width)

    def scaled(key: str, value: int) -> int:
        at_base = Fraction(value) / m
        if at_base.denominator != 1:
            raise ConfigError(
                f"model.mup_base_width={base}: {key}={value} at model.dim={args.dim} would be {float(at_base):g} at "
                f"the base width, not a whole number; choose a base width by which dim, head_dim and the MLP's "
                f"width divide alike (e.g. dim / 2, dim / 4)")
        return int(at_base)

    sections = {}
    for name in sections_read_by(args.family):
        section = getattr(args, name)
        changes = {f.name: scaled(f"model.{name}.{f.name}", getattr(section, f.name)) for f in fields(section)
                   if f.metadata.get("width") and getattr(section, f.name) is not None}
        sections[name] = dataclasses.replace(section, **changes)
    return dataclasses.replace(
        args, dim=base, head_dim=scaled("head_dim", args.head_dim), mlp_hidden=scaled("mlp_hidden", args.mlp_hidden),
        parametrization="sp", mup_base_width=None, **sections)


def fan_in_multipliers(model: nn.Module) -> dict[str, float]:
    """Each hidden matrix of ``model`` (a Decoder, on any device), by parameter name: how much its fan-in grew from
    the base width (1 at the base width). Vector-like parameters and readouts are not in it. Raises ConfigError for
    a parameter µP has no rule for. Cached by the model's args and classes."""
    key = json.dumps(dataclasses.asdict(model.args), sort_keys=True, default=str) + repr(
        sorted({type(m).__qualname__ for m in model.modules()}))
    if key not in _CACHE:
        if len(_CACHE) > 64:
            _CACHE.clear()
        with torch.device("meta"):
            base = model.at_base_width()  # the same family's Decoder at mup_base_width (models/decoder.py)
        _CACHE[key] = _classify(model, base)
    return _CACHE[key]


def _classify(model: nn.Module, base: nn.Module) -> dict[str, float]:
    roles, base_shapes = parameter_roles(model), {n: p.shape for n, p in base.named_parameters()}
    check_query_roles(model)
    hidden: dict[str, float] = {}
    for name, param in model.named_parameters():
        role, shape = roles[name], base_shapes.get(name)
        if role.component == "other":
            raise ConfigError(f"model.parametrization='mup' needs every parameter's role: {name} has none (its module "
                              "declares no component: models/roles.py, docs/extending.md); declare it, or use 'sp'")
        if shape is None or len(shape) != param.dim():
            raise ConfigError(f"model.parametrization='mup': {name} has no counterpart at the base width; the "
                              "model's structure must not change with its width")
        if param.dim() < 2 or role.kind in ("embedding", "vector"):
            continue
        grows = [param.shape[i] != shape[i] for i in (-2, -1)]
        if all(grows):
            hidden[name] = param.shape[-1] / shape[-1]
        elif grows[1] and role.component not in READOUT_COMPONENTS:
            raise ConfigError(f"model.parametrization='mup': {name} maps the width to a fixed size (a readout) but is "
                              f"neither the LM head nor a router, whose forward µP scales; use 'sp' for this family")
    return hidden


def check_query_roles(model: nn.Module) -> None:
    """Every matrix of every query is one it declares (``QueryProjection.matrices``): µP scales what is declared."""
    from .query import QueryProjection

    for module in model.modules():
        if isinstance(module, QueryProjection):
            declared = {id(p) for linear in module.matrices().values() for p in linear.parameters()}
            stray = [n for n, p in module.named_parameters() if p.dim() >= 2 and id(p) not in declared]
            if stray:
                raise ConfigError(
                    f"model.parametrization='mup': query type {module.type_name!r} declares no role for its "
                    f"{', '.join(stray)} (QueryProjection.matrices() lists its matrices: docs/extending.md); "
                    "declare them, or use parametrization = 'sp'")


@torch.no_grad()
def scale_initial_weights(model: nn.Module) -> None:
    """After the standard init: each hidden matrix times 1/sqrt(its fan-in multiplier) (its draws unchanged)."""
    for name, multiplier in fan_in_multipliers(model).items():
        if multiplier != 1.0:
            model.get_parameter(name).mul_(1.0 / math.sqrt(multiplier))


def attention_scale(args: ModelArgs) -> float | None:
    """The attention's score scale under µP, sqrt(base head_dim) / head_dim (1/sqrt(head_dim) at the base head
    width); None (SDPA's default) under the standard parametrization."""
    if args.parametrization != "mup":
        return None
    base_head_dim = args.head_dim / args.width_multiplier
    return math.sqrt(base_head_dim) / args.head_dim

