"""Worker for tests/test_parallel_multiproc.py, run under ``torch.distributed.run`` with gloo.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp_worker.py OUT.json SCENARIO...``

Scenarios: ``init`` (sharded init == single-device init, bitwise) and training loops
``eager``, ``compile``, ``ac_full``, ``hsdp`` (FSDP / HSDP over 2 ranks vs the same loop
in one process without FSDP). Rank 0 writes the results as JSON for the test to check.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from torchnlq.config.job_config import ActivationCheckpoint, Float8, Parallelism, Query, Training
from torchnlq.models import ModelArgs
from torchnlq.parallel.dist import build_mesh, destroy_distributed, init_distributed
from torchnlq.parallel.parallelize import clip_grad_norm, materialize_and_init, parallelize_model, set_gradient_sync
from torchnlq.models import build_model

SEED = 1234
STEPS, ACCUM, GLOBAL_BATCH, SEQ = 3, 2, 4, 32
MAX_NORM = 0.05  # small enough that clipping is active at every step


def tiny_args(**overrides) -> ModelArgs:
    base = dict(n_layers=2, dim=32, n_heads=2, vocab_size=96, max_seq_len=SEQ, query=Query(type="residual_mlp"))
    base.update(overrides)
    return ModelArgs(**base)


def sharded_model(args: ModelArgs, info, parallelism: Parallelism, *, compile: bool = False, ac: str = "none"):
    mesh = build_mesh(info, parallelism)
    with torch.device("meta"):
        model = build_model(args)
    parallelize_model(
        model, training=Training(compile=compile), ac=ActivationCheckpoint(mode=ac), float8=Float8(),
        parallelism=parallelism, mesh=mesh, device=info.device,
    )
    return materialize_and_init(model, info.device, SEED, mesh)


def check_init(info) -> dict:
    """Gather the full state dict of sharded models and compare bitwise with torch.manual_seed(SEED); build_model(args)."""
    results = {}
    variants = {
        "tied_learned": tiny_args(),
        "untied_rope_gqa": tiny_args(tie_embeddings=False, positions="rope", n_heads=4, n_kv_heads=2,
                                     query=Query(type="linear")),
        "odd_shapes": tiny_args(dim=36, n_heads=3, vocab_size=101, n_layers=3),  # shards of unequal size
    }
    for name, args in variants.items():
        model = sharded_model(args, info, Parallelism())
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        rope_ok = all(
            torch.equal(getattr(model.rope, b), getattr(build_model(args).rope, b)) for b in ("cos", "sin")
        ) if model.rope is not None else True
        if info.rank == 0:
            torch.manual_seed(SEED)
            ref = build_model(args).state_dict()
            results[name] = {
                "keys_equal": list(full) == list(ref),
                "bitwise_equal": all(torch.equal(full[k], ref[k]) for k in ref),
                "rope_ok": rope_ok,
            }
    return results


def batches() -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randint(0, 96, (STEPS, ACCUM, GLOBAL_BATCH, SEQ + 1), generator=gen)


def train(model, rows: slice, distributed: bool) -> dict:
    """The trainer's loop in miniature; each micro-batch loss is its token mean / ACCUM."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    losses, norms, held_back = [], [], []
    data = batches()
    for step in range(STEPS):
        loss_sum = torch.zeros(())
        for micro in range(ACCUM):
            set_gradient_sync(model, micro == ACCUM - 1)  # reduce only on the last micro-step
            tokens = data[step, micro, rows]
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()) / ACCUM
            loss.backward()
            if micro < ACCUM - 1:  # without sync, FSDP keeps the gradients unsharded and unreduced
                held_back.append(all(p.grad is None for p in model.parameters()))
            loss_sum += loss.detach()
        if distributed:  # for logging: the mean over ranks is the global batch's loss
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        norms.append(float(clip_grad_norm(model.parameters(), MAX_NORM)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss_sum.item())
    return {"losses": losses, "norms": norms, "held_back": held_back}


def check_training(info, scenario: str) -> dict:
    args = tiny_args()
    parallelism = Parallelism(dp_replicate=2) if scenario == "hsdp" else Parallelism()
    model = sharded_model(args, info, parallelism, compile=scenario == "compile",
                          ac="full" if scenario == "ac_full" else "none")
    half = GLOBAL_BATCH // info.world_size
    result = {"fsdp": train(model, slice(info.rank * half, (info.rank + 1) * half), distributed=True)}
    if info.rank == 0:
        torch.manual_seed(SEED)
        reference = build_model(args)  # one process, no FSDP, eager: the whole global batch per micro-step
        result["single"] = train(reference, slice(0, GLOBAL_BATCH), distributed=False)
    dist.barrier()
    return result


def main() -> None:
    out, scenarios = sys.argv[1], sys.argv[2:]
    info = init_distributed("cpu")
    torch.use_deterministic_algorithms(True)
    results = {}
    for scenario in scenarios:
        results[scenario] = check_init(info) if scenario == "init" else check_training(info, scenario)
    if info.rank == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    destroy_distributed()


if __name__ == "__main__":
    main()
