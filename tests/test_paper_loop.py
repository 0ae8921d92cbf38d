"""Proof, side by side: three training steps of torchnlq in paper-exact mode and of the paper's loop.

The paper's side is written out in this file from its training script (MarkoKarbevski/
beyond_query_linearity, train.py and model.py, nanoGPT's structure): its GPT as a function of a
state dict under its own parameter names, its initial weights (``paper_initial_weights``: every
draw of its constructors and init, in order), its pre-drawn batch table (one seeded generator,
``randint(len(train) - T, (steps, batch))``, micro-step m reading columns m*B..), AdamW over
its two groups (tensors with >= 2 dims decayed), betas (0.9, 0.95), its warmup + cosine
``get_lr``, the loss divided by the accumulation steps, gradient clipping at 1.0. torchnlq runs
the same arm from a config (``model.init = "paper"``, ``half_scale``), through its own Trainer.

What "identical" means here: fp32 on the CPU, every step's training loss (the mean over the
step's micro-batches, which torchnlq logs) equal to the paper loop's to 1e-6 relative, and the
initial weights bitwise equal. The two sides are different code (fused ``c_attn`` against
separate projections, scaled queries against a scaled softmax), so their float sums are not
ordered identically and the last bits may differ; on a GPU the kernels differ further.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.data import write_token_folder
from helpers.paper import as_paper_state_dict, paper_initial_weights
from helpers.train import scalars, tiny_config

pytestmark = pytest.mark.integration  # runs the trainer

L, D, H, T, HIDDEN = 2, 32, 4, 16, 128
MICRO, ACCUM, STEPS = 2, 2, 3
LR, MIN_LR, WD, WARMUP, DECAY = 3e-3, 3e-4, 0.1, 1, 3
TRAIN_SEED, DATA_SEED = 1337, 42
EPS = 1e-5


def rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gain


def layer_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), gain, None, EPS)


def paper_forward(w: dict[str, torch.Tensor], mode: str, idx: torch.Tensor) -> torch.Tensor:
    """model.py's GPT.forward (no dropout, no biases), logits of every position."""
    B, T_ = idx.shape
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][:T_]
    scale = 1 / (2 * math.sqrt(D // H)) if mode != "original" else 1 / math.sqrt(D // H)
    for i in range(L):
        p = f"transformer.h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"])
        qkv = h @ w[p + "attn.c_attn.weight"].T
        if mode in ("original", "residual"):
            q, k, v = qkv.split(D, dim=-1)
            q = q if mode == "original" else h + q
        else:
            k, v = qkv.split(D, dim=-1)
            if mode == "identity":
                q = h
            else:  # residual_gelu: X + LN(GELU(RMSNorm(X) W1) W2)
                r = rms_norm(h, w[p + "attn.residual_rmsnorm_input.weight"])
                f = F.gelu(r @ w[p + "attn.residual_in.weight"].T) @ w[p + "attn.residual_out.weight"].T
                q = h + layer_norm(f, w[p + "attn.residual_layernorm_output.weight"])
        q, k, v = (t.view(B, T_, H, D // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        x = x + y.transpose(1, 2).reshape(B, T_, D) @ w[p + "attn.c_proj.weight"].T
        h = layer_norm(x, w[p + "ln_2.weight"])
        x = x + F.gelu(h @ w[p + "mlp.c_fc.weight"].T) @ w[p + "mlp.c_proj.weight"].T
    return layer_norm(x, w["transformer.ln_f.weight"]) @ w["lm_head.weight"].T


def paper_get_lr(it: int) -> float:
    """train.py's get_lr."""
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it > DECAY:
        return MIN_LR
    ratio = (it - WARMUP) / (DECAY - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def paper_loop(mode: str, vocab: int, train: np.ndarray) -> tuple[dict[str, torch.Tensor], list[float]]:
    """train.py's loop on one process: initial weights and the mean micro-batch loss of each step."""
    w = paper_initial_weights(TRAIN_SEED, mode, L, D, vocab, T, HIDDEN, tied=True)
    initial = {k: v.clone() for k, v in w.items()}
    # named_parameters() yields the tied tensor once (as transformer.wte.weight), lm_head is skipped.
    params = {k: v.requires_grad_() for k, v in w.items() if k != "lm_head.weight"}
    groups = [{"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": WD},
              {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95))
    gen = torch.Generator(device="cpu")
    gen.manual_seed(DATA_SEED)
    table = torch.randint(len(train) - T, (STEPS, MICRO * ACCUM), generator=gen)
    losses = []
    for it in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = paper_get_lr(it)
        step_loss = 0.0
        for micro in range(ACCUM):
            ix = table[it, micro * MICRO : (micro + 1) * MICRO].tolist()
            x = torch.stack([torch.from_numpy(train[i : i + T].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(train[i + 1 : i + 1 + T].astype(np.int64)) for i in ix])
            w["lm_head.weight"] = w["transformer.wte.weight"]
            loss = F.cross_entropy(paper_forward(w, mode, x).view(-1, vocab), y.view(-1)) / ACCUM
            loss.backward()
            step_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_loss)
    return initial, losses


@pytest.mark.parametrize("mode, qtype", [("residual_gelu", "residual_mlp"), ("original", "linear"),
                                         ("identity", "identity"), ("residual", "residual")])
def test_three_steps_equal_the_papers_loop(tmp_path: Path, mode: str, qtype: str) -> None:
    from torchnlq.train.trainer import Trainer

    rng = np.random.default_rng(0)
    folder = write_token_folder(tmp_path / "data", rng.integers(0, 256, 4000), rng.integers(0, 256, 1000))
    cfg = tiny_config(
        tmp_path, qtype, steps=STEPS, data__path=folder, data__synthetic=False, data__seed=DATA_SEED,
        model__n_layers=L, model__dim=D, model__n_heads=H, model__max_seq_len=T, model__mlp_hidden=HIDDEN,
        model__init="paper", model__query__type=qtype, model__query__half_scale=True,
        training__seq_len=T, training__micro_batch_size=MICRO, training__grad_accum_steps=ACCUM,
        training__seed=TRAIN_SEED, training__max_norm=1.0,
        optimizer__lr=LR, optimizer__weight_decay=WD, optimizer__beta1=0.9, optimizer__beta2=0.95, optimizer__eps=1e-8,
        lr_schedule__warmup_steps=WARMUP, lr_schedule__decay_steps=DECAY, lr_schedule__min_lr=MIN_LR,
        validation__enabled=False, checkpoint__enabled=False,
    )
    trainer = Trainer(cfg)
    vocab = trainer.model_args.vocab_size
    ours_initial = as_paper_state_dict({k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, L)
    train = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
    paper_initial, paper_losses = paper_loop(mode, vocab, train)
    for name, value in paper_initial.items():
        assert torch.equal(ours_initial[name], value), name  # the same initial weights, bit for bit
    trainer.train()
    ours = scalars(tmp_path / f"outputs/{qtype}/tb")["loss/train"]
    assert sorted(ours) == list(range(1, STEPS + 1))
    for step, expected in enumerate(paper_losses, start=1):
        assert ours[step] == pytest.approx(expected, rel=1e-6), (step, ours[step], expected)
