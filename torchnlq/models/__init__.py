"""The model package: ModelArgs, the decoder, the query registry, the model families and their flavors.

Importing it registers the built-in families (dense/, moe/); every model comes from :func:`build_model`.
"""

from .args import ModelArgs
from .counts import flops_per_token, num_params, param_counts
from .decoder import Decoder

# Importing the families' folders registers them and their flavors (each a relative import by name: transformers
# copies an export's modules by following "from .x import").
from .dense import DENSE_FAMILY  # noqa: F401
from .family import (FAMILIES, FLAVORS, Family, Flavor, build_model, build_model_args, get_family, register_family,
                     unregister_family)
from .moe import MOE_FAMILY  # noqa: F401
from .query import QUERY_TYPES, QueryProjection, build_query, register_query
from .runtime import FamilyRuntime

__all__ = [
    "Decoder",
    "FAMILIES",
    "FLAVORS",
    "Family",
    "FamilyRuntime",
    "Flavor",
    "ModelArgs",
    "QUERY_TYPES",
    "QueryProjection",
    "build_model",
    "build_model_args",
    "build_query",
    "flops_per_token",
    "get_family",
    "num_params",
    "param_counts",
    "register_family",
    "register_query",
    "unregister_family",
]
