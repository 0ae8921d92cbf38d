"""Named model flavors and the builders from the ``[model]`` config section.

Adding a flavor is one entry in :data:`FLAVORS`. A flavor fixes the sizes;
every non-None field of the ``[model]`` section overrides it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from .args import ModelArgs, divides_message
from .config import Model
from .errors import ConfigError, unknown_choice
from .gpt import GPT


@dataclass(frozen=True)
class Flavor:
    """The sizes a flavor fixes. The MLP is a ratio of dim, so overriding ``dim`` scales it."""

    n_layers: int
    dim: int
    n_heads: int
    mlp_ratio: float = 4.0
    max_seq_len: int = 1024


FLAVORS: dict[str, Flavor] = {
    # Tiny: trains on a CPU in seconds.
    "debug": Flavor(n_layers=2, dim=128, n_heads=4, max_seq_len=256),
    # GPT-2 small, the paper's baseline (124M with the tied 50304-token embedding).
    "gpt_small": Flavor(n_layers=12, dim=768, n_heads=12),
    # The paper's bigger-MLP control: 4.75 * 768 = 3648 hidden units.
    "gpt_small_mlp4_75": Flavor(n_layers=12, dim=768, n_heads=12, mlp_ratio=4.75),
    "gpt_medium": Flavor(n_layers=24, dim=1024, n_heads=16),
    "gpt_large": Flavor(n_layers=24, dim=1536, n_heads=16),
}


def build_model_args(cfg: Model, vocab_size: int) -> ModelArgs:
    """Resolve the ``[model]`` section into ModelArgs: flavor sizes, then overrides, then validation.

    ``vocab_size`` is the data side's vocabulary (see
    :func:`torchnlq.data.tokenizer.padded_vocab_size`); a set ``cfg.vocab_size`` wins over it. The MLP width is ``cfg.mlp_hidden``,
    else ``round(ratio * dim)`` with ``cfg.mlp_ratio`` or the flavor's ratio,
    on the final dim (so overriding ``dim`` scales the MLP). Raises ConfigError.
    """
    if cfg.flavor not in FLAVORS:
        raise unknown_choice("model.flavor", cfg.flavor, list(FLAVORS))
    flavor = FLAVORS[cfg.flavor]
    n_layers = cfg.n_layers if cfg.n_layers is not None else flavor.n_layers
    dim = cfg.dim if cfg.dim is not None else flavor.dim
    n_heads = cfg.n_heads if cfg.n_heads is not None else flavor.n_heads
    if cfg.mlp_hidden is not None:
        mlp_hidden = cfg.mlp_hidden
    else:
        ratio = cfg.mlp_ratio if cfg.mlp_ratio is not None else flavor.mlp_ratio
        mlp_hidden = round(ratio * dim)
        if mlp_hidden < 1:
            raise ConfigError(f"model.mlp_ratio={ratio} gives an MLP of {mlp_hidden} units at dim={dim}; raise it")
    if n_heads < 1 or dim % n_heads:
        raise ConfigError(divides_message(n_heads, dim))
    # ModelArgs.__post_init__ validates the rest (n_kv_heads, positions, query type and shapes).
    return ModelArgs(
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=cfg.n_kv_heads,
        head_dim=dim // n_heads,
        mlp_hidden=mlp_hidden,
        vocab_size=cfg.vocab_size if cfg.vocab_size is not None else vocab_size,
        max_seq_len=cfg.max_seq_len if cfg.max_seq_len is not None else flavor.max_seq_len,
        tie_embeddings=cfg.tie_embeddings,
        positions=cfg.positions,
        rope_theta=cfg.rope_theta,
        norm_eps=cfg.norm_eps,
        init_std=cfg.init_std,
        init=cfg.init,
        bias=cfg.bias,
        mlp_activation=cfg.mlp_activation,
        query=copy.deepcopy(cfg.query),  # the model must not change if the config object is edited later
    )


def build_model(args: ModelArgs) -> GPT:
    """Build a GPT on the current default device (``torch.device("meta")`` for a shape-only model)."""
    return GPT(args)
