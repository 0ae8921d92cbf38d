"""torchnlq's GPT as a Hugging Face transformers model, for every query type (self-contained).

This file imports only torch, transformers and the standard library: it is copied into
every ``--format hf`` export (``scripts/convert_checkpoint.py``), where
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` runs it without
torchnlq installed. It is an independent, compact re-implementation of
``torchnlq/models/gpt.py``; tests/test_hf_model.py checks that both give the same logits.

The network (pre-LN GPT; no biases unless ``bias``, GPT-2's, for imported GPT-2 weights)::

    x = tok_emb(ids) [+ pos_emb(positions)]                  learned positions, or RoPE on q, k
    for each block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
    logits = ln_f(x) · Wᵀ                                      W = tok_emb.weight when tied, else lm_head.weight

    attn(X):  q = Q(X) [+ q_bias] split into heads, [k | v] = X·W_kvᵀ (n_kv_heads each, GQA),
              softmax(q·kᵀ / sqrt(head_dim) + causal/padding mask) · v, then proj
    mlp(X):   proj(GELU(fc(X)))                                 exact erf GELU, or tanh (mlp_activation)

The query Q(X) (``config.query["type"]``; ``s`` = 1/2 with ``half_scale``, else 1;
f(X) = out_norm(act(in_norm(X)·W1ᵀ)·W2ᵀ), the paper's bottleneck MLP, arXiv 2603.13381):

    linear         X·W_Qᵀ
    identity       s·X
    residual       s·(X + X·W_Qᵀ)                               W_Q: d x d
    residual_mlp   s·(X + f(X))
    anchored       X·W_Qᵀ + f(X) in the blocks ``layers`` names, X·W_Qᵀ in the others

``fuse_kv`` (torchnlq's fused X·[W_K | W_V | diag(g)·W1] matmul) is a speed-up with the same
parameters and the same function, so it is accepted and computed unfused here.

Weight names are torchnlq's own state-dict names under ``model.`` (``model.tok_emb.weight``,
``model.layers.0.attn.query.w1.weight`` ...); an untied head is ``lm_head.weight``. A tied head
is not a module at all: the forward reads ``model.tok_emb.weight``, as torchnlq does, so the
weight is stored once and no transformers tying machinery is involved.

Config fields (:class:`TorchnlqConfig`) use transformers' usual names where one exists:
hidden_size (torchnlq's dim), num_hidden_layers (n_layers), num_attention_heads (n_heads),
num_key_value_heads (n_kv_heads), head_dim, intermediate_size (mlp_hidden),
max_position_embeddings (max_seq_len), tie_word_embeddings (tie_embeddings),
initializer_range (init_std); and torchnlq's for the rest: positions, rope_theta, norm_eps,
bias, mlp_activation and ``query``, the ``[model.query]`` table as a dict.

Generation: keys and values go through transformers' ``Cache`` (``cache.update(k, v, layer)``);
positions come from ``position_ids``, else from the 2-D ``attention_mask`` (left padding: a row's
first real token is position 0), else from the cache length. Padded keys are never attended to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Cache, DynamicCache, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

#: The query types this file implements (torchnlq's registry; a test keeps the two in step).
QUERY_TYPES = ("linear", "identity", "residual", "residual_mlp", "anchored")
#: Types whose query contains X itself: they need n_heads * head_dim == hidden_size and read half_scale.
CONTAINS_X = ("identity", "residual", "residual_mlp")
#: Types with the bottleneck MLP f (its activation, norms and width are checked).
WITH_BRANCH = ("residual_mlp", "anchored")
#: The ``[model.query]`` fields and their torchnlq defaults; a query dict with any other key is refused.
QUERY_DEFAULTS: dict[str, Any] = {
    "type": "linear",
    "activation": "gelu",
    "input_norm": "rms",
    "output_norm": "layer",
    "bottleneck_ratio": 0.5,
    "half_scale": True,
    "fuse_kv": False,
    "layers": "all",
    "train_anchor": True,
}


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


#: Activations of residual_mlp's f ("gelu" is the exact erf form).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": gelu_tanh,
    "relu": F.relu,
    "relu2": relu_squared,
    "silu": F.silu,
}
NORMS = ("rms", "layer", "none")
POSITIONS = ("learned", "rope")
#: The transformer MLP's activation: exact erf GELU (torchnlq's), or the tanh form (GPT-2's gelu_new).
MLP_ACTIVATIONS = ("gelu", "gelu_tanh")


def bottleneck_width(config: TorchnlqConfig) -> int:
    """r = round(bottleneck_ratio * hidden_size), the width of f's W1 and W2."""
    return round(config.query["bottleneck_ratio"] * config.hidden_size)


def branch_layers(spec: str, n_layers: int) -> set[int]:
    """The blocks whose anchored query has f: ``layers`` is "all" or indices and ranges such as "0-5,8"."""
    text = str(spec).strip().lower()
    if text == "all":
        return set(range(n_layers))
    chosen: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"query layers={spec!r} is not 'all' nor block indices like '0-5' or '0,3,11'") from None
        if not 0 <= first <= last < n_layers:
            raise ValueError(f"query layers={spec!r} names blocks outside 0..{n_layers - 1}")
        chosen.update(range(first, last + 1))
    return chosen


class TorchnlqConfig(PretrainedConfig):
    """The shapes and knobs of one torchnlq GPT (see the module docstring for the names).

    ``num_key_value_heads``, ``head_dim`` and ``intermediate_size`` may be None: they then
    become num_attention_heads, hidden_size // num_attention_heads and 4 * hidden_size.
    A configuration this file cannot compute is a ValueError here, before any weight exists.
    """

    model_type = "torchnlq"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(
        self,
        vocab_size: int = 256,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        intermediate_size: int | None = None,
        max_position_embeddings: int = 256,
        positions: str = "learned",
        rope_theta: float = 10000.0,
        norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        bias: bool = False,
        mlp_activation: str = "gelu",
        query: dict[str, Any] | None = None,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.head_dim = hidden_size // max(num_attention_heads, 1) if head_dim is None else head_dim
        self.intermediate_size = 4 * hidden_size if intermediate_size is None else intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.positions = positions
        self.rope_theta = rope_theta
        self.norm_eps = norm_eps
        self.initializer_range = initializer_range
        self.bias = bias
        self.mlp_activation = mlp_activation
        self.query = {**QUERY_DEFAULTS, **(query or {})}
        self.use_cache = use_cache
        self.check()
        # Through the base class: transformers 4.x sets tie_word_embeddings there (default True).
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def check(self) -> None:
        """Raise ValueError for a model this file does not implement or whose shapes cannot work."""
        q = self.query
        unknown = sorted(set(q) - set(QUERY_DEFAULTS))
        if unknown:
            raise ValueError(
                f"query has keys {unknown} that this modeling_torchnlq.py does not know (a newer torchnlq "
                "wrote it?); export the model again with the torchnlq that trained it"
            )
        if q["type"] not in QUERY_TYPES:
            raise ValueError(
                f"query type {q['type']!r} is not implemented by this modeling_torchnlq.py "
                f"(it implements {', '.join(QUERY_TYPES)}); export the model with the torchnlq that trained it"
            )
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                    "intermediate_size", "vocab_size", "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be at least 1")
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if not 1 <= kv_heads <= heads or heads % kv_heads:
            raise ValueError(f"num_key_value_heads={kv_heads} must divide num_attention_heads={heads}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions={self.positions!r} is not one of {', '.join(POSITIONS)}")
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise ValueError(f"mlp_activation={self.mlp_activation!r} is not one of {', '.join(MLP_ACTIVATIONS)}")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"positions='rope' needs an even head_dim, got {self.head_dim}")
        if q["type"] in CONTAINS_X and heads * self.head_dim != self.hidden_size:
            raise ValueError(
                f"query type {q['type']!r} needs num_attention_heads * head_dim == hidden_size "
                f"({heads} * {self.head_dim} != {self.hidden_size})"
            )
        if q["type"] == "anchored":
            branch_layers(q["layers"], self.num_hidden_layers)
        if q["type"] in WITH_BRANCH:
            if q["activation"] not in ACTIVATIONS:
                raise ValueError(f"query activation {q['activation']!r} is not one of {', '.join(ACTIVATIONS)}")
            for key in ("input_norm", "output_norm"):
                if q[key] not in NORMS:
                    raise ValueError(f"query {key}={q[key]!r} is not one of {', '.join(NORMS)}")
            if bottleneck_width(self) < 1:
                raise ValueError(f"query bottleneck_ratio={q['bottleneck_ratio']} gives a bottleneck of width 0")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · g, computed in at least fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.to(xf.dtype)).to(x.dtype)


