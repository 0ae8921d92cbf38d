"""The decoder every family shares, and its one forward: embeddings, positions, the blocks, final norm, LM head.

The family's blocks (``model.layers``) come from its spec (models/family.py: :func:`~.family.build_model`, the
one constructor). The same :meth:`Decoder.forward` serves training (``targets`` give the loss), sampling (a
:class:`~.layers.KVCache`) and the Hugging Face wrapper (transformers' cache, a padding mask, per-row positions,
hidden states): there is no second block loop. Parallelism, logging and files are applied from outside, block
by block, through ``model.layers``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from .args import ModelArgs
from .errors import ConfigError
from .layers import Cache, build_norm
from .lm_loss import HeadLoss
from .mup import base_model_args, scale_initial_weights
from .rope import RotaryEmbedding, rope_scaling

#: ``block(args, layer)``: the family's builder of block ``layer``.
BlockBuilder = Callable[[ModelArgs, int], nn.Module]
#: The initialisations every family has (``model.init``); a family adds its own (``Family.init_schemes``).
BUILT_IN_INITS = ("torchnlq", "depth")


def _uninitialised_embedding(num: int, dim: int) -> nn.Embedding:
    """An Embedding that skips its own init (init_weights sets it): its ``normal_`` on a meta tensor
    imports torch._dynamo, seconds of start-up for a tool that only loads weights."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


def attention_mask_4d(padding_mask: torch.Tensor, past: int, seq_len: int) -> torch.Tensor:
    """Boolean ``[B, 1, T, past + T]``: causal in absolute positions, padded keys (``padding_mask`` 0) hidden,
    and every query sees itself.

    A padding query (left padding) would otherwise see no key at all: SDPA would give NaN there, and the NaN
    would reach real tokens through 0·NaN in later layers. Its own output is never used.
    """
    total = past + seq_len
    q_pos = torch.arange(past, total, device=padding_mask.device)[:, None]
    k_pos = torch.arange(total, device=padding_mask.device)[None, :]
    keep = (k_pos <= q_pos) & padding_mask[:, None, None, :].bool()
    return keep | (k_pos == q_pos)


