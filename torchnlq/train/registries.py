"""The allowed names of every registry-backed option (``option(registry=...)``), read from the registries of the
model package and of the components (optimizers, LR schedules, activation checkpointing)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator, Sequence
from typing import Any

from torchnlq.config.job_config import JobConfig, entry_type
from torchnlq.config.render import iter_options
from torchnlq.models.family import FAMILIES, FLAVORS
from torchnlq.models.query import ACTIVATIONS, QUERY_NORMS, QUERY_TYPES
from torchnlq.parallel.activation_checkpoint import MODES
from torchnlq.train.lr_schedule import DECAY_SHAPES, SCHEDULES
from torchnlq.train.optim import GROUP_OPTIMIZERS, KINDS, OPTIMIZERS


def registry_choices() -> dict[str, list[str]]:
    """Allowed names of every registry-backed option (``option(registry=...)``), read from the registries."""
    registries: dict[str, Sequence[str]] = {
        "query types": list(QUERY_TYPES),
        "activations": list(ACTIVATIONS),
        "norms": list(QUERY_NORMS),
        "flavors": list(FLAVORS),
        "families": list(FAMILIES),
        "optimizers": list(OPTIMIZERS),
        "group optimizers": list(GROUP_OPTIMIZERS),
        "parameter kinds": list(KINDS),
        "lr schedules": list(SCHEDULES),
        "decay shapes": list(DECAY_SHAPES),
        "activation checkpointing": list(MODES),
    }
    choices = {}
    for name, f, _ in registry_fields():
        choices[name] = list(registries[f.metadata["registry"]])
    return choices


def registry_fields(cfg: JobConfig | None = None) -> Iterator[tuple[str, dataclasses.Field, list[Any]]]:
    """(dotted name, field, the values ``cfg`` gives it) of every registry-backed option, the keys of
    ``[[section.key]]`` entries included (one value per entry)."""
    cfg = cfg or JobConfig()
    for name, f, value in iter_options(cfg):
        if f.metadata.get("registry") is not None:
            yield name, f, [value]
        head, key = name.rsplit(".", 1)
        item = entry_type(operator.attrgetter(head)(cfg), key)
        for field in dataclasses.fields(item) if item is not None else ():
            if field.metadata.get("registry") is not None:
                yield f"{name}.{field.name}", field, [getattr(entry, field.name) for entry in value]
