"""torchnlq's model as a Hugging Face transformers model: a thin wrapper around ``torchnlq.models``.

``--format hf`` ships it beside the model package's files (:mod:`torchnlq.interop.ship_code`);
docs/checkpoints.md describes the config.json names, weights and generation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def _torchao_quiet() -> Iterator[None]:
    """transformers' model classes import its quantizers, which import torchao when it is installed: torchao then
    reports its CUDA-only libraries and torch's pytree deprecations on the stderr of a process that never uses it."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


with _torchao_quiet():
    from transformers import Cache, DynamicCache, GenerationMixin, PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast

from torchnlq.models import ModelArgs, build_model
from torchnlq.models.rope import RotaryEmbedding

# torchnlq-export: plugin imports (the export adds one line per plugin module it ships)


#: ModelArgs fields stored under transformers' usual config.json name; the others keep their own name.
CONFIG_NAMES = {
    "n_layers": "num_hidden_layers",
    "dim": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "mlp_hidden": "intermediate_size",
    "max_seq_len": "max_position_embeddings",
    "tie_embeddings": "tie_word_embeddings",
    "init_std": "initializer_range",
}
#: ModelArgs fields that say how weights start, not what the model computes: not in config.json.
NOT_IN_CONFIG = ("init",)


def sections() -> list[str]:
    """The ModelArgs fields that are sections (the query, each registered family's): objects in config.json."""
    return [f.name for f in dataclasses.fields(ModelArgs) if f.default_factory is not dataclasses.MISSING]


def model_fields() -> dict[str, str]:
    """Every ModelArgs field in config.json -> its config.json name."""
    return {f.name: CONFIG_NAMES.get(f.name, f.name) for f in dataclasses.fields(ModelArgs)
            if f.name not in NOT_IN_CONFIG}


class TorchnlqConfig(PretrainedConfig):
    """The shapes and knobs of one torchnlq model; :meth:`model_args` validates them (a ConfigError, one line)."""

    model_type = "torchnlq"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(self, tie_word_embeddings: bool = True, use_cache: bool = True, **kwargs: Any) -> None:
        # A field not given takes its ModelArgs default (None for the derived ones: n_kv_heads, head_dim, ...):
        # a config.json written before a field existed describes a model without that option.
        defaults = {f.name: f.default for f in dataclasses.fields(ModelArgs) if f.default is not dataclasses.MISSING}
        for field, name in model_fields().items():
            if name != "tie_word_embeddings":
                setattr(self, name, kwargs.pop(name, defaults.get(field)))
        for name in sections():  # the query and each family's section are JSON objects in config.json
            setattr(self, name, dict(getattr(self, name) or {}))
        self.use_cache = use_cache
        # Through the base class: transformers 4.x sets tie_word_embeddings there.
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        resolved = self.model_args()  # refuses what torchnlq cannot build, before any weight exists
        self.num_key_value_heads, self.head_dim = resolved.n_kv_heads, resolved.head_dim
        self.intermediate_size = resolved.mlp_hidden

    def model_args(self) -> ModelArgs:
        """The torchnlq ModelArgs these fields describe."""
        return ModelArgs.from_dict({field: getattr(self, name) for field, name in model_fields().items()})


# transformers 5 names the cache ``cache``; 4.x called it ``past_key_values`` (in inputs and outputs).
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class TorchnlqForCausalLM(PreTrainedModel, GenerationMixin):
    """A torchnlq model (``self.model``): ``forward(input_ids, ...) -> CausalLMOutputWithPast``."""

    config_class = TorchnlqConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _supports_cache_class = True  # transformers 4.x asks before generate() creates a DynamicCache

    def __init__(self, config: TorchnlqConfig) -> None:
        super().__init__(config)
        self.model = build_model(config.model_args())
        self._no_split_modules = [type(self.model.layers[0]).__name__]  # accelerate's device_map keeps a block whole
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        # torchnlq's model initialises itself when built; only the RoPE tables (buffers outside the
        # weights file) are recomputed when transformers materialises a model built on meta.
        if isinstance(module, RotaryEmbedding):
            module.init_weights()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.tok_emb

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.tok_emb = value

    def get_output_embeddings(self) -> torch.nn.Module | None:
        return self.model.lm_head  # None when tied: the head reads tok_emb.weight, stored once

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
        cache = (cache if cache is not None else DynamicCache()) if use_cache else None
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        args = self.model.args
        batch, seq_len = (input_ids if inputs_embeds is None else inputs_embeds).shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        if past + seq_len > args.max_seq_len:
            raise ValueError(f"sequence length {past + seq_len} exceeds the model's max_position_embeddings="
                             f"{args.max_seq_len}")
        if attention_mask is not None and (attention_mask.ndim != 2 or attention_mask.shape[-1] != past + seq_len):
            raise ValueError(
                f"attention_mask must be [batch, past + new tokens] = [{batch}, {past + seq_len}] "
                f"(1 for tokens, 0 for padding), got {list(attention_mask.shape)}"
            )
        positions = self._positions(position_ids, attention_mask, kwargs.get("cache_position"), seq_len)
        hidden = [] if output_hidden_states else None
        # The model's own forward: transformers' Cache is the cache protocol it asks for.
        logits = self.model(input_ids, cache=cache, positions=positions, padding_mask=attention_mask,
                            embeds=inputs_embeds, hidden_states=hidden,
                            last_positions=logits_to_keep if labels is None else 0)
        loss = None
        if labels is not None:  # transformers' shifted cross-entropy in fp32 (sum / num_items under its Trainer)
            loss = self.loss_function(logits, labels, logits.shape[-1], kwargs.get("num_items_in_batch"))
        hidden_states = tuple(hidden) if hidden else None
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if not return_dict:
            return tuple(v for v in (loss, logits, cache, hidden_states) if v is not None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=hidden_states, **{_CACHE_FIELD: cache})

    @staticmethod
    def _positions(position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                   cache_position: torch.Tensor | None, seq_len: int) -> torch.Tensor | None:
        """Positions ``[B or 1, T]``: given ones, else counted from each row's first real token, else (None) the
        model's own past..past+T-1."""
        if position_ids is not None:
            return position_ids
        if attention_mask is not None:
            counted = attention_mask.long().cumsum(-1) - 1
            return counted.clamp(min=0)[:, -seq_len:]  # padding takes position 0; it is masked anyway
        if cache_position is not None:  # transformers 4.x passes the absolute positions of the new tokens
            return cache_position[None]
        return None


# save_pretrained() of a loaded model copies this file (and the files it imports) beside the weights and
# writes the auto_map, so a fine-tuned copy loads with trust_remote_code=True as the export does.
TorchnlqConfig.register_for_auto_class()
TorchnlqForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["CONFIG_NAMES", "TorchnlqConfig", "TorchnlqForCausalLM"]
