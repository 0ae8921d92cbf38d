"""The attention query projections: one base class, one registry.

Every query type maps the attention block's input X (the output of ``ln_1``,
shape ``[B, T, dim]``) to the concatenated query heads ``[B, T, n_heads * head_dim]``;
the attention module splits the result into heads afterwards, so f is never
applied per head. Keys and values stay one linear projection in :mod:`torchnlq.models.gpt`.

Adding a query type is one subclass of :class:`QueryProjection` with ``@register_query(name)``,
in this file or in the user's own module (``[job] plugins``). The rest of torchnlq asks only for the
base class's attributes and methods (docs/extending.md), never a type name or a query's submodules.

The identity term (``model.query.half_scale``): every type whose query contains X
itself (identity, residual, residual_mlp) halves its output when ``half_scale`` is
set, the default: Q = X/2, (X + X·W_Q)/2, (X + f(X))/2. The paper's code keeps X,
X + X·W_Q, X + f(X) and passes ``scale = 1/(2·sqrt(head_dim))`` to its attention
instead; the logits are the same (a factor 1/2 is exact in floating point), and the
attention here keeps one scale, 1/sqrt(head_dim), for every query type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import Query
from .errors import ConfigError, unknown_choice

QUERY_TYPES: dict[str, type[QueryProjection]] = {}
#: The ``[model.query]`` fields a query type may read (its ``knobs``): all but ``type``, which picks the class.
KNOB_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Query) if f.name != "type")


def register_query(name: str) -> Callable[[type[QueryProjection]], type[QueryProjection]]:
    """Class decorator: make a :class:`QueryProjection` subclass selectable as ``model.query.type = name``."""

    def decorator(cls: type[QueryProjection]) -> type[QueryProjection]:
        if name in QUERY_TYPES:
            raise ValueError(f"query type {name!r} is already registered by {QUERY_TYPES[name].__name__}")
        if not (isinstance(cls, type) and issubclass(cls, QueryProjection)):
            raise TypeError(f"@register_query({name!r}) must decorate a QueryProjection subclass")
        cls.type_name = name
        QUERY_TYPES[name] = cls
        return cls

    return decorator


def get_query_class(name: str) -> type[QueryProjection]:
    """The registered class for ``model.query.type``; unknown names raise ConfigError with a did-you-mean."""
    try:
        return QUERY_TYPES[name]
    except KeyError:
        error = unknown_choice("model.query.type", name, list(QUERY_TYPES))
        raise type(error)(
            f"{error}; a type a plugin module registers needs that module imported first "
            "([job] plugins in a config, --plugins for the tools)"
        ) from None


def build_query(query_cfg: Query, dim: int, n_heads: int, head_dim: int, norm_eps: float) -> QueryProjection:
    """Construct the query projection named by ``query_cfg.type`` (parameters uninitialised until ``init_weights``)."""
    return get_query_class(query_cfg.type)(query_cfg, dim, n_heads, head_dim, norm_eps)


def ignored_knobs(query_cfg: Query) -> list[str]:
    """Field names of ``[model.query]`` set to a non-default value that ``query_cfg.type`` does not read.

    A warning, not an error: one config file may serve several query types.
    """
    read = get_query_class(query_cfg.type).knobs
    default = Query()
    return [k for k in KNOB_FIELDS if k not in read and getattr(query_cfg, k) != getattr(default, k)]


def identity_term_scale(query_cfg: Query) -> float:
    """The factor on a query that contains X itself: 1/2 with ``half_scale`` (the paper's), else 1."""
    return 0.5 if query_cfg.half_scale else 1.0


def query_params_in_model(query_cfg: Query, dim: int, n_heads: int, head_dim: int, n_layers: int) -> int:
    """Parameters of the queries of all ``n_layers`` blocks, without a loop over the blocks (validates too)."""
    cls = get_query_class(query_cfg.type)
    cls.check_config(query_cfg, dim, n_heads * head_dim)
    return cls.count_params_in_model(query_cfg, dim, n_heads, head_dim, n_layers)


class LayerSet:
    """Block indices as merged ranges: membership and size without a set of every index (n_layers may be huge)."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        self.ranges = merged

    def __contains__(self, layer: object) -> bool:
        return any(lo <= layer <= hi for lo, hi in self.ranges)  # type: ignore[operator]

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)


def parse_layers(spec: str, n_layers: int) -> LayerSet:
    """Block indices from ``model.query.layers``: "all", or comma-separated indices and ranges ("0-5,8")."""
    text = spec.strip().lower()
    if text == "all":
        return LayerSet([(0, n_layers - 1)])
    ranges = []
    for part in text.split(","):
        bounds = part.strip().split("-")
        try:
            if len(bounds) == 1:
                lo = hi = int(bounds[0])
            elif len(bounds) == 2:
                lo, hi = int(bounds[0]), int(bounds[1])
            else:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"model.query.layers={spec!r} is not 'all' nor block indices like '0-5' or '0,3,11'"
            ) from None
        if not 0 <= lo <= hi < n_layers:
            raise ConfigError(
                f"model.query.layers={spec!r} names blocks outside 0..{n_layers - 1} (the model has {n_layers})"
            )
        ranges.append((lo, hi))
    return LayerSet(ranges)


class QueryProjection(nn.Module):
    """Base class and contract of a query type: ``forward(x: [B, T, dim]) -> [B, T, n_heads * head_dim]``.

    What the rest of torchnlq asks of a query type, and who asks, is the table in docs/extending.md
    ("The query contract"). A type whose query contains X itself (``requires_full_width``) reads
    ``half_scale`` and multiplies its whole output by :func:`identity_term_scale` (see the module doc).
    """

    type_name: ClassVar[str] = ""
    #: The ``[model.query]`` fields (of :data:`KNOB_FIELDS`) this type reads.
    knobs: ClassVar[tuple[str, ...]] = ()
    #: True when the output contains X itself, so n_heads * head_dim must equal dim.
    requires_full_width: ClassVar[bool] = False
    #: True when Q(X) = X·Wᵀ for the matrix :meth:`linear_weight` returns.
    linear_in_x: ClassVar[bool] = False
    #: True when Q(X) is (a scale times) X + f(X) and :meth:`residual_branch` returns f(X).
    has_residual_branch: ClassVar[bool] = False
    #: The query types whose pretrained weights this type starts from when a model is upcycled (its own
    #: parameters of the same names are loaded, the others drawn: ``anchored`` starts from ``linear``'s W_Q).
    upcycles_from: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" in vars(cls) and "linear_in_x" not in vars(cls):
            cls.linear_in_x = False  # the inherited claim described the parent's forward, not this one
        if "forward" in vars(cls) and "fused_projection" not in vars(cls):
            cls.fused_projection = QueryProjection.fused_projection  # the fused path would skip this forward
        unknown = sorted(set(cls.knobs) - set(KNOB_FIELDS))
        if unknown:
            raise TypeError(f"{cls.__name__}.knobs names {unknown}, which are not [model.query] fields")
        retired = sorted({"check_layers", "count_params_in_layer"} & set(vars(cls)))
        if retired:  # hooks of an earlier contract: ignored now, they would leave the counts wrong without a word
            raise TypeError(f"{cls.__name__} defines {retired}, no longer called: count every block in "
                            "count_params_in_model (and check per-block knobs there) instead")

    def __init__(self, cfg: Query, dim: int, n_heads: int, head_dim: int, norm_eps: float) -> None:
        super().__init__()
        self.check_config(cfg, dim, n_heads * head_dim)
        self.dim = dim
        self.q_dim = n_heads * head_dim
        self.knob_values: dict[str, object] = {k: getattr(cfg, k) for k in self.knobs}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Q(X) ``[B, T, q_dim]`` from X ``[B, T, dim]``."""
        raise NotImplementedError(f"query type {self.type_name!r} defines no forward")

    @classmethod
    def check_config(cls, cfg: Query, dim: int, q_dim: int) -> None:
        """Raise ConfigError when this query type cannot serve these shapes or knobs."""
        if cls.requires_full_width and q_dim != dim:
            raise ConfigError(
                f"model.query.type={cls.type_name!r} needs n_heads*head_dim == dim (got {q_dim} != {dim}); "
                f"use model.query.type='linear' or make model.n_heads divide model.dim"
            )
    @classmethod
    def count_params(cls, cfg: Query, dim: int, n_heads: int, head_dim: int) -> int:
        """Number of parameters. Default: build this query alone on the meta device and count (no memory)."""
        with torch.device("meta"):
            module = cls(cfg, dim, n_heads, head_dim, 1e-5)
        return sum(p.numel() for p in module.parameters())

    @classmethod
    def count_params_in_model(cls, cfg: Query, dim: int, n_heads: int, head_dim: int, n_layers: int) -> int:
        """Parameters of the queries of all blocks; a type whose blocks differ overrides it (no loop over blocks)."""
        return n_layers * cls.count_params(cfg, dim, n_heads, head_dim)

    def for_layer(self, layer: int, n_layers: int) -> None:
        """Called after building block ``layer``'s query: a type whose blocks differ adapts itself here."""

    def init_weights(self, init_std: float) -> None:
        """Re-initialise in place: every Linear N(0, init_std), every norm reset (gain 1), in module order."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=init_std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()

    def matrices(self) -> dict[str, nn.Linear]:
        """The query's matrices by the names weight dynamics logs them under (``weights/layer{i}/{name}/...``).
        Default: every ``nn.Linear`` attribute of the query itself, by its attribute name."""
        return {name: module for name, module in self.named_children() if isinstance(module, nn.Linear)}

    def branch_matrices(self) -> dict[str, nn.Linear]:
        """The matrices of the nonlinear branch f (what ``[[optimizer.groups]] kind = "query_mlp"`` selects), a
        subset of :meth:`matrices`. Default: none."""
        return {}

    def residual_branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X) of a residual query (``has_residual_branch``, for diagnostics); query types without one raise."""
        raise NotImplementedError(f"query type {self.type_name!r} has no residual branch f(X)")

    def norm_gains(self) -> dict[str, nn.Module]:
        """The norms whose gain vector (``weight``) diagnostics report, by statistic name; default none."""
        return {}

    def linear_weight(self) -> torch.Tensor | None:
        """W ``[q_dim, dim]`` (fp32, detached) with forward(x) = x·Wᵀ for ``linear_in_x`` types; else None."""
        return None

    def fused_projection(self) -> nn.Linear | None:
        """A Linear of X that the attention may compute in the same matmul as K and V, then hand to
        :meth:`from_projection` instead of calling :meth:`forward`; None (the default): forward is called."""
        return None

    def from_projection(self, x: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """Q(X) given ``projected`` = fused_projection()(x); equal to forward(x) (types with a fused_projection)."""
        raise NotImplementedError(f"query type {self.type_name!r} has no fused projection")

    def fused_qkv_weight(self) -> torch.Tensor | None:
        """W_Q ``[q_dim, dim]`` when the paper's code (as GPT-2) keeps it as the first rows of one
        fused Q,K,V matrix (its ``c_attn``, drawn as one by the paper init); None (the default) when there is none.
        """
        return None

    def paper_init_linears(self) -> list[torch.Tensor]:
        """The query's other Linear weights, in the order the paper's code builds and initialises them.

        They come after the paper's out-projection (``residual_mlp``: W1 then W2, its ``residual_in`` and
        ``residual_out``). Default: every ``nn.Linear`` in module order, less :meth:`fused_qkv_weight`.
        """
        fused = self.fused_qkv_weight()
        return [m.weight for m in self.modules() if isinstance(m, nn.Linear) and m.weight is not fused]

    def extra_repr(self) -> str:
        knobs = "".join(f", {k}={v!r}" for k, v in self.knob_values.items())
        return f"type={self.type_name!r}, dim={self.dim}, q_dim={self.q_dim}{knobs}"


@register_query("linear")
class LinearQuery(QueryProjection):
    """The standard projection X·W_Q, W_Q: dim -> n_heads * head_dim (the baseline)."""

    linear_in_x = True

    def __init__(self, cfg: Query, dim: int, n_heads: int, head_dim: int, norm_eps: float) -> None:
        super().__init__(cfg, dim, n_heads, head_dim, norm_eps)
        self.w_q = nn.Linear(dim, self.q_dim, bias=False)

    @classmethod
    def count_params(cls, cfg: Query, dim: int, n_heads: int, head_dim: int) -> int:
        return dim * n_heads * head_dim

    def linear_weight(self) -> torch.Tensor:
        """W_Q itself."""
        return self.w_q.weight.detach().float()

    def fused_qkv_weight(self) -> torch.Tensor:
        """W_Q: the paper's ``c_attn`` holds it above W_K, W_V."""
        return self.w_q.weight

    def fused_projection(self) -> nn.Linear:
        """W_Q, computed with W_K and W_V in one matmul."""
        return self.w_q

    def from_projection(self, x: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        return projected

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_q(x)


@register_query("identity")
class IdentityQuery(QueryProjection):
    """W_Q = I (Karbevski & Mijoski): the query is X/2 with ``half_scale`` (the paper's code), else X."""

    knobs = ("half_scale",)
    requires_full_width = True
    linear_in_x = True

    def __init__(self, cfg: Query, dim: int, n_heads: int, head_dim: int, norm_eps: float) -> None:
        super().__init__(cfg, dim, n_heads, head_dim, norm_eps)
        self.scale = identity_term_scale(cfg)

    @classmethod
    def count_params(cls, cfg: Query, dim: int, n_heads: int, head_dim: int) -> int:
        return 0

    def linear_weight(self) -> torch.Tensor:
        """scale·I (on the default device: the type has no parameter to take one from)."""
        return torch.eye(self.dim, dtype=torch.float32) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale if self.scale != 1.0 else x


@register_query("residual")
class ResidualQuery(QueryProjection):
    """The paper's linear control: (X + X·W_Q)/2 with ``half_scale``, else X + X·W_Q (W_Q: dim -> dim)."""

    knobs = ("half_scale",)
    requires_full_width = True
    linear_in_x = True
    has_residual_branch = True

    def __init__(self, cfg: Query, dim: int, n_heads: int, head_dim: int, norm_eps: float) -> None:
        super().__init__(cfg, dim, n_heads, head_dim, norm_eps)
        self.scale = identity_term_scale(cfg)
        self.w_q = nn.Linear(dim, dim, bias=False)

    @classmethod
    def count_params(cls, cfg: Query, dim: int, n_heads: int, head_dim: int) -> int:
        return dim * dim

    def residual_branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X) = X·W_Q."""
        return self.w_q(x)

    def linear_weight(self) -> torch.Tensor:
        """scale·(I + W_Q): x + x·Wᵀ = x·(I + W)ᵀ (summed in fp32: 1 + w would round in bf16)."""
        weight = self.w_q.weight.detach().float()
        return (torch.eye(self.dim, dtype=weight.dtype, device=weight.device) + weight) * self.scale

    def fused_qkv_weight(self) -> torch.Tensor:
        """W_Q: the paper's ``c_attn`` holds it above W_K, W_V, as for the linear query."""
        return self.w_q.weight

    def fused_projection(self) -> nn.Linear:
        """W_Q, computed with W_K and W_V in one matmul."""
        return self.w_q

    def from_projection(self, x: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        q = x + projected
        return q * self.scale if self.scale != 1.0 else q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_projection(x, self.residual_branch(x))


def _relu_squared(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Activations of f; "gelu" is the exact erf form the paper uses.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": _gelu_tanh,
    "relu": F.relu,
    "relu2": _relu_squared,
    "silu": F.silu,
}
#: The query's own norms (input_norm, output_norm); the block's are config.BLOCK_NORMS.
QUERY_NORMS = ("rms", "layer", "none")


def _build_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """RMSNorm / LayerNorm with a learnable gain and no bias, or Identity for "none"."""
    if kind == "rms":
        return nn.RMSNorm(dim, eps=eps)
    if kind == "layer":
        return nn.LayerNorm(dim, eps=eps, bias=False)
    return nn.Identity()


@register_query("residual_mlp")
class ResidualMLPQuery(QueryProjection):
    """The paper's nonlinear query: Q(X) = (X + f(X)) / 2 with a bottleneck MLP f.

    f(X) = out_norm(act(in_norm(X)·W1)·W2), W1: d x r, W2: r x d, r = round(bottleneck_ratio * d).
    The defaults are the paper's f(X) = LN(GELU(RMSNorm(X)·W1)·W2): W1 + W2 hold exactly the d²
    parameters of the W_Q it replaces, plus two norm gains. The 1/2 is ``half_scale`` (module doc).
    """

    knobs = ("activation", "input_norm", "output_norm", "bottleneck_ratio", "half_scale")
    requires_full_width = True
    has_residual_branch = True

    def __init__(self, cfg: Query, dim: int, n_heads: int, head_dim: int, norm_eps: float) -> None:
        super().__init__(cfg, dim, n_heads, head_dim, norm_eps)
        self.rank = self.bottleneck_width(cfg, dim)
        self.act = ACTIVATIONS[cfg.activation]
        self.scale = identity_term_scale(cfg)
        self.input_norm = _build_norm(cfg.input_norm, dim, norm_eps)
        self.w1 = nn.Linear(dim, self.rank, bias=False)
        self.w2 = nn.Linear(self.rank, dim, bias=False)
        self.output_norm = _build_norm(cfg.output_norm, dim, norm_eps)

    @staticmethod
    def bottleneck_width(cfg: Query, dim: int) -> int:
        """r = round(bottleneck_ratio * dim)."""
        return round(cfg.bottleneck_ratio * dim)

    @classmethod
    def check_config(cls, cfg: Query, dim: int, q_dim: int) -> None:
        super().check_config(cfg, dim, q_dim)
        if cfg.activation not in ACTIVATIONS:
            raise unknown_choice("model.query.activation", cfg.activation, list(ACTIVATIONS))
        for key, kind in (("input_norm", cfg.input_norm), ("output_norm", cfg.output_norm)):
            if kind not in QUERY_NORMS:
                raise unknown_choice(f"model.query.{key}", kind, list(QUERY_NORMS))
        rank = cls.bottleneck_width(cfg, dim)
        if rank < 1:
            raise ConfigError(
                f"model.query.bottleneck_ratio={cfg.bottleneck_ratio} gives r = round({cfg.bottleneck_ratio}*{dim}) = "
                f"{rank} < 1; raise model.query.bottleneck_ratio to at least {1 / dim:.3g}"
            )
    @classmethod
    def count_params(cls, cfg: Query, dim: int, n_heads: int, head_dim: int) -> int:
        gains = sum(dim for kind in (cfg.input_norm, cfg.output_norm) if kind != "none")
        return 2 * dim * cls.bottleneck_width(cfg, dim) + gains

    def branch_matrices(self) -> dict[str, nn.Linear]:
        """W1 and W2: f's bottleneck."""
        return {"w1": self.w1, "w2": self.w2}

    def norm_gains(self) -> dict[str, nn.Module]:
        """``gain_in`` (before W1) and ``gain_out`` (after W2), for the norms that are not "none"."""
        norms = {"gain_in": self.input_norm, "gain_out": self.output_norm}
        return {key: norm for key, norm in norms.items() if not isinstance(norm, nn.Identity)}

    def residual_branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X) = out_norm(act(in_norm(X)·W1)·W2), shape [B, T, dim]."""
        return self.output_norm(self.w2(self.act(self.w1(self.input_norm(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.residual_branch(x)) * self.scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}"


@register_query("anchored")
class AnchoredQuery(QueryProjection):
    """A pretrained model's query with the paper's nonlinear branch added: Q(X) = X·W_Q + f(X).

    For upcycling (arXiv 2603.13381, future work: "one could anchor to existing projections:
    Q = (X·W_Q + f(X))/2"). W_Q is the pretrained model's, f the paper's bottleneck MLP
    (d -> r -> q_dim). The paper's ½ is not applied: it would halve a query trained unhalved
    ((X·2W_Q + 2f(X))/2 is the same function). f starts at exactly zero (its last gain or W2 is
    zeroed), so an upcycled model computes the pretrained function until the first update.
    """

    knobs = ("activation", "input_norm", "output_norm", "bottleneck_ratio", "layers", "train_anchor")
    has_residual_branch = False
    upcycles_from = ("linear",)

    def __init__(self, cfg: Query, dim: int, n_heads: int, head_dim: int, norm_eps: float) -> None:
        super().__init__(cfg, dim, n_heads, head_dim, norm_eps)
        self.w_q = nn.Linear(dim, self.q_dim, bias=False)
        self.w_q.weight.requires_grad_(cfg.train_anchor)
        self.rank = ResidualMLPQuery.bottleneck_width(cfg, dim)
        self.act = ACTIVATIONS[cfg.activation]
        self.input_norm = _build_norm(cfg.input_norm, dim, norm_eps)
        self.w1 = nn.Linear(dim, self.rank, bias=False)
        self.w2 = nn.Linear(self.rank, self.q_dim, bias=False)
        self.output_norm = _build_norm(cfg.output_norm, self.q_dim, norm_eps)
        self.has_branch = True

    @classmethod
    def check_config(cls, cfg: Query, dim: int, q_dim: int) -> None:
        super().check_config(cfg, dim, q_dim)
        ResidualMLPQuery.check_config(cfg, dim, dim)

    @classmethod
    def count_params(cls, cfg: Query, dim: int, n_heads: int, head_dim: int) -> int:
        q_dim = n_heads * head_dim
        gains = (dim if cfg.input_norm != "none" else 0) + (q_dim if cfg.output_norm != "none" else 0)
        rank = ResidualMLPQuery.bottleneck_width(cfg, dim)
        return dim * q_dim + dim * rank + rank * q_dim + gains

    @classmethod
    def count_params_in_model(cls, cfg: Query, dim: int, n_heads: int, head_dim: int, n_layers: int) -> int:
        with_f = len(parse_layers(cfg.layers, n_layers))
        return with_f * cls.count_params(cfg, dim, n_heads, head_dim) + (n_layers - with_f) * dim * n_heads * head_dim

    def for_layer(self, layer: int, n_layers: int) -> None:
        """Drop f from the blocks ``layers`` does not name: their query is X·W_Q, as pretrained."""
        if layer not in parse_layers(str(self.knob_values["layers"]), n_layers):
            del self.input_norm, self.w1, self.w2, self.output_norm
            self.has_branch = False

    def init_weights(self, init_std: float) -> None:
        """W_Q, W1, W2 ~ N(0, init_std), input gain 1; f's last scale zero, so that f(X) = 0 at init."""
        super().init_weights(init_std)
        if self.has_branch:
            last = self.w2 if isinstance(self.output_norm, nn.Identity) else self.output_norm
            nn.init.zeros_(last.weight)

    def branch_matrices(self) -> dict[str, nn.Linear]:
        """W1 and W2 of f, in the blocks that have it."""
        return {"w1": self.w1, "w2": self.w2} if self.has_branch else {}

    def linear_weight(self) -> torch.Tensor | None:
        """W_Q for a block without f (X·W_Q alone); None where f is present."""
        return None if self.has_branch else self.w_q.weight.detach().float()

    def fused_qkv_weight(self) -> torch.Tensor:
        """W_Q: drawn with W_K, W_V as one matrix under the paper init, as the linear query's."""
        return self.w_q.weight

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X) ``[B, T, q_dim]`` (blocks with f only)."""
        return self.output_norm(self.w2(self.act(self.w1(self.input_norm(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A frozen anchor is detached here too, not only by requires_grad: loaders that replace the
        # parameter (transformers' from_pretrained) would otherwise let fine-tuning move it.
        weight = self.w_q.weight if self.knob_values["train_anchor"] else self.w_q.weight.detach()
        q = F.linear(x, weight)
        return q + self.branch(x) if self.has_branch else q

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, has_branch={self.has_branch}"
