"""The attention query projections: a narrow core contract, opt-in protocols, one registry.

Every query type maps the attention block's input X (the output of ``ln_1``, ``[B, T, dim]``) to the
concatenated query heads ``[B, T, n_heads * head_dim]``; the attention splits the result into heads
afterwards, so f is never applied per head. Keys and values stay one linear projection (models/layers.py).

Adding a query type is one subclass of :class:`QueryProjection` with ``@register_query(name)``, in this file
or in the user's own module (``[job] plugins``). The core contract is what every type has (``forward``, its
``knobs``, ``check_config``, ``init_weights``, ``matrices`` and ``branch_matrices``); what only some types
can do is a protocol they opt into by defining its methods (:class:`LinearInX`, :class:`ResidualBranch`,
:class:`FusableQuery`, :class:`PaperQKVRows`). The rest of torchnlq asks these, never a type name or a
query's submodules (docs/extending.md, "The query contract").

The identity term (``model.query.half_scale``): every type whose query contains X itself (identity, residual,
residual_mlp) halves its output when ``half_scale`` is set, the default: Q = X/2, (X + X·W_Q)/2,
(X + f(X))/2. The paper's code keeps X, X + X·W_Q, X + f(X) and passes ``scale = 1/(2·sqrt(head_dim))`` to
its attention instead; the logits are the same (a factor 1/2 is exact in floating point), and the attention
here keeps one scale, 1/sqrt(head_dim), for every query type.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import Query
from .errors import ConfigError, unknown_choice

QUERY_TYPES: dict[str, type[QueryProjection]] = {}
#: The ``[model.query]`` fields a query type may read (its ``knobs``): all but ``type``, which picks the class.
KNOB_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Query) if f.name != "type")


@dataclass(frozen=True)
class QueryShape:
    """What one query is built for: the model's width and heads, and which of the model's blocks it serves."""

    dim: int
    n_heads: int
    head_dim: int
    norm_eps: float = 1e-5
    layer: int = 0
    n_layers: int = 1

    @property
    def q_dim(self) -> int:
        """Width of all query heads together."""
        return self.n_heads * self.head_dim


def register_query(name: str) -> Callable[[type[QueryProjection]], type[QueryProjection]]:
    """Class decorator: make a :class:`QueryProjection` subclass selectable as ``model.query.type = name``."""

    def decorator(cls: type[QueryProjection]) -> type[QueryProjection]:
        if name in QUERY_TYPES:
            raise ValueError(f"query type {name!r} is already registered by {QUERY_TYPES[name].__name__}")
        if not (isinstance(cls, type) and issubclass(cls, QueryProjection)):
            raise TypeError(f"@register_query({name!r}) must decorate a QueryProjection subclass")
        check_constructor(name, cls)
        unknown = sorted(set(cls.knobs) - set(KNOB_FIELDS))
        if unknown:
            raise TypeError(f"{cls.__name__}.knobs names {unknown}, which are not [model.query] fields")
        cls.type_name = name
        QUERY_TYPES[name] = cls
        return cls

    return decorator


def check_constructor(name: str, cls: type[QueryProjection]) -> None:
    """ConfigError (at registration, before any build) when ``cls`` cannot be built as ``cls(cfg, shape)``: the
    earlier ``(cfg, dim, n_heads, head_dim, norm_eps)`` constructor would otherwise be a TypeError at build time."""
    try:
        signature = inspect.signature(cls)
        signature.bind(None, None)
    except TypeError:
        raise ConfigError(
            f"query type {name!r}: {cls.__name__}.__init__{signature} is not the query contract's (cfg, shape); "
            "take (cfg, shape) and read dim, n_heads, head_dim, norm_eps from shape (a QueryShape), then call "
            "super().__init__(cfg, shape) (docs/extending.md, 'A new query type')") from None
    except ValueError:  # no signature to read (a C-level __init__): left to the build
        return


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


def build_query(query_cfg: Query, dim: int, n_heads: int, head_dim: int, norm_eps: float = 1e-5, layer: int = 0,
                n_layers: int = 1) -> QueryProjection:
    """The query of block ``layer`` of ``n_layers`` named by ``query_cfg.type`` (parameters uninitialised until
    ``init_weights``)."""
    return get_query_class(query_cfg.type)(query_cfg, QueryShape(dim, n_heads, head_dim, norm_eps, layer, n_layers))


def check_query(query_cfg: Query, shape: QueryShape) -> None:
    """ConfigError when ``query_cfg``'s type cannot serve ``shape`` with its knobs (nothing is built)."""
    get_query_class(query_cfg.type).check_config(query_cfg, shape)


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


