"""The dense family: GPT-2, Llama and Qwen3 blocks (one pre-norm block by its options), their flavors, and the
standard Hugging Face architectures that compute them."""

from __future__ import annotations

from ..config import DENSE
from ..family import FLAVORS, Family, register_family
from .block import Block
from .flavors import DENSE_FLAVORS
from .hf import GPT2, LLAMA, QWEN3
from .paper_init import init_like_paper

DENSE_FAMILY = register_family(Family(
    name=DENSE, block=Block, description="pre-norm attention + MLP blocks (GPT-2, Llama, Qwen3 by their options)",
    hf_architectures=(GPT2, LLAMA, QWEN3), init_schemes={"paper": init_like_paper},
))
FLAVORS.update(DENSE_FLAVORS)

__all__ = ["Block", "DENSE_FAMILY"]
