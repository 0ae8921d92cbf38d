"""``model.init = "paper"``: the initial weights of the paper's training script, bit for bit.

The paper's code (arXiv 2603.13381; github.com/MarkoKarbevski/beyond_query_linearity, its
``model.py``, nanoGPT's) seeds the global generator, builds its model on the CPU and
initialises it. Every random number it draws, in order:

1. The module constructors, all thrown away: ``nn.Embedding`` draws N(0, 1) for the token
   and position tables, ``nn.Linear`` draws kaiming-uniform (a = sqrt 5). Construction
   order: wte, wpe, then per block ``c_attn`` (one fused matrix: Q, K, V rows, or K, V only
   for the query types without a W_Q), ``c_proj`` (attention out), the query's own linears
   (``residual_in``, ``residual_out``), ``c_fc``, ``mlp.c_proj``; last the LM head, which
   is built even when it is then tied to wte.
2. ``apply(_init_weights)``, children before their parent: N(0, 0.02) for every Embedding
   and Linear in the same order. A tied head is drawn twice, as wte and then as the head;
   the second draw is the one that stays.
3. N(0, 0.02 / sqrt(2 n_layers)) once more for every ``c_proj`` (attention out, MLP down),
   block by block.

The distributions are those of the default init (:meth:`Decoder.init_weights`); only the
sequence of draws differs. The same procedure is applied to configurations the paper's
code lacks (GQA, RoPE, other norms or widths): it is the paper's only where the paper has
the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import ConfigError
from ..query import PaperQKVRows, claims

if TYPE_CHECKING:
    from ..decoder import Decoder
    from .block import Block

Fill = Callable[[torch.Tensor], object]


def _draw(parts: Sequence[torch.Tensor], fill: Fill) -> None:
    """One draw of the paper's tensor that ``parts`` are the row blocks of, copied into them.

    A fused matrix is drawn whole: a random fill of a ``[3d, d]`` tensor is not the three
    fills of its ``[d, d]`` blocks (CPU normals come in groups of 16, fan-in may differ).
    """
    if len(parts) == 1:
        fill(parts[0])
        return
    whole = torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), dtype=parts[0].dtype,
                        device=parts[0].device)
    fill(whole)
    for part, rows in zip(parts, whole.split([p.shape[0] for p in parts])):
        part.copy_(rows)


def _block_linears(block: Block) -> list[list[torch.Tensor]]:
    """One block's Linear weights in the paper's construction order, fused matrices as lists of row blocks: its
    c_attn (W_Q of a :class:`~torchnlq.models.query.PaperQKVRows` query, then W_K, W_V), c_proj, the query's other
    Linears in module order (``residual_mlp``'s W1, W2: its ``residual_in``, ``residual_out``), the MLP's two."""
    attn, query = block.attn, block.attn.query
    w_q = query.fused_qkv_weight() if claims(query, PaperQKVRows) else None
    c_attn = ([w_q] if w_q is not None else []) + [attn.kv.weight]
    others = [m.weight for m in query.modules() if isinstance(m, nn.Linear) and m.weight is not w_q]
    return [c_attn, [attn.proj.weight], *([w] for w in others), [block.mlp.fc.weight], [block.mlp.proj.weight]]


@torch.no_grad()
def init_like_paper(model: Decoder) -> None:
    """Initialise ``model`` in place with the draws of the paper's code (module doc) from the global RNG.

    Bitwise equal to the paper's model built after the same ``torch.manual_seed`` when the
    parameters are fp32 on the CPU (where the paper builds its model). Raises ConfigError
    for a parameter the procedure does not know (a query type whose parameters are neither
    Linear weights nor norm gains), rather than leave it unset.
    """
    args = model.args
    std = args.init_std
    residual_std = std / math.sqrt(2 * args.n_layers)
    embeddings = [model.tok_emb.weight] + ([model.pos_emb.weight] if model.pos_emb is not None else [])
    head = model.tok_emb.weight if model.lm_head is None else model.lm_head.weight
    linears = [parts for layer in model.layers for parts in _block_linears(layer)]

    def kaiming(t: torch.Tensor) -> None:
        nn.init.kaiming_uniform_(t, a=math.sqrt(5))  # nn.Linear.reset_parameters

    def normal(t: torch.Tensor) -> None:
        nn.init.normal_(t, mean=0.0, std=std)

    # 1. The constructors (their values are overwritten below; only the RNG's advance matters).
    for weight in embeddings:
        nn.init.normal_(weight)  # nn.Embedding.reset_parameters: N(0, 1)
    for parts in linears:
        _draw(parts, kaiming)
    kaiming(head)
    # 2. _init_weights over the modules, in the same order; a tied head is redrawn here.
    for weight in embeddings:
        normal(weight)
    for parts in linears:
        _draw(parts, normal)
    normal(head)
    # 3. The residual-stream projections again, at the smaller std.
    for layer in model.layers:
        nn.init.normal_(layer.attn.proj.weight, mean=0.0, std=residual_std)
        nn.init.normal_(layer.mlp.proj.weight, mean=0.0, std=residual_std)
    drawn = {id(w) for parts in linears for w in parts} | {id(w) for w in embeddings} | {id(head)}
    for module in model.modules():
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            module.reset_parameters()  # gain 1, no randomness (the paper's norms start at 1 too)
            drawn.update(id(p) for p in module.parameters())
    if model.rope is not None:
        model.rope.init_weights()
    unknown = [name for name, p in model.named_parameters() if id(p) not in drawn]
    if unknown:
        raise ConfigError(
            f"model.init = 'paper' does not know how the paper's code would draw {', '.join(unknown)}; "
            "use model.init = 'torchnlq' for this query type"
        )