def build_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """A gain-only norm ("rms", "layer": LayerNorm without bias) or nothing ("none")."""
    if kind == "rms":
        return RMSNorm(dim, eps)
    if kind == "layer":
        return nn.LayerNorm(dim, eps=eps, bias=False)
    return nn.Identity()


class Query(nn.Module):
    """Q(X) ``[B, T, n_heads * head_dim]`` from the block input X ``[B, T, hidden_size]`` (block ``layer``)."""

    def __init__(self, config: TorchnlqConfig, layer: int) -> None:
        super().__init__()
        q, d, q_dim = config.query, config.hidden_size, config.num_attention_heads * config.head_dim
        self.kind = q["type"]
        self.scale = 0.5 if self.kind in CONTAINS_X and q["half_scale"] else 1.0
        if self.kind in ("linear", "anchored"):
            self.w_q = nn.Linear(d, q_dim, bias=False)
        elif self.kind == "residual":
            self.w_q = nn.Linear(d, d, bias=False)
        self.has_branch = self.kind == "residual_mlp" or (
            self.kind == "anchored" and layer in branch_layers(q["layers"], config.num_hidden_layers))
        # anchored's train_anchor = false: fine-tuning leaves the pretrained W_Q as it is. The forward
        # detaches it (requires_grad set here would not survive from_pretrained), so it gets no gradient.
        self.frozen_anchor = self.kind == "anchored" and not q["train_anchor"]
        if self.has_branch:  # f: d -> r -> q_dim (= d for residual_mlp)
            r = bottleneck_width(config)
            self.act = ACTIVATIONS[q["activation"]]
            self.input_norm = build_norm(q["input_norm"], d, config.norm_eps)
            self.w1 = nn.Linear(d, r, bias=False)
            self.w2 = nn.Linear(r, q_dim, bias=False)
            self.output_norm = build_norm(q["output_norm"], q_dim, config.norm_eps)

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(X) = out_norm(act(in_norm(X)·W1ᵀ)·W2ᵀ)."""
        return self.output_norm(self.w2(self.act(self.w1(self.input_norm(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind in ("linear", "anchored"):
            q = F.linear(x, self.w_q.weight.detach() if self.frozen_anchor else self.w_q.weight)
            return q + self.branch(x) if self.has_branch else q
        if self.kind == "identity":
            q = x
        elif self.kind == "residual":
            q = x + self.w_q(x)
        else:
            q = x + self.branch(x)
        return q * self.scale if self.scale != 1.0 else q


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[B, 1, T, head_dim]`` (fp32) for positions ``[B, T]``: rotate-half RoPE.

    Angles m·θ_i with θ_i = theta^(-2i/head_dim), each repeated for channels i and i + head_dim/2,
    computed in float64 (m·θ at large m loses digits in float32), as torchnlq does.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float64) / head_dim)
    angles = position_ids.to(torch.float64)[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)[:, None]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate heads ``[B, H, T, head_dim]``: x·cos + [-x2, x1]·sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)


class Attention(nn.Module):
    """Causal self-attention: the query above, one K,V projection (K rows first), SDPA, out-projection."""

    def __init__(self, config: TorchnlqConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.query = Query(config, layer_idx)
        # With bias (GPT-2's): one bias on the query's output, whatever the query type computes.
        self.q_bias = nn.Parameter(torch.zeros(self.n_heads * self.head_dim)) if config.bias else None
        self.kv = nn.Linear(config.hidden_size, 2 * self.n_kv_heads * self.head_dim, bias=config.bias)
        self.proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=config.bias)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor | None,
        cache: Cache | None,
    ) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        q = self.query(x) if self.q_bias is None else self.query(x) + self.q_bias
        q = q.view(batch, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).split(self.n_kv_heads * self.head_dim, dim=-1)
        k = k.view(batch, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq_len, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # every key and value so far
        if self.n_kv_heads != self.n_heads:  # GQA: query head h reads kv head h // (n_heads / n_kv_heads)
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        # mask None: a plain causal prefill (is_causal); otherwise a boolean [B, 1, T, S] "may attend".
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and seq_len > 1)
        return self.proj(y.transpose(1, 2).reshape(batch, seq_len, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """proj(GELU(fc(x))): exact erf GELU, or the tanh form with mlp_activation = "gelu_tanh"."""

    def __init__(self, config: TorchnlqConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.bias)
        self.approximate = "tanh" if config.mlp_activation == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))


class Block(nn.Module):
    """Pre-LN block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: TorchnlqConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.bias)
        self.attn = Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rope: Any, mask: torch.Tensor | None, cache: Cache | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope, mask, cache)
        return x + self.mlp(self.ln_2(x))


