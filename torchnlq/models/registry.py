"""Named model flavors, block families, and the one constructor of a model.

Adding a flavor is one entry in :data:`FLAVORS`. A flavor fixes the sizes;
every non-None field of the ``[model]`` section overrides it. Adding a block family is one
``nn.Module`` class with ``@register_block(name)`` (``model.block = name``). Every model the library
builds comes from :func:`build_model`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch.nn as nn

from .args import ModelArgs
from .config import PRENORM, BlockOptions, Model
from .errors import ConfigError, unknown_choice
from .gpt import GPT, Block


@dataclass(frozen=True)
class Flavor:
    """The sizes a flavor fixes. The MLP is a ratio of dim, so overriding ``dim`` scales it."""

    n_layers: int
    dim: int
    n_heads: int
    mlp_ratio: float = 4.0
    max_seq_len: int = 1024
    #: Key/value heads (GQA); None: one per query head.
    n_kv_heads: int | None = None


FLAVORS: dict[str, Flavor] = {
    # Tiny: trains on a CPU in seconds.
    "debug": Flavor(n_layers=2, dim=128, n_heads=4, max_seq_len=256),
    # GPT-2 small, the paper's baseline (124M with the tied 50304-token embedding).
    "gpt_small": Flavor(n_layers=12, dim=768, n_heads=12),
    # The paper's bigger-MLP control: 4.75 * 768 = 3648 hidden units.
    "gpt_small_mlp4_75": Flavor(n_layers=12, dim=768, n_heads=12, mlp_ratio=4.75),
    "gpt_medium": Flavor(n_layers=24, dim=1024, n_heads=16),
    "gpt_large": Flavor(n_layers=24, dim=1536, n_heads=16),
    # Llama-style shapes (the block options come from the config: train_configs/llama_*.toml).
    # torchtitan's llama3 debug model: dim 256, 6 layers, 16 heads (SwiGLU hidden 768).
    "llama_debug": Flavor(n_layers=6, dim=256, n_heads=16, max_seq_len=256),
    # GPT-2 small's 12 x 768 with 12 heads; SwiGLU hidden int(2/3 * 4.0625 * 768) = 2080 (mlp_multiple_of 32)
    # matches GPT-2 small's parameter count without its 1024 x 768 position table (docs/models.md).
    "llama_gpt_small": Flavor(n_layers=12, dim=768, n_heads=12, mlp_ratio=4.0625),
    # Llama 3.2 1B: 16 x 2048, 32 heads, 8 KV heads, SwiGLU hidden int(2/3 * 6 * 2048) = 8192.
    "llama3_1b": Flavor(n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, mlp_ratio=6.0, max_seq_len=2048),
}


def mlp_width(cfg: Model, flavor: Flavor, dim: int) -> int:
    """The MLP's hidden size: ``mlp_hidden``, else round(ratio · dim); for SwiGLU Llama's rule,
    int(2/3 · ratio · dim) rounded up to a multiple of ``mlp_multiple_of`` (the gated MLP's three
    matrices then hold about the parameters of the GELU MLP's two)."""
    if cfg.mlp_hidden is not None:
        return cfg.mlp_hidden
    ratio = cfg.mlp_ratio if cfg.mlp_ratio is not None else flavor.mlp_ratio
    if cfg.mlp_activation == "swiglu":
        multiple = cfg.mlp_multiple_of
        hidden = multiple * -(-int(2 * ratio * dim / 3) // multiple)
    else:
        hidden = round(ratio * dim)
    if hidden < 1:
        raise ConfigError(f"model.mlp_ratio={ratio} gives an MLP of {hidden} units at dim={dim}; raise it")
    return hidden


#: The ``[model]`` fields that pass to ModelArgs unchanged: the block options (models/config.py: BlockOptions).
COPIED_FIELDS = tuple(f.name for f in dataclasses.fields(BlockOptions))


def build_model_args(cfg: Model, vocab_size: int) -> ModelArgs:
    """Resolve the ``[model]`` section into ModelArgs: flavor sizes, then overrides, then validation.

    ``vocab_size`` is the data side's vocabulary (:func:`torchnlq.data.tokenizer.padded_vocab_size`);
    a set ``cfg.vocab_size`` wins over it. The MLP width is :func:`mlp_width` of the final dim. Raises ConfigError.
    """
    if cfg.flavor not in FLAVORS:
        raise unknown_choice("model.flavor", cfg.flavor, list(FLAVORS))
    flavor = FLAVORS[cfg.flavor]
    n_layers = cfg.n_layers if cfg.n_layers is not None else flavor.n_layers
    dim = cfg.dim if cfg.dim is not None else flavor.dim
    n_heads = cfg.n_heads if cfg.n_heads is not None else flavor.n_heads
    mlp_hidden = mlp_width(cfg, flavor, dim)
    # A flavor's KV heads hold at its own head count only: overriding n_heads alone means multi-head.
    n_kv_heads = cfg.n_kv_heads if cfg.n_kv_heads is not None else (
        flavor.n_kv_heads if cfg.n_heads is None else None)
    # ModelArgs.__post_init__ derives head_dim and validates the rest (n_heads | dim, n_kv_heads, query type...).
    return ModelArgs(
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        mlp_hidden=mlp_hidden,
        vocab_size=cfg.vocab_size if cfg.vocab_size is not None else vocab_size,
        max_seq_len=cfg.max_seq_len if cfg.max_seq_len is not None else flavor.max_seq_len,
        **{name: getattr(cfg, name) for name in COPIED_FIELDS},
        query=copy.deepcopy(cfg.query),  # the model must not change if the config object is edited later
    )


#: ``model.block``: the class of every transformer block, by name. A family is built as ``cls(args, layer)``
#: and provides ``init_weights(init_std, residual_std)`` (draw every parameter from the global RNG, in a fixed
#: order) and ``forward(x, rope, cache=None, mask=None)`` as :class:`~torchnlq.models.gpt.Block` does.
BLOCKS: dict[str, type[nn.Module]] = {PRENORM: Block}


def register_block(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: make an ``nn.Module`` block class selectable as ``model.block = name``."""

    def decorator(cls: type[nn.Module]) -> type[nn.Module]:
        if name in BLOCKS:
            raise ValueError(f"block family {name!r} is already registered by {BLOCKS[name].__name__}")
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"@register_block({name!r}) must decorate an nn.Module subclass")
        BLOCKS[name] = cls
        return cls

    return decorator


def block_class(args: ModelArgs) -> type[nn.Module]:
    """The registered class of ``args.block``; unknown names raise ConfigError with a did-you-mean."""
    if args.block not in BLOCKS:
        error = unknown_choice("model.block", args.block, list(BLOCKS))
        raise ConfigError(f"{error}; a family a plugin module registers needs that module imported first "
                          "([job] plugins in a config, --plugins for the tools)")
    return BLOCKS[args.block]


def build_model(args: ModelArgs) -> GPT:
    """The one constructor of a model: a GPT of ``args.block``'s blocks on the current default device
    (``torch.device("meta")`` for a shape-only model, initialised by the caller).

    A family other than the built-in one must have the parameters ``args.num_params()`` counts (the pre-norm
    block's): parameter matching, MFU and the scaling fits read that count. Raises ConfigError.
    """
    model = GPT(args, block_class(args))
    if args.block != PRENORM and model.num_params() != args.num_params():
        raise ConfigError(
            f"model.block={args.block!r} builds {model.num_params():,} parameters where the pre-norm block has "
            f"{args.num_params():,}; a block family keeps the pre-norm block's parameters (their counts set "
            "parameter matching, MFU and the scaling fits): change the family's layers"
        )
    return model