def layer_ranges(spec: str, n_layers: int) -> list[tuple[int, int]]:
    """Block index ranges (inclusive) from ``model.query.layers``: "all", or indices and ranges ("0-5,8")."""
    text = spec.strip().lower()
    if text == "all":
        return [(0, n_layers - 1)]
    ranges = []
    for part in text.split(","):
        bounds = part.strip().split("-")
        try:
            if len(bounds) not in (1, 2):
                raise ValueError
            lo, hi = int(bounds[0]), int(bounds[-1])
        except ValueError:
            raise ConfigError(
                f"model.query.layers={spec!r} is not 'all' nor block indices like '0-5' or '0,3,11'"
            ) from None
        if not 0 <= lo <= hi < n_layers:
            raise ConfigError(
                f"model.query.layers={spec!r} names blocks outside 0..{n_layers - 1} (the model has {n_layers})"
            )
        ranges.append((lo, hi))
    return ranges


class QueryProjection(nn.Module):
    """The core contract of a query type: ``forward(x: [B, T, dim]) -> [B, T, n_heads * head_dim]``.

    A type whose query contains X itself (``requires_full_width``) reads ``half_scale`` and multiplies its whole
    output by :func:`identity_term_scale` (see the module doc).
    """

    type_name: ClassVar[str] = ""
    #: The ``[model.query]`` fields (of :data:`KNOB_FIELDS`) this type reads.
    knobs: ClassVar[tuple[str, ...]] = ()
    #: True when the output contains X itself, so n_heads * head_dim must equal dim.
    requires_full_width: ClassVar[bool] = False
    #: The query types whose pretrained weights this type starts from when a model is upcycled (its own
    #: parameters of the same names are loaded, the others drawn: ``anchored`` starts from ``linear``'s W_Q).
    upcycles_from: ClassVar[tuple[str, ...]] = ()
    #: A :class:`FusableQuery` whose Q(X) is ``fused_projection()(x)`` itself (``from_projection`` returns it as it
    #: is): its rows may then be reordered with the keys' for a cheaper RoPE (models/rope.py: apply_rotary_adjacent).
    projection_is_query: ClassVar[bool] = False
    #: Parameter roles (models/roles.py): every parameter of a query, its norms too, counts as the query's.
    component: ClassVar[str] = "attention_query"

    def __init__(self, cfg: Query, shape: QueryShape) -> None:
        super().__init__()
        self.check_config(cfg, shape)
        self.dim = shape.dim
        self.q_dim = shape.q_dim
        self.knob_values: dict[str, object] = {k: getattr(cfg, k) for k in self.knobs}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Q(X) ``[B, T, q_dim]`` from X ``[B, T, dim]``."""
        raise NotImplementedError(f"query type {self.type_name!r} defines no forward")

    @classmethod
    def check_config(cls, cfg: Query, shape: QueryShape) -> None:
        """Raise ConfigError when this query type cannot serve these shapes or knobs (runs before any allocation)."""
        if cls.requires_full_width and shape.q_dim != shape.dim:
            raise ConfigError(
                f"model.query.type={cls.type_name!r} needs n_heads*head_dim == dim (got {shape.q_dim} != "
                f"{shape.dim}); use model.query.type='linear' or make model.n_heads divide model.dim"
            )

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

    def extra_repr(self) -> str:
        knobs = "".join(f", {k}={v!r}" for k, v in self.knob_values.items())
        return f"type={self.type_name!r}, dim={self.dim}, q_dim={self.q_dim}{knobs}"


# ---------------------------------------------------------------- opt-in protocols


@runtime_checkable
class LinearInX(Protocol):
    """Q(X) = X·Wᵀ for one matrix W: what the standard exports (GPT-2's, Llama's W_Q) write."""

    def linear_weight(self) -> torch.Tensor:
        """W ``[q_dim, dim]``, fp32 and detached."""


@runtime_checkable
class ResidualBranch(Protocol):
    """Q(X) is (a scale times) X + f(X): the training diagnostics log ‖f(X)‖/‖X‖, cos(Q(X), X) and the gains."""

    def residual_branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X) ``[B, T, dim]``."""

    def norm_gains(self) -> dict[str, nn.Module]:
        """The norms whose mean gain the diagnostics report, by statistic name."""


