"""The ``[model]`` and ``[model.query]`` config sections, and the :func:`option` field they are declared with.

They live in the model package, which imports nothing else of torchnlq, so that the model's
description and its validation exist once: ``torchnlq.config`` builds the rest of the job
configuration around them, and a Hugging Face export ships them with the model.
Each field's doc is the ``--help`` text and the docs/configs.md line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .sections import carries_sections, fill_sections, same_fields, unset_by_default

#: ``[model.query]`` keys that older torchnlq versions wrote and this one ignores, with why.
REMOVED_QUERY_FIELDS = {
    "fuse_kv": "the fused K,V + query matmul was removed (the same function; no measured gain once compiled)",
}


#: The largest model a config may describe (and a recorded one may claim: models/args.py's MODEL_FIELDS), far
#: beyond any trained model, so that a run never writes a checkpoint its own loader would refuse.
LIMITS = {"n_layers": 1024, "dim": 2**17, "n_heads": 2**16, "mlp_hidden": 2**20, "max_seq_len": 2**24,
          "vocab_size": 2**32}


def option(
    default: Any,
    doc: str,
    *,
    choices: tuple[Any, ...] | None = None,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
    max_exclusive: bool = False,
    registry: str | None = None,
    path: bool = False,
    width: bool = False,
) -> Any:
    """Declare a config field with its doc line and its allowed values.

    ``min``/``max`` bound numbers (``min_exclusive``/``max_exclusive`` make a bound strict);
    ``choices`` lists the allowed values of a string field; ``registry`` names the registry whose
    keys are the allowed values instead (``torchnlq.train.registries``); ``path`` marks a file or
    folder path (``~`` is expanded when the config is read); ``width`` a size that grows with the model's width
    (µP's base model, models/mup.py, scales it). A ``None`` default means "unset / derived", and ``None`` stays
    allowed for the field.
    """
    meta = {
        "doc": doc, "choices": choices, "min": min, "max": max, "min_exclusive": min_exclusive,
        "max_exclusive": max_exclusive, "registry": registry, "path": path, "width": width,
    }
    if isinstance(default, list):  # a fresh list per config object
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Query:
    """The attention query projection: the subject of the paper."""

    type: str = option(
        "linear",
        "Query type (torchnlq/models/query.py): linear is X·W_Q, identity W_Q = I, residual X + X·W_Q, "
        "residual_mlp the paper's (X + f(X))/2, anchored X·W_Q + f(X) for upcycling a pretrained W_Q.",
        registry="query types",
    )
    activation: str = option(
        "gelu", "residual_mlp, anchored: activation inside f (gelu is the exact erf form).", registry="activations"
    )
    input_norm: str = option("rms", "residual_mlp, anchored: norm applied to X before W1.", registry="norms")
    output_norm: str = option("layer", "residual_mlp, anchored: norm applied after W2.", registry="norms")
    bottleneck_ratio: float = option(
        0.5, "residual_mlp, anchored: bottleneck width r as a fraction of the model width d.", min=0.0,
        min_exclusive=True, max=2**10,
    )
    half_scale: bool = option(
        True,
        "identity, residual, residual_mlp (the types whose query contains X itself): halve the query, "
        "Q = X/2, (X + X·W_Q)/2, (X + f(X))/2, as the paper's code (its attention scale 1/(2·sqrt(head_dim)) "
        "gives the same logits); false gives X, X + X·W_Q, X + f(X) at the usual 1/sqrt(head_dim).",
    )
    layers: str = option(
        "all",
        "anchored: the blocks whose query gets the nonlinear branch f: 'all', or block indices such as "
        "'0-5' or '0,3,11' (the others keep X·W_Q alone).",
    )
    train_anchor: bool = option(
        True, "anchored: whether the anchor W_Q (taken from a pretrained model) trains; false freezes it."
    )


#: ``model.mlp_activation``: exact GELU (nanoGPT, the paper), GPT-2's tanh approximation, or Llama's gated SwiGLU.
MLP_ACTIVATIONS = ("gelu", "gelu_tanh", "swiglu")
#: ``model.norm``: the block's norms (the query's own norms are query.QUERY_NORMS).
BLOCK_NORMS = ("layer", "rms")
#: ``model.init``: the initial weights (:meth:`Decoder.init_weights`); "paper" is the dense family's
#: (models/dense/paper_init.py).
INIT_SCHEMES = ("torchnlq", "depth", "paper")
#: ``model.parametrization``: the standard one, or µP (models/mup.py).
PARAMETRIZATIONS = ("sp", "mup")
#: ``model.positions``: learned absolute embeddings or rotary.
POSITIONS = ("learned", "rope")
#: ``model.family``: the built-in dense family (models/dense/: GPT-2, Llama, Qwen3 blocks); others in models/family.py.
DENSE = "dense"


@dataclass
class BlockOptions:
    """What the model is beyond its sizes: ``[model]`` keys that are :class:`~torchnlq.models.args.ModelArgs` fields
    as they are (both classes derive from this one: a field declared here reaches the config, ``--help``, the
    docs, the resolved model, its records and every export). Declare a new block option here, nowhere else.
    """

    head_dim: int | None = option(
        None, "Width of each attention head; unset means dim / n_heads. Qwen3 sets its own (e.g. 128 at dim 1024 "
        "with 16 heads); the queries that contain X need n_heads x head_dim = dim.", min=1, max=LIMITS["n_heads"],
    )
    tie_embeddings: bool = option(True, "Share the token embedding with the LM head (GPT-2 does).")
    bias: bool = option(
        False,
        "Biases in every Linear (the query's, K,V, out-projections, MLP) and LayerNorm, as GPT-2 has them: "
        "for models imported from Hugging Face GPT-2 (scripts/upcycle.py); torchnlq's own models have none.",
    )
    mlp_activation: str = option(
        "gelu",
        "The MLP: gelu (exact erf form: nanoGPT, the paper), gelu_tanh (GPT-2's gelu_new, for imported GPT-2 "
        "weights), or swiglu (Llama's gated MLP: down(silu(gate(x)) * up(x)), three matrices).",
        choices=MLP_ACTIVATIONS,
    )
    norm: str = option(
        "layer",
        "The block's norms (ln_1, ln_2, ln_f): layer (LayerNorm, GPT-2) or rms (RMSNorm, Llama); "
        "epsilon norm_eps. The query's own norms are model.query.input_norm/output_norm.",
        choices=BLOCK_NORMS,
    )
    family: str = option(
        DENSE,
        "The model family (FAMILIES in torchnlq/models/family.py): dense is the pre-norm block x + attn(norm(x)), "
        "then x + mlp(norm(x)) (GPT-2, Llama or Qwen3 by the options below); the others (moe, a plugin's: "
        "register_family) read their own [model.<family>] section too.",
        registry="families",
    )
    qk_norm: bool = option(
        False,
        "RMSNorm (a gain per head channel) on each head of the queries and keys, after the query projection and "
        "before RoPE (OLMo-2, Qwen3). It normalises the query as the query type made it, so the 1/2 of "
        "model.query.half_scale cancels (the gains, from 1, set the attention temperature).",
    )
    positions: str = option(
        "learned", "Position encoding: learned absolute embeddings (GPT-2) or rotary (rope).", choices=POSITIONS
    )
    rope_theta: float = option(10000.0, "RoPE base frequency (positions = rope only).", min=0.0, min_exclusive=True)
    rope_scaling_factor: float = option(
        1.0,
        "Llama-3 RoPE frequency scaling (positions = rope): the low frequencies are divided by this factor, the "
        "high ones kept, the band between interpolated (Llama 3.1/3.2 use 8 or 32); 1 = no scaling.",
        min=1.0,
    )
    rope_low_freq_factor: float = option(
        1.0, "Llama-3 RoPE scaling: wavelengths above rope_original_max_seq_len / this are fully scaled.",
        min=0.0, min_exclusive=True,
    )
    rope_high_freq_factor: float = option(
        4.0, "Llama-3 RoPE scaling: wavelengths below rope_original_max_seq_len / this are kept.",
        min=0.0, min_exclusive=True,
    )
    rope_original_max_seq_len: int = option(
        8192, "Llama-3 RoPE scaling: the context length the unscaled frequencies were trained for.", min=1,
        max=LIMITS["max_seq_len"],
    )
    norm_eps: float = option(1e-5, "Epsilon of every LayerNorm/RMSNorm.", min=0.0, min_exclusive=True)
    init_std: float = option(0.02, "Std of the normal init of Linear and Embedding weights (nanoGPT).", min=0.0)
    init: str = option(
        "torchnlq",
        "The initial weights: torchnlq (nanoGPT's scheme: N(0, init_std), residual out-projections "
        "init_std/sqrt(2·n_layers), each parameter drawn once in module order); depth (torchtitan's depth_init for "
        "Llama-style models: the residual out-projections of block l at init_std/sqrt(2·(l+1))); paper (the "
        "torchnlq scheme in the draw order of the paper's training script: its module constructors, fused Q,K,V "
        "matrix, nanoGPT's init, so that for the same training.seed the initial weights are bitwise its own; "
        "GPT-2 blocks only).",
        choices=INIT_SCHEMES,
    )
    parametrization: str = option(
        "sp",
        "sp: the standard parametrization (every model so far, the paper's); mup: the Maximal Update "
        "Parametrization (Tensor Programs V), so that the best learning rate and init stop moving with the width: "
        "hidden matrices drawn at init_std / sqrt(m) with AdamW LR / m (m = dim / mup_base_width), the embedding "
        "times mup_input_multiplier, the logits times mup_output_multiplier / m, attention at 1/head_dim "
        "(docs/mup.md). At the base width it is the standard model.",
        choices=PARAMETRIZATIONS,
    )
    mup_base_width: int | None = option(
        None, "parametrization = mup: the width (model.dim) at which µP is the standard parametrization, where the "
        "learning rate and init were tuned; every width-like size (head_dim, mlp_hidden, ...) scales with it.",
        min=1, max=LIMITS["dim"],
    )
    mup_input_multiplier: float = option(
        1.0, "parametrization = mup: the embedding output times this (a tunable constant, 1 at the standard "
        "model).", min=0.0, min_exclusive=True,
    )
    mup_output_multiplier: float = option(
        1.0, "parametrization = mup: the logits times this / m (a tunable constant; the tied head shares the "
        "embedding's matrix, so the multiplier, not the matrix, carries the readout's 1/m).", min=0.0,
        min_exclusive=True,
    )


#: The block options of the first checkpoints: ModelArgs.to_dict always writes them. Every later one (any option
#: added to :class:`BlockOptions` since) is written only when not at its default, so that a model which does not use it
#: keeps the record (and resume fingerprint) it had.
FIRST_BLOCK_FIELDS = ("head_dim", "tie_embeddings", "positions", "rope_theta", "norm_eps", "init_std", "init")
#: The query fields of the first checkpoints (the same rule as FIRST_BLOCK_FIELDS for ``[model.query]``).
FIRST_QUERY_FIELDS = ("type", "activation", "input_norm", "output_norm", "bottleneck_ratio", "half_scale")


@carries_sections(config_side=True)
@dataclass
@unset_by_default(BlockOptions)
class Model(BlockOptions):
    """The model: a named flavor (sizes and block options), with optional per-field overrides.

    Each family's own ``[model.<name>]`` section (models/sections.py) is a field too."""

    flavor: str = option(
        "debug", "A named model (FLAVORS in torchnlq/models/family.py): its family, sizes and block options.",
        registry="flavors")
    n_layers: int | None = option(None, "Override the flavor's number of transformer blocks.", min=1,
                                  max=LIMITS["n_layers"])
    dim: int | None = option(None, "Override the flavor's model width d.", min=1, max=LIMITS["dim"])
    n_heads: int | None = option(None, "Override the flavor's number of attention (query) heads.", min=1,
                                 max=LIMITS["n_heads"])
    n_kv_heads: int | None = option(
        None, "Key/value heads for GQA/MQA (must divide n_heads); unset means n_heads (multi-head).", min=1
    )
    mlp_ratio: float | None = option(
        None, "MLP hidden size as a multiple of dim (4.0 for GPT-2); ignored when mlp_hidden is set.",
        min=0.0, min_exclusive=True,
    )
    mlp_hidden: int | None = option(None, "MLP hidden size in units; overrides mlp_ratio.", min=1,
                                    max=LIMITS["mlp_hidden"])
    mlp_multiple_of: int | None = option(
        None,
        "swiglu without mlp_hidden: the hidden size is int(2/3 · mlp_ratio · dim) rounded up to a multiple of "
        "this (Llama's rule: 4 · 256 -> 768), so that the gated MLP has the GELU MLP's parameters. Unset: the "
        "flavor's, else 256.",
        min=1,
    )
    max_seq_len: int | None = option(
        None, "Override the flavor's number of positions (learned position table size).", min=1,
        max=LIMITS["max_seq_len"],
    )
    vocab_size: int | None = option(
        None, "Vocabulary size; unset means the tokenizer's, padded to a multiple of vocab_multiple.", min=1,
        max=LIMITS["vocab_size"],
    )
    vocab_multiple: int = option(64, "Pad the tokenizer's vocabulary up to a multiple of this (50257 -> 50304).", min=1)
    from_checkpoint: bool = option(
        False, "Take the model from checkpoint.initial_load_path (a Hugging Face folder, an export or a checkpoint): "
        "its family, sizes, block options, sections and query; each [model] key the run's config sets still "
        "wins (a query type other than the folder's replaces its query: docs/checkpoints.md). The resolved config "
        "(--print-config, config.toml) writes out what was taken.",
    )
    query: Query = field(default_factory=Query)

    def __post_init__(self) -> None:
        fill_sections(self)

    def __eq__(self, other: object) -> bool:
        return same_fields(self, other)
