"""ModelArgs: the resolved sizes and options of one model (its counts: models/counts.py)."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from .config import (
    DENSE,
    FIRST_BLOCK_FIELDS,
    FIRST_QUERY_FIELDS,
    LIMITS,
    REMOVED_QUERY_FIELDS,
    BlockOptions,
    Query,
)
from .errors import ConfigError, unknown_choice
from .query import QueryShape, check_query
from .recorded import Field, check_record, integer, number
from .sections import SECTIONS, carries_sections, fill_sections, same_fields, sections_read_by

#: Fields added after the first checkpoints, with the default :meth:`ModelArgs.to_dict` leaves out: every block
#: option but the first ones, every query field but the first ones (models/config.py).
LATER_FIELDS: dict[str, Any] = {f.name: f.default for f in fields(BlockOptions) if f.name not in FIRST_BLOCK_FIELDS}
LATER_QUERY_FIELDS: dict[str, Any] = {f.name: f.default for f in fields(Query) if f.name not in FIRST_QUERY_FIELDS}
#: The name the family had in records written before families were folders (``block``, "prenorm" the dense one).
OLD_FAMILY_KEY, OLD_DENSE = "block", "prenorm"


def _recorded(f: dataclasses.Field, declared: type) -> Field:
    """The schema of a recorded option of ``declared`` (BlockOptions, Query), from its declaration: its type and
    range (models/config.py). A string's choices are :meth:`ModelArgs.validate`'s, with a did-you-mean."""
    kind = typing.get_type_hints(declared)[f.name]
    null = typing.get_origin(kind) in (typing.Union, types.UnionType)
    base = next(a for a in typing.get_args(kind) if a is not type(None)) if null else kind
    if base in (bool, str):
        return Field(base, null=null)
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if base is int:
        return integer(lo, hi, null=null)
    return number(hi=hi, above=lo, null=null) if f.metadata.get("min_exclusive") else number(lo, hi, null=null)


#: What a recorded model (a checkpoint's or export's ``model_args``, a Hugging Face config.json) may hold: exact types,
#: and sizes beyond any model trained today yet small enough that the model is sized on the meta device in a second.
#: The choices of the strings are :meth:`ModelArgs.validate`'s (with a did-you-mean).
MODEL_FIELDS: dict[str, Field] = {
    "n_layers": integer(1, LIMITS["n_layers"]), "dim": integer(1, LIMITS["dim"]),
    "n_heads": integer(1, LIMITS["n_heads"]),
    "n_kv_heads": integer(1, LIMITS["n_heads"], null=True), "mlp_hidden": integer(1, LIMITS["mlp_hidden"], null=True),
    "vocab_size": integer(1, LIMITS["vocab_size"]), "max_seq_len": integer(1, LIMITS["max_seq_len"]),
    **{f.name: _recorded(f, BlockOptions) for f in fields(BlockOptions) if f.name != "init"},
}
QUERY_FIELDS: dict[str, Field] = {f.name: _recorded(f, Query) for f in fields(Query)}


def recorded_fields(declared: type) -> dict[str, Field]:
    """What a record of section ``declared`` (a family's ``[model.<name>]``) may hold: its options' types and ranges."""
    return {f.name: _recorded(f, declared) for f in fields(declared)}


_NEWER = " (written by a newer torchnlq?); upgrade torchnlq"
#: An unknown top-level key may be a section of a plugin family not imported yet.
_NEWER_OR_PLUGIN = (" (written by a newer torchnlq, or a section of a plugin family: import its module first, "
                    "[job] plugins or --plugins)")


@carries_sections(config_side=False)
@dataclass
class ModelArgs(BlockOptions):
    """Everything :class:`torchnlq.models.decoder.Decoder` needs to build itself: the resolved sizes below and the block
    options of :class:`~torchnlq.models.config.BlockOptions` (declared there once, for the config too), and each
    family's sections (``args.moe``: models/sections.py), resolved.

    ``n_kv_heads``, ``head_dim`` and ``mlp_hidden`` left ``None`` are derived in ``__post_init__``
    (n_heads, dim // n_heads, 4 * dim). ``init`` says how the weights start, not what the model is,
    so :meth:`to_dict` leaves it out; fields added later (:data:`LATER_FIELDS`) are written only when
    not at their default, so a model that does not use them keeps the dict (and resume fingerprint) it had.
    """

    n_layers: int = 2
    dim: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None
    mlp_hidden: int | None = None
    vocab_size: int = 256
    max_seq_len: int = 256
    query: Query = field(default_factory=Query)

    def __eq__(self, other: object) -> bool:
        return same_fields(self, other)

    def __post_init__(self) -> None:
        fill_sections(self)
        if self.head_dim is None:
            if self.n_heads < 1 or self.dim % self.n_heads:
                divisors = [h for h in range(1, min(self.dim, 64) + 1) if self.dim % h == 0]
                raise ConfigError(
                    f"model.n_heads={self.n_heads} does not divide model.dim={self.dim}; set model.n_heads to a "
                    f"divisor of {self.dim} (e.g. {', '.join(map(str, divisors[-6:]))}) or change model.dim"
                )
            self.head_dim = self.dim // self.n_heads
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.mlp_hidden is None:
            self.mlp_hidden = 4 * self.dim
        self.validate()

    def validate(self) -> None:
        """Raise a one-line ConfigError naming the key when the shapes cannot work together."""
        for key in ("n_layers", "dim", "n_heads", "head_dim", "mlp_hidden", "vocab_size", "max_seq_len"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}={getattr(self, key)} must be at least 1")
        if not 1 <= self.n_kv_heads <= self.n_heads or self.n_heads % self.n_kv_heads:
            divisors = ", ".join(str(k) for k in range(1, self.n_heads + 1) if self.n_heads % k == 0)
            raise ConfigError(
                f"model.n_kv_heads={self.n_kv_heads} must be in 1..{self.n_heads} and divide "
                f"model.n_heads={self.n_heads}; use one of {divisors} (or leave it unset for multi-head)"
            )
        for f in fields(BlockOptions):  # the choices each block option declares
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise unknown_choice(f"model.{f.name}", getattr(self, f.name), list(choices))
        if self.init == "paper" and not self.is_gpt2_block:
            raise ConfigError(
                f"model.init='paper' repeats the draws of the paper's GPT-2 block; it needs model.family='{DENSE}', "
                "model.norm='layer', a GELU MLP and model.qk_norm=false: use model.init='torchnlq' or 'depth' "
                "for this block"
            )
        if self.rope_scaling_factor != 1.0 and self.positions != "rope":
            raise ConfigError(
                f"model.rope_scaling_factor={self.rope_scaling_factor} scales RoPE frequencies, but model.positions="
                f"{self.positions!r}; set model.positions='rope' or leave the factor at 1"
            )
        if self.rope_high_freq_factor <= self.rope_low_freq_factor and self.rope_scaling_factor != 1.0:
            raise ConfigError(
                f"model.rope_high_freq_factor={self.rope_high_freq_factor} must exceed model.rope_low_freq_factor="
                f"{self.rope_low_freq_factor} (Llama 3 uses 4 and 1)"
            )
        if self.positions == "rope" and self.head_dim % 2:
            raise ConfigError(
                f"model.positions='rope' needs an even head_dim, got dim/n_heads = {self.head_dim}; "
                f"change model.n_heads or model.dim"
            )
        if self.parametrization == "mup":
            base = self.mup_base_width
            if base is None:
                raise ConfigError("model.parametrization='mup' needs model.mup_base_width, the width the learning "
                                  f"rate and init were tuned at (e.g. {min(self.dim, 256)}); set it")
            if base > self.dim:
                raise ConfigError(f"model.mup_base_width={base} is above model.dim={self.dim}: µP transfers from a "
                                  "narrower base to a wider model; lower the base width or widen the model")
        # Unknown query type, bad knobs or a width mismatch all surface here, before any allocation.
        check_query(self.query, QueryShape(self.dim, self.n_heads, self.head_dim, self.norm_eps, 0, self.n_layers))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field but ``init`` (``query`` nested); :meth:`from_dict` inverts it.

        Derived fields are stored resolved, so the dict rebuilds this model even if the derivation rules change.
        """
        d = asdict(self)
        del d["init"]
        for key, default in LATER_FIELDS.items():
            if d[key] == default:
                del d[key]
        for key, default in LATER_QUERY_FIELDS.items():
            if d["query"][key] == default:
                del d["query"][key]
        for name in SECTIONS:  # the options of another family: not what this model is
            if name not in sections_read_by(self.family):
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: Any, key: str = "model_args") -> ModelArgs:
        """Rebuild ModelArgs from :meth:`to_dict`'s output (e.g. a checkpoint's ``model_args``), checked against
        :data:`MODEL_FIELDS` and :data:`QUERY_FIELDS` (a ConfigError naming ``key.field`` for a wrong type or size).

        Unknown keys are a ConfigError (a newer torchnlq's model); keys of :data:`REMOVED_QUERY_FIELDS`
        are dropped; missing keys take the field defaults.
        """
        if isinstance(d, dict):  # sections given as dataclasses (a TorchnlqConfig's) read as their dicts
            d = {**d, **{k: asdict(v) for k, v in d.items() if k in ("query", *SECTIONS) and is_dataclass(v)}}
        if isinstance(d, dict) and OLD_FAMILY_KEY in d and "family" not in d:
            old = d.pop(OLD_FAMILY_KEY)
            d = {**d, "family": DENSE if old == OLD_DENSE else old}
        nested = {name: Field(dict) for name in ("query", *SECTIONS)}
        values = check_record(d, {**MODEL_FIELDS, **nested}, key, unknown=_NEWER_OR_PLUGIN)
        query = {k: v for k, v in values.pop("query", {}).items() if k not in REMOVED_QUERY_FIELDS}
        sections = {name: declared(**check_record(values.pop(name), recorded_fields(declared), f"{key}.{name}",
                                                  unknown=_NEWER))
                    for name, (declared, _) in SECTIONS.items() if name in values}
        return cls(**values, query=Query(**check_record(query, QUERY_FIELDS, f"{key}.query", unknown=_NEWER)),
                   **sections)

    @property
    def width_multiplier(self) -> float:
        """µP's m = dim / mup_base_width (1 under the standard parametrization)."""
        return self.dim / self.mup_base_width if self.parametrization == "mup" else 1.0

    @property
    def is_gpt2_block(self) -> bool:
        """The pre-norm block with LayerNorms, a GELU MLP and no QK-norm: the paper's (RoPE and GQA aside)."""
        return self.family == DENSE and self.norm == "layer" and self.mlp_activation != "swiglu" and not self.qk_norm

    @property
    def q_dim(self) -> int:
        """Width of all query heads together: n_heads * head_dim."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or all value) heads together: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim
