"""The model package: ModelArgs, the GPT, the query and block registries, the named flavors and build_model."""

from .args import ModelArgs
from .gpt import GPT
from .query import QUERY_TYPES, QueryProjection, build_query, register_query
from .registry import BLOCKS, FLAVORS, build_model, build_model_args, register_block

__all__ = [
    "BLOCKS",
    "FLAVORS",
    "GPT",
    "ModelArgs",
    "QUERY_TYPES",
    "QueryProjection",
    "build_model",
    "build_model_args",
    "build_query",
    "register_block",
    "register_query",
]