class Decoder(nn.Module):
    """The model: ``forward(tokens [B, T]) -> logits [B, T, vocab_size]``.

    Construction allocates on the default device and runs :meth:`init_weights`; under ``torch.device("meta")``
    the caller does (``to_empty`` then ``init_weights``). :meth:`init_weights` is the only consumer of the RNG,
    so both paths give identical weights for the same seed.
    """

    #: Parameter roles (models/roles.py): the untied LM head is the readout.
    child_components: ClassVar[dict[str, str]] = {"lm_head": "head"}

    def __init__(self, args: ModelArgs, block: BlockBuilder,
                 init_schemes: Mapping[str, Callable[[Decoder], None]] | None = None,
                 builder: Callable[[ModelArgs], Decoder] | None = None) -> None:
        super().__init__()
        args.validate()
        self.args = args
        #: The family's own initialisations by ``model.init`` name (the dense family's "paper").
        self.init_schemes = dict(init_schemes or {})
        #: The constructor that built this model, for the same model at another width (:meth:`at_base_width`).
        self.builder = builder
        if args.init not in (*BUILT_IN_INITS, *self.init_schemes):
            raise ConfigError(f"model.init={args.init!r} is not an initialisation of model.family = "
                              f"'{args.family}'; use one of {', '.join((*BUILT_IN_INITS, *self.init_schemes))}")
        device = torch.get_default_device()
        # Build on meta so that nn.Linear/nn.Embedding skip their own random init: it would
        # advance the RNG (breaking meta == eager) and be thrown away by init_weights anyway.
        with torch.device("meta"):
            self.tok_emb = _uninitialised_embedding(args.vocab_size, args.dim)
            self.pos_emb = _uninitialised_embedding(args.max_seq_len, args.dim) if args.positions == "learned" else None
            self.rope = (
                RotaryEmbedding(args.head_dim, args.max_seq_len, args.rope_theta, rope_scaling(args))
                if args.positions == "rope" else None
            )
            self.layers = nn.ModuleList(block(args, layer) for layer in range(args.n_layers))
            self.ln_f = build_norm(args, args.dim)
            # A tied head is no module at all: forward reuses tok_emb.weight, so the weight is
            # one tensor in state_dict and stays shared through to_empty and sharding.
            self.lm_head = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        # The head's cross-entropy, given targets; no parameters (compiled from outside, like the blocks).
        self.head_loss = HeadLoss()
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer in place from the global RNG, in a fixed order.

        nanoGPT's scheme: every Linear and Embedding N(0, init_std); the out-projections into the
        residual stream N(0, init_std / sqrt(2 n_layers)) so its variance does not grow with depth;
        norm gains 1; RoPE tables recomputed (not in checkpoints, garbage after to_empty). Each block draws
        its own (``init_weights(init_std, residual_std)``). A family's own scheme (:attr:`init_schemes`: the dense
        family's ``paper`` draws the same in the paper's order, models/dense/paper_init.py) replaces all of it.
        """
        if self.args.init in self.init_schemes:
            self.init_schemes[self.args.init](self)
            self._scale_for_width()
            return
        std = self.args.init_std
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=std)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb.weight, mean=0.0, std=std)
        if self.rope is not None:
            self.rope.init_weights()
        for index, layer in enumerate(self.layers):
            depth = index + 1 if self.args.init == "depth" else self.args.n_layers
            layer.init_weights(std, std / math.sqrt(2 * depth))
        self.ln_f.reset_parameters()
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=std)
        self._scale_for_width()

    def at_base_width(self) -> Decoder:
        """The same family's model at µP's base width, under the standard parametrization (models/mup.py), on the
        current default device, from the constructor that built this one (:func:`~torchnlq.models.build_model`)."""
        if self.builder is None:
            raise ConfigError("model.parametrization='mup' compares the model with itself at its base width: build it "
                              "with torchnlq.models.build_model(args)")
        return self.builder(base_model_args(self.args))

    def _scale_for_width(self) -> None:
        """µP: the hidden matrices as drawn, times 1/sqrt(their fan-in multiplier) (models/mup.py)."""
        if self.args.parametrization == "mup":
            scale_initial_weights(self)

    def forward(
        self, tokens: torch.Tensor | None, targets: torch.Tensor | None = None, *, cache: Cache | None = None,
        positions: torch.Tensor | None = None, padding_mask: torch.Tensor | None = None,
        embeds: torch.Tensor | None = None, hidden_states: list[torch.Tensor] | None = None,
        last_positions: int = 0, loss_chunk_tokens: int = 0,
    ) -> torch.Tensor:
        """Logits [B, T, vocab_size] for token ids ``tokens`` [B, T] (or their embeddings ``embeds`` [B, T, dim]).

        - ``targets`` ([B, T] ids): the mean cross-entropy instead (an fp32 scalar), from the full logits or
          through the head ``loss_chunk_tokens`` tokens at a time (models/lm_loss.py); computed in the model's own
          forward so that FSDP has gathered the head's weight when it runs.
        - ``cache``: the tokens continue the cached sequence (positions from ``cache.get_seq_length()``), attend
          to every cached position, and are added to it.
        - ``positions`` ([B or 1, T]): each token's position, when not past..past+T-1 (a left-padded batch).
        - ``padding_mask`` ([B, past + T], 1 = token, 0 = padding): padded keys are not attended to.
        - ``hidden_states``: a list that receives the embeddings and every block's output.
        - ``last_positions`` > 0: logits of the last positions only (generation needs one).
        """
        x = self.tok_emb(tokens) if embeds is None else embeds
        mup = self.args.parametrization == "mup"
        batch, seq_len = x.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        if past + seq_len > self.args.max_seq_len:
            raise ValueError(f"sequence length {past + seq_len} exceeds the model's "
                             f"max_seq_len={self.args.max_seq_len}")
        rope = None
        if self.pos_emb is not None:
            where = positions if positions is not None else torch.arange(past, past + seq_len, device=x.device)
            x = x + self.pos_emb(where)
        elif positions is not None:
            rope = self.rope.at(positions)  # per-row tables [B, T, head_dim]
        else:
            rope = self.rope.span(past, seq_len)
        mask = None
        if padding_mask is not None:
            mask = attention_mask_4d(padding_mask, past, seq_len)
        elif past > 0 and seq_len > 1:  # new tokens after cached ones: SDPA's is_causal would align them top-left
            mask = attention_mask_4d(torch.ones(batch, past + seq_len, dtype=torch.bool, device=x.device), past,
                                     seq_len)
        if mup:  # µP's input multiplier (models/mup.py); the standard model has none
            x = x * self.args.mup_input_multiplier
        if hidden_states is not None:
            hidden_states.append(x)
        for layer in self.layers:
            x = layer(x, rope) if cache is None and mask is None else layer(x, rope, cache, mask)
            if hidden_states is not None:
                hidden_states.append(x)
        x = self.ln_f(x)
        if mup:  # the readout's multiplier / m, on the head's input: the same logits, whichever loss path
            x = x * (self.args.mup_output_multiplier / self.args.width_multiplier)
        weight = self.head_weight()
        if targets is not None:
            return self.head_loss(x, weight, targets, loss_chunk_tokens)
        if last_positions:
            x = x[:, -last_positions:]
        return F.linear(x, weight)

    def head_weight(self) -> torch.Tensor:
        """The LM head's weight [vocab_size, dim]: the token embedding when tied."""
        return self.tok_emb.weight if self.lm_head is None else self.lm_head.weight

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters actually allocated (shared tensors once), optionally minus token/position embeddings."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                total -= self.pos_emb.weight.numel()
        return total