@runtime_checkable
class FusableQuery(Protocol):
    """A query computed from one Linear of X that the attention may fuse into its K,V matmul (nanoGPT's
    ``c_attn``): it computes ``fused_projection()(x)`` with K and V and calls :meth:`from_projection` instead
    of ``forward``. A subclass that changes ``forward`` must change :meth:`from_projection` to match. A type whose
    Q(X) is the projection itself says so with :attr:`QueryProjection.projection_is_query`."""

    def fused_projection(self) -> nn.Linear:
        """The Linear of X computed with K and V."""

    def from_projection(self, x: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """Q(X) given ``projected`` = fused_projection()(x); equal to forward(x)."""


@runtime_checkable
class PaperQKVRows(Protocol):
    """A W_Q that the paper's code keeps as the first rows of its fused Q,K,V matrix (``model.init = "paper"``
    draws it with W_K and W_V as one matrix)."""

    def fused_qkv_weight(self) -> torch.Tensor:
        """W_Q ``[q_dim, dim]``, the parameter itself."""


#: Every opt-in protocol describes what ``forward`` computes (or where its W_Q sits), with the method that makes
#: the claim: a subclass that changes ``forward`` without redefining that method does not inherit it (:func:`claims`).
CLAIMS: dict[type, str] = {LinearInX: "linear_weight", FusableQuery: "from_projection",
                           ResidualBranch: "residual_branch", PaperQKVRows: "fused_qkv_weight"}


def claims(query: QueryProjection | type[QueryProjection], protocol: type) -> bool:
    """Whether a query (or query type) opts into ``protocol`` (one of :data:`CLAIMS`): the class that defines the
    claim's method must also be the one, or a subclass of the one, that defines ``forward``: a plugin that
    subclasses ``linear`` with a nonlinear forward is not exported as a linear W_Q, nor fused, nor drawn as the
    paper's fused rows; one that subclasses ``residual_mlp`` with another forward is not diagnosed as X + f(X)."""
    cls = query if isinstance(query, type) else type(query)
    if protocol not in CLAIMS:
        raise ValueError(f"{protocol.__name__} is not a query protocol ({', '.join(p.__name__ for p in CLAIMS)})")
    if not issubclass(cls, protocol):
        return False
    owner = lambda name: next(c for c in cls.__mro__ if name in vars(c))  # noqa: E731
    return issubclass(owner(CLAIMS[protocol]), owner("forward"))


# ---------------------------------------------------------------- the built-in types


@register_query("linear")
class LinearQuery(QueryProjection):
    """The standard projection X·W_Q, W_Q: dim -> n_heads * head_dim (the baseline)."""

    projection_is_query = True

    def __init__(self, cfg: Query, shape: QueryShape) -> None:
        super().__init__(cfg, shape)
        self.w_q = nn.Linear(shape.dim, self.q_dim, bias=False)

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

    def __init__(self, cfg: Query, shape: QueryShape) -> None:
        super().__init__(cfg, shape)
        self.scale = identity_term_scale(cfg)

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

    def __init__(self, cfg: Query, shape: QueryShape) -> None:
        super().__init__(cfg, shape)
        self.scale = identity_term_scale(cfg)
        self.w_q = nn.Linear(shape.dim, shape.dim, bias=False)

    def residual_branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X) = X·W_Q."""
        return self.w_q(x)

    def norm_gains(self) -> dict[str, nn.Module]:
        return {}

    def linear_weight(self) -> torch.Tensor:
        """scale·(I + W_Q): x + x·Wᵀ = x·(I + W)ᵀ (summed in fp32: 1 + w would round in bf16)."""
        weight = self.w_q.weight.detach().float()
        return (torch.eye(self.dim, dtype=weight.dtype, device=weight.device) + weight) * self.scale

    projection_is_query = False  # (X + X·W_Q)/2: X is in it

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


class BottleneckBranch(QueryProjection):
    """The paper's nonlinear branch f(X) = out_norm(act(in_norm(X)·W1)·W2), W1: d x r, W2: r x width, r =
    round(bottleneck_ratio · d), as the base of the query types that use it. Its modules are the query's own
    attributes (``input_norm``, ``w1``, ``w2``, ``output_norm``: the state-dict names of every checkpoint)."""

    def build_branch(self, cfg: Query, shape: QueryShape, width: int) -> None:
        """Create f with output ``width``."""
        self.rank = self.bottleneck_width(cfg, shape.dim)
        self.act = ACTIVATIONS[cfg.activation]
        self.input_norm = _build_norm(cfg.input_norm, shape.dim, shape.norm_eps)
        self.w1 = nn.Linear(shape.dim, self.rank, bias=False)
        self.w2 = nn.Linear(self.rank, width, bias=False)
        self.output_norm = _build_norm(cfg.output_norm, width, shape.norm_eps)

    @staticmethod
    def bottleneck_width(cfg: Query, dim: int) -> int:
        """r = round(bottleneck_ratio * dim)."""
        return round(cfg.bottleneck_ratio * dim)

    @classmethod
    def check_config(cls, cfg: Query, shape: QueryShape) -> None:
        super().check_config(cfg, shape)
        if cfg.activation not in ACTIVATIONS:
            raise unknown_choice("model.query.activation", cfg.activation, list(ACTIVATIONS))
        for key, kind in (("input_norm", cfg.input_norm), ("output_norm", cfg.output_norm)):
            if kind not in QUERY_NORMS:
                raise unknown_choice(f"model.query.{key}", kind, list(QUERY_NORMS))
        rank = cls.bottleneck_width(cfg, shape.dim)
        if rank < 1:
            raise ConfigError(
                f"model.query.bottleneck_ratio={cfg.bottleneck_ratio} gives r = round({cfg.bottleneck_ratio}*"
                f"{shape.dim}) = {rank} < 1; raise model.query.bottleneck_ratio to at least {1 / shape.dim:.3g}"
            )

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X) ``[B, T, width]``."""
        return self.output_norm(self.w2(self.act(self.w1(self.input_norm(x)))))

    def branch_matrices(self) -> dict[str, nn.Linear]:
        """W1 and W2: f's bottleneck."""
        return {"w1": self.w1, "w2": self.w2}

    def norm_gains(self) -> dict[str, nn.Module]:
        """``gain_in`` (before W1) and ``gain_out`` (after W2), for the norms that are not "none"."""
        norms = {"gain_in": self.input_norm, "gain_out": self.output_norm}
        return {key: norm for key, norm in norms.items() if not isinstance(norm, nn.Identity)}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}"


