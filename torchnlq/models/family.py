"""Model families and flavors: the one table the rest of torchnlq reads, and the one constructor of a model.

A family is a folder of this package (``dense/``, ``moe/``) or a plugin's module behind one :class:`Family` spec:
the builder of its blocks, its own ``[model.<name>]`` sections (models/sections.py), its own checks, its runtime
hooks (models/runtime.py: what the trainer calls each step, its statistics, its parallelism), and the Hugging
Face architectures that compute some of its models exactly (:class:`~torchnlq.models.hf_mapping.HFArchitecture`).
Parameter, FLOP and memory counts are taken from the built model (models/counts.py), and parameters are grouped
by the roles their modules declare (models/roles.py), so a family trains, is counted, summarised and exported
with nothing of torchnlq edited (tests/test_extending_family.py: a plugin does all of it). A flavor is a named
model: its family, sizes and block options. Every model the library builds comes from :func:`build_model`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .args import ModelArgs
from .config import DENSE, BlockOptions, Model
from .decoder import BlockBuilder, Decoder
from .errors import ConfigError, unknown_choice
from .hf_mapping import HFArchitecture
from .runtime import FamilyRuntime
from .sections import SECTIONS, declare_sections, forget_sections, readers_of, sections_read_by


@dataclass(frozen=True)
class Family:
    """One model family: how its blocks are built and what else it brings.

    ``block(args, layer)`` builds block ``layer``; a block provides ``init_weights(init_std, residual_std)``
    (drawing every parameter from the global RNG in a fixed order) and ``forward(x, rope, cache=None,
    mask=None)`` as :class:`~torchnlq.models.dense.block.Block` does.
    """

    name: str
    block: BlockBuilder
    description: str = ""
    #: Its own ``[model.<name>]`` sections: name -> a dataclass of option() fields (the moe family's
    #: ``{"moe": MoE}``), read as ``args.<name>``; setting another family's section is refused.
    sections: Mapping[str, type] = field(default_factory=dict)
    #: Raise ConfigError for args the family cannot build (beyond ModelArgs' own checks).
    check: Callable[[ModelArgs], None] | None = None
    #: The standard Hugging Face architectures that compute some of its models exactly (``--format hf-*``).
    hf_architectures: tuple[HFArchitecture, ...] = ()
    #: Its settings that are legal but change nothing in this model, one line each (the config's warnings:
    #: train/preflight.py config_warnings); None: it has none to say.
    warnings: Callable[[ModelArgs], list[str]] | None = None
    #: Its words for a model, in the run's header (the moe family: its experts); None: nothing more to say.
    describe: Callable[[ModelArgs], str] | None = None
    #: Its own initialisations by ``model.init`` name, each drawing every parameter of the Decoder it is given (the
    #: dense family's "paper": models/dense/paper_init.py); "torchnlq" and "depth" every family has.
    init_schemes: Mapping[str, Callable[[Decoder], None]] = field(default_factory=dict)
    #: What training calls on its models beyond the forward (models/runtime.py); the default does nothing.
    runtime: FamilyRuntime = field(default_factory=FamilyRuntime)


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Make ``family`` selectable as ``model.family = family.name`` (by a flavor, or directly)."""
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered")
    if not callable(family.block):
        raise TypeError(f"family {family.name!r}: block must build a block as block(args, layer)")
    if not isinstance(family.runtime, FamilyRuntime):
        raise TypeError(f"family {family.name!r}: runtime must be a FamilyRuntime (models/runtime.py)")
    declare_sections(family.name, family.sections)
    FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Remove family ``name`` and the sections only it reads (a plugin's, in tests); its flavors stay."""
    FAMILIES.pop(name, None)
    forget_sections(name)


def get_family(name: str) -> Family:
    """The registered family ``name``; unknown names raise ConfigError with a did-you-mean."""
    if name not in FAMILIES:
        error = unknown_choice("model.family", name, list(FAMILIES))
        raise ConfigError(f"{error}; a family a plugin module registers needs that module imported first "
                          "([job] plugins in a config, --plugins for the tools)")
    return FAMILIES[name]


@dataclass(frozen=True)
class Flavor:
    """A named model: its family, sizes and block options. The MLP is a ratio of dim, so overriding ``dim``
    scales it. Every field the ``[model]`` section sets overrides the flavor's."""

    n_layers: int
    dim: int
    n_heads: int
    mlp_ratio: float = 4.0
    max_seq_len: int = 1024
    #: Key/value heads (GQA); None: one per query head.
    n_kv_heads: int | None = None
    #: SwiGLU's hidden size is rounded up to a multiple of this (``model.mlp_multiple_of`` unset).
    mlp_multiple_of: int = 256
    family: str = DENSE
    #: Block options (fields of :class:`~torchnlq.models.config.BlockOptions`) the flavor sets, e.g. Llama's
    #: ``{"norm": "rms", "mlp_activation": "swiglu", "positions": "rope"}``.
    options: Mapping[str, Any] = field(default_factory=dict)
    #: Sub-section values the flavor sets, by section: ``{"moe": {"n_experts": 8, "top_k": 2}}``.
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = {f.name for f in fields(BlockOptions)} - {"family"}
        unknown = sorted(set(self.options) - known)
        if unknown:
            raise ValueError(f"Flavor options {unknown} are not block options ({', '.join(sorted(known))})")


#: Every flavor, by name: each family's folder adds its own (models/dense/flavors.py); a plugin adds one entry.
FLAVORS: dict[str, Flavor] = {}


def mlp_width(cfg: Model, flavor: Flavor, dim: int, activation: str) -> int:
    """The MLP's hidden size: ``mlp_hidden``, else round(ratio · dim); for SwiGLU Llama's rule,
    int(2/3 · ratio · dim) rounded up to a multiple of ``mlp_multiple_of`` (the gated MLP's three
    matrices then hold about the parameters of the GELU MLP's two)."""
    if cfg.mlp_hidden is not None:
        return cfg.mlp_hidden
    ratio = cfg.mlp_ratio if cfg.mlp_ratio is not None else flavor.mlp_ratio
    if activation == "swiglu":
        multiple = cfg.mlp_multiple_of if cfg.mlp_multiple_of is not None else flavor.mlp_multiple_of
        hidden = multiple * -(-int(2 * ratio * dim / 3) // multiple)
    else:
        hidden = round(ratio * dim)
    if hidden < 1:
        raise ConfigError(f"model.mlp_ratio={ratio} gives an MLP of {hidden} units at dim={dim}; raise it")
    return hidden


def declared_default(name: str) -> Any:
    """The declared default of block option ``name`` (what ModelArgs holds when neither config nor flavor sets it)."""
    return BlockOptions.__dataclass_fields__[name].default


def _resolve_subsection(given: Any, declared: type, flavor_values: Mapping[str, Any]) -> Any:
    """A section of ModelArgs (``declared``, e.g. MoE) from the config's (whose unset fields are None): each field
    the config's, else the flavor's, else the declared default."""
    values = {}
    for f in fields(declared):
        value = getattr(given, f.name)
        values[f.name] = value if value is not None else flavor_values.get(f.name, f.default)
    return declared(**values)


def build_model_args(cfg: Model, vocab_size: int) -> ModelArgs:
    """Resolve the ``[model]`` section into ModelArgs: the flavor, then the section's overrides, then validation.

    A block option the section leaves unset takes the flavor's value, else its declared default.
    ``vocab_size`` is the data side's vocabulary (:func:`torchnlq.data.tokenizer.padded_vocab_size`); a set
    ``cfg.vocab_size`` wins over it. The MLP width is :func:`mlp_width` of the final dim. Raises ConfigError.
    """
    if cfg.flavor not in FLAVORS:
        raise unknown_choice("model.flavor", cfg.flavor, list(FLAVORS))
    flavor = FLAVORS[cfg.flavor]
    options = {f.name: getattr(cfg, f.name) for f in fields(BlockOptions)}
    for name, value in options.items():
        if value is None:
            options[name] = flavor.family if name == "family" else flavor.options.get(name, declared_default(name))
    family = get_family(options["family"])
    check_sections_read(cfg, family)
    n_layers = cfg.n_layers if cfg.n_layers is not None else flavor.n_layers
    dim = cfg.dim if cfg.dim is not None else flavor.dim
    n_heads = cfg.n_heads if cfg.n_heads is not None else flavor.n_heads
    # A flavor's KV heads hold at its own head count only: overriding n_heads alone means multi-head.
    n_kv_heads = cfg.n_kv_heads if cfg.n_kv_heads is not None else (
        flavor.n_kv_heads if cfg.n_heads is None else None)
    sections = {name: _resolve_subsection(getattr(cfg, name), declared, flavor.sections.get(name, {}))
                for name, (declared, _) in SECTIONS.items()}
    # ModelArgs.__post_init__ derives head_dim and validates the rest (n_heads | dim, n_kv_heads, query type...).
    args = ModelArgs(
        n_layers=n_layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads,
        mlp_hidden=mlp_width(cfg, flavor, dim, options["mlp_activation"]),
        vocab_size=cfg.vocab_size if cfg.vocab_size is not None else vocab_size,
        max_seq_len=cfg.max_seq_len if cfg.max_seq_len is not None else flavor.max_seq_len,
        **options, **sections,
        query=copy.deepcopy(cfg.query),  # the model must not change if the config object is edited later
    )
    if family.check is not None:
        family.check(args)
    return args


def check_sections_read(cfg: Model, family: Family) -> None:
    """ConfigError for a ``[model.<section>]`` key set for a family that does not read that section (e.g.
    ``model.moe.n_experts`` with ``model.family = 'dense'``): it would change nothing, which is rarely what was
    meant."""
    for name in SECTIONS:
        if name in sections_read_by(family.name):
            continue
        section = getattr(cfg, name)
        for f in fields(section):
            if getattr(section, f.name) is not None:
                readers = readers_of(name)
                raise ConfigError(
                    f"model.{name}.{f.name} is set, but model.family = '{family.name}' has no [model.{name}]: only "
                    f"{' and '.join(repr(r) for r in readers) or 'no family'} reads it; set model.family "
                    f"= '{readers[0] if readers else '...'}' or delete model.{name}.{f.name}")


def with_resolved_options(cfg: Model, args: ModelArgs) -> Model:
    """``cfg`` with every option it leaves to the flavor set to what ``args`` resolved it to (the resolved config a
    run records says what the model is, whatever the flavor table later says); the sub-sections the family does not
    read stay unset."""
    resolved = copy.deepcopy(cfg)
    for f in fields(BlockOptions):
        if getattr(resolved, f.name) is None:
            setattr(resolved, f.name, getattr(args, f.name))
    for name in sections_read_by(args.family):
        section = getattr(resolved, name)
        for f in fields(section):
            if getattr(section, f.name) is None:
                setattr(section, f.name, getattr(getattr(args, name), f.name))
    return resolved


def describe_family(args: ModelArgs) -> str:
    """``": <what the family says of this model>"``, or nothing."""
    family = get_family(args.family)
    return f": {family.describe(args)}" if family.describe is not None else ""


#: The ``[model]`` sizes a folder's model gives (``model.from_checkpoint``): every ModelArgs field but the options.
SIZES = ("n_layers", "dim", "n_heads", "n_kv_heads", "mlp_hidden", "vocab_size", "max_seq_len")


def with_folder_model(cfg: Model, args: ModelArgs) -> Model:
    """``cfg`` with every field it leaves unset taken from ``args`` (a folder's model): the sizes, the block options,
    the sub-sections and the query's keys; what ``cfg`` sets stays."""
    taken = with_resolved_options(cfg, args)
    for name in SIZES:
        if getattr(taken, name) is None:
            setattr(taken, name, getattr(args, name))
    taken.query = _query_taken(cfg.query, args.query)
    return taken


def _query_taken(own: Any, folder: Any) -> Any:
    """The query of a run from a folder: each key the config sets wins (config/manager.py records them, a value
    equal to the default too; without that record, a value other than the default), the rest is the folder's. A
    type other than the folder's brings none of the folder's knobs: they describe the folder's type."""
    default = type(own)()
    named = getattr(own, "set_by_config", None)
    set_keys = named if named is not None else {f.name for f in fields(own)
                                                if getattr(own, f.name) != getattr(default, f.name)}
    if "type" in set_keys and own.type != folder.type:
        return copy.deepcopy(own)
    query = copy.deepcopy(folder)
    for key in set_keys:
        setattr(query, key, copy.deepcopy(getattr(own, key)))
    return query


def build_model(args: ModelArgs) -> Decoder:
    """The one constructor of a model: a :class:`~torchnlq.models.decoder.Decoder` of ``args.family``'s blocks on
    the current default device (``torch.device("meta")`` for a shape-only model, initialised by the caller).
    Raises ConfigError for a family that is not registered or cannot build ``args``."""
    family = get_family(args.family)
    if family.check is not None:
        family.check(args)
    return Decoder(args, family.block, family.init_schemes, build_model)
