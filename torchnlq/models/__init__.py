"""The model package: ModelArgs, the GPT, the query registry and the named flavors."""

from .args import ModelArgs
from .gpt import GPT
from .query import QUERY_TYPES, QueryProjection, build_query, register_query
from .registry import FLAVORS, build_model, build_model_args

__all__ = [
    "FLAVORS",
    "GPT",
    "ModelArgs",
    "QUERY_TYPES",
    "QueryProjection",
    "build_model",
    "build_model_args",
    "build_query",
    "register_query",
]
