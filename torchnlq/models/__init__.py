"""The model package: ModelArgs, the GPT, the query registry and the named flavors."""

from torchnlq.models.args import ModelArgs
from torchnlq.models.gpt import GPT
from torchnlq.models.query import (
    QUERY_TYPES,
    QueryProjection,
    build_query,
    register_query,
)
from torchnlq.models.registry import FLAVORS, build_model, build_model_args

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
