"""The paper's code restated for the tests (MarkoKarbevski/beyond_query_linearity): its initial weights
and its parameter names. Used by tests/test_paper_exact.py and tests/test_paper_loop.py."""

from __future__ import annotations

import math

import torch
from torch import nn


def paper_initial_weights(
    seed: int, mode: str, n_layer: int, n_embd: int, vocab: int, block: int, hidden: int, tied: bool
) -> dict[str, torch.Tensor]:
    """The paper's GPT after ``torch.manual_seed(seed)``, by its parameter names (its state_dict).

    Its constructors run in this order and draw as nn.Linear (kaiming-uniform, a = sqrt 5)
    and nn.Embedding (N(0, 1)) do; then ``apply(_init_weights)`` visits the same modules in
    the same order (children first) and draws N(0, 0.02) into every Linear and Embedding
    weight; then every ``c_proj`` weight gets N(0, 0.02 / sqrt(2 n_layer)).
    """
    torch.manual_seed(seed)

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        w = torch.empty(out_features, in_features)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        return w

    def embedding(rows: int) -> torch.Tensor:
        return nn.init.normal_(torch.empty(rows, n_embd))

    w: dict[str, torch.Tensor] = {"transformer.wte.weight": embedding(vocab),
                                  "transformer.wpe.weight": embedding(block)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        w[p + "ln_1.weight"] = torch.ones(n_embd)
        # Q, K, V in one matrix for the modes with a W_Q; K, V only for the others.
        w[p + "attn.c_attn.weight"] = linear((3 if mode in ("original", "residual") else 2) * n_embd, n_embd)
        w[p + "attn.c_proj.weight"] = linear(n_embd, n_embd)
        if mode == "residual_gelu":
            w[p + "attn.residual_rmsnorm_input.weight"] = torch.ones(n_embd)
            w[p + "attn.residual_layernorm_output.weight"] = torch.ones(n_embd)
            w[p + "attn.residual_in.weight"] = linear(n_embd // 2, n_embd)
            w[p + "attn.residual_out.weight"] = linear(n_embd, n_embd // 2)
        w[p + "ln_2.weight"] = torch.ones(n_embd)
        w[p + "mlp.c_fc.weight"] = linear(hidden, n_embd)
        w[p + "mlp.c_proj.weight"] = linear(n_embd, hidden)
    w["transformer.ln_f.weight"] = torch.ones(n_embd)
    w["lm_head.weight"] = linear(vocab, n_embd)  # built even when tied
    if tied:
        w["transformer.wte.weight"] = w["lm_head.weight"]  # one tensor, drawn twice below
    for t in w.values():  # _init_weights; the dict's order is the modules' order
        if t.ndim == 2:
            nn.init.normal_(t, mean=0.0, std=0.02)
    for name, t in w.items():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(t, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
    return w


def as_paper_state_dict(sd: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """torchnlq's state dict under the paper's names: W_Q stacked above W_K, W_V as its ``c_attn``."""
    out = {"transformer.wte.weight": sd["tok_emb.weight"], "transformer.wpe.weight": sd["pos_emb.weight"],
           "transformer.ln_f.weight": sd["ln_f.weight"],
           "lm_head.weight": sd.get("lm_head.weight", sd["tok_emb.weight"])}
    for i in range(n_layer):
        p, q = f"layers.{i}.", f"transformer.h.{i}."
        c_attn = [sd[p + "attn.query.w_q.weight"]] if p + "attn.query.w_q.weight" in sd else []
        out[q + "attn.c_attn.weight"] = torch.cat([*c_attn, sd[p + "attn.kv.weight"]])
        names = {"ln_1.weight": "ln_1.weight", "ln_2.weight": "ln_2.weight", "attn.proj.weight": "attn.c_proj.weight",
                 "mlp.fc.weight": "mlp.c_fc.weight", "mlp.proj.weight": "mlp.c_proj.weight",
                 "attn.query.input_norm.weight": "attn.residual_rmsnorm_input.weight",
                 "attn.query.output_norm.weight": "attn.residual_layernorm_output.weight",
                 "attn.query.w1.weight": "attn.residual_in.weight", "attn.query.w2.weight": "attn.residual_out.weight"}
        out.update({q + theirs: sd[p + ours] for ours, theirs in names.items() if p + ours in sd})
    return out