@register_query("residual_mlp")
class ResidualMLPQuery(BottleneckBranch):
    """The paper's nonlinear query: Q(X) = (X + f(X)) / 2 with the bottleneck MLP f (:class:`BottleneckBranch`).

    The defaults are the paper's f(X) = LN(GELU(RMSNorm(X)·W1)·W2), r = d/2: W1 + W2 hold exactly the d²
    parameters of the W_Q it replaces, plus two norm gains. The 1/2 is ``half_scale`` (module doc).
    """

    knobs = ("activation", "input_norm", "output_norm", "bottleneck_ratio", "half_scale")
    requires_full_width = True

    def __init__(self, cfg: Query, shape: QueryShape) -> None:
        super().__init__(cfg, shape)
        self.scale = identity_term_scale(cfg)
        self.build_branch(cfg, shape, shape.dim)

    def residual_branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X), shape [B, T, dim]."""
        return self.branch(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.branch(x)) * self.scale


@register_query("anchored")
class AnchoredQuery(BottleneckBranch):
    """A pretrained model's query with the paper's nonlinear branch added: Q(X) = X·W_Q + f(X).

    For upcycling (arXiv 2603.13381, future work: "one could anchor to existing projections:
    Q = (X·W_Q + f(X))/2"). W_Q is the pretrained model's, f the paper's bottleneck MLP (d -> r -> q_dim) in
    the blocks ``layers`` names (the others keep X·W_Q alone). The paper's ½ is not applied: it would halve a
    query trained unhalved ((X·2W_Q + 2f(X))/2 is the same function). f starts at exactly zero (its last gain
    or W2 is zeroed), so an upcycled model computes the pretrained function until the first update.
    """

    knobs = ("activation", "input_norm", "output_norm", "bottleneck_ratio", "layers", "train_anchor")
    upcycles_from = ("linear",)

    def __init__(self, cfg: Query, shape: QueryShape) -> None:
        super().__init__(cfg, shape)
        self.train_anchor = cfg.train_anchor
        self.w_q = nn.Linear(shape.dim, self.q_dim, bias=False)
        self.w_q.weight.requires_grad_(cfg.train_anchor)
        self.has_branch = any(lo <= shape.layer <= hi for lo, hi in layer_ranges(cfg.layers, shape.n_layers))
        if self.has_branch:
            self.build_branch(cfg, shape, self.q_dim)
        else:
            self.rank = 0

    @classmethod
    def check_config(cls, cfg: Query, shape: QueryShape) -> None:
        super().check_config(cfg, shape)
        layer_ranges(cfg.layers, shape.n_layers)

    def init_weights(self, init_std: float) -> None:
        """W_Q, W1, W2 ~ N(0, init_std), input gain 1; f's last scale zero, so that f(X) = 0 at init."""
        super().init_weights(init_std)
        if self.has_branch:
            last = self.w2 if isinstance(self.output_norm, nn.Identity) else self.output_norm
            nn.init.zeros_(last.weight)

    def branch_matrices(self) -> dict[str, nn.Linear]:
        """W1 and W2 of f, in the blocks that have it."""
        return super().branch_matrices() if self.has_branch else {}

    def norm_gains(self) -> dict[str, nn.Module]:
        return super().norm_gains() if self.has_branch else {}

    def fused_qkv_weight(self) -> torch.Tensor:
        """W_Q: drawn with W_K, W_V as one matrix under the paper init, as the linear query's."""
        return self.w_q.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A frozen anchor is detached here too, not only by requires_grad: loaders that replace the
        # parameter (transformers' from_pretrained) would otherwise let fine-tuning move it.
        weight = self.w_q.weight if self.train_anchor else self.w_q.weight.detach()
        q = F.linear(x, weight)
        return q + self.branch(x) if self.has_branch else q

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, has_branch={self.has_branch}"
