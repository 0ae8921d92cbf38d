"""The allowed names of every registry-backed option (``option(registry=...)``), read from the model registries."""

from __future__ import annotations

from collections.abc import Sequence

from torchnlq.config.job_config import JobConfig
from torchnlq.config.render import iter_options
from torchnlq.models.query import ACTIVATIONS, QUERY_NORMS, QUERY_TYPES
from torchnlq.models.registry import BLOCKS, FLAVORS


def registry_choices() -> dict[str, list[str]]:
    """Allowed names of every registry-backed option (``option(registry=...)``), read from the registries."""
    registries: dict[str, Sequence[str]] = {
        "query types": list(QUERY_TYPES),
        "activations": list(ACTIVATIONS),
        "norms": list(QUERY_NORMS),
        "flavors": list(FLAVORS),
        "blocks": list(BLOCKS),
    }
    choices = {}
    for name, f, _ in iter_options(JobConfig()):
        registry = f.metadata.get("registry")
        if registry is not None:
            choices[name] = list(registries[registry])
    return choices