class TorchnlqDecoder(nn.Module):
    """Embeddings, blocks and the final norm: torchnlq's GPT without its head (the ``model.`` weights)."""

    def __init__(self, config: TorchnlqConfig) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.positions == "learned":
            self.pos_emb = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.bias)


def attention_mask_4d(padding_mask: torch.Tensor, past: int, seq_len: int) -> torch.Tensor:
    """Boolean ``[B, 1, T, past + T]``: causal, padded keys hidden, and every query sees itself.

    A padding query (left padding) would otherwise see no key at all: SDPA would give NaN there,
    and the NaN would reach real tokens through 0·NaN in later layers. Its own output is never used.
    """
    total = past + seq_len
    q_pos = torch.arange(past, total, device=padding_mask.device)[:, None]
    k_pos = torch.arange(total, device=padding_mask.device)[None, :]
    keep = (k_pos <= q_pos) & padding_mask[:, None, None, :].bool()
    return keep | (k_pos == q_pos)


# transformers 5 names the cache ``cache``; 4.x called it ``past_key_values`` (in inputs and outputs).
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class TorchnlqForCausalLM(PreTrainedModel, GenerationMixin):
    """A torchnlq GPT with its LM head: ``forward(input_ids, ...) -> CausalLMOutputWithPast``."""

    config_class = TorchnlqConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _supports_cache_class = True  # transformers 4.x asks before generate() creates a DynamicCache

    def __init__(self, config: TorchnlqConfig) -> None:
        super().__init__(config)
        self.model = TorchnlqDecoder(config)
        # Tied: no module; the forward reads model.tok_emb.weight (stored once, as in torchnlq).
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.tok_emb

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.tok_emb = value

    def get_output_embeddings(self) -> nn.Module | None:
        return self.lm_head

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits ``[B, T, vocab_size]`` (the last ``logits_to_keep`` positions when > 0) for ``input_ids [B, T]``.

        ``attention_mask [B, past + T]`` (1 = token, 0 = padding) hides padded keys and, without
        ``position_ids``, numbers each row's positions from its first token. ``labels [B, T]`` adds the
        mean next-token cross-entropy of logits[:, :-1] against labels[:, 1:], -100 ignored.
        """
        if kwargs.get("output_attentions"):
            raise ValueError("output_attentions is not supported: attention runs in scaled_dot_product_attention")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, Cache):
            raise ValueError(f"the cache must be a transformers Cache (e.g. DynamicCache), not {type(cache).__name__}")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache()
        if not use_cache:
            cache = None  # e.g. generate(use_cache=False): every step recomputes the whole sequence
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.model.tok_emb(input_ids) if inputs_embeds is None else inputs_embeds
        batch, seq_len = x.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        if past + seq_len > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {past + seq_len} exceeds the model's max_position_embeddings="
                f"{self.config.max_position_embeddings}"
            )
        if attention_mask is not None and (attention_mask.ndim != 2 or attention_mask.shape[-1] != past + seq_len):
            raise ValueError(
                f"attention_mask must be [batch, past + new tokens] = [{batch}, {past + seq_len}] "
                f"(1 for tokens, 0 for padding), got {list(attention_mask.shape)}"
            )
        position_ids = self._positions(position_ids, attention_mask, kwargs.get("cache_position"), past, seq_len, x.device)
        if self.config.positions == "learned":
            x = x + self.model.pos_emb(position_ids)
            rope = None
        else:
            rope = rope_tables(position_ids, self.config.head_dim, self.config.rope_theta)
        if attention_mask is not None:
            mask = attention_mask_4d(attention_mask, past, seq_len)
        elif past > 0 and seq_len > 1:  # new tokens after cached ones: causal in absolute positions
            mask = attention_mask_4d(torch.ones(batch, past + seq_len, dtype=torch.bool, device=x.device), past, seq_len)
        else:
            mask = None  # a prefill from position 0 (causal), or one new token that may see every cached one
        hidden = [x] if output_hidden_states else None
        for block in self.model.layers:
            x = block(x, rope, mask, cache)
            if hidden is not None:
                hidden.append(x)
        x = self.model.ln_f(x)
        if logits_to_keep and labels is None:  # generate asks for the last position only
            x = x[:, -logits_to_keep:]
        weight = self.model.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, weight)
        loss = self._loss(logits, labels, kwargs.get("num_items_in_batch")) if labels is not None else None
        hidden_states = tuple(hidden) if hidden else None
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if not return_dict:
            return tuple(v for v in (loss, logits, cache, hidden_states) if v is not None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=hidden_states, **{_CACHE_FIELD: cache})

    @staticmethod
    def _positions(
        position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, cache_position: torch.Tensor | None,
        past: int, seq_len: int, device: torch.device,
    ) -> torch.Tensor:
        """Positions ``[B or 1, T]``: given ones, else counted from each row's first real token, else past..past+T-1."""
        if position_ids is not None:
            return position_ids
        if attention_mask is not None:
            counted = attention_mask.long().cumsum(-1) - 1
            return counted.clamp(min=0)[:, -seq_len:]  # padding takes position 0; it is masked anyway
        if cache_position is not None:  # transformers 4.x passes the absolute positions of the new tokens
            return cache_position[None]
        return torch.arange(past, past + seq_len, device=device)[None]

    @staticmethod
    def _loss(logits: torch.Tensor, labels: torch.Tensor, num_items: int | torch.Tensor | None) -> torch.Tensor:
        """Next-token cross-entropy in fp32; ``num_items`` (transformers' Trainer) turns the mean into sum / num_items."""
        logits = logits[:, :-1].float()
        targets = labels[:, 1:].to(logits.device)
        reduction = "mean" if num_items is None else "sum"
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                               reduction=reduction)
        return loss if num_items is None else loss / num_items


# save_pretrained() of a loaded model copies this file beside the weights and writes the auto_map, so a
# fine-tuned copy loads with trust_remote_code=True as the export does.
TorchnlqConfig.register_for_auto_class()
TorchnlqForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["ACTIVATIONS", "NORMS", "QUERY_DEFAULTS", "QUERY_TYPES", "TorchnlqConfig", "TorchnlqForCausalLM"]
