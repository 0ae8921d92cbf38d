"""Compiled blocks: one graph per kind of block, zero graph breaks, no recompilation across steps.

Every query type, both position kinds, GQA, the fused K/V projection and every activation-
checkpointing mode are compiled as the trainer compiles them (``apply_compile``: each block and the
head's loss, ``fullgraph=True``) and trained for three steps; dynamo's own counters must show no graph
break, the expected number of distinct graphs (blocks share one graph; ``selective`` checkpointing has
two kinds of block; the loss is one more, chunked or full), and steps 2 and 3 must reuse the graphs
(``error_on_recompile``). The
graphs are traced with the ``aot_eager`` backend: graph breaks and recompiles are dynamo's and
AOT autograd's, not inductor's, and inductor would take tens of seconds per case on this CPU
(the trainer's inductor path runs in tests/test_multiproc_train.py and tests/test_run_train.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from torchnlq.config.job_config import ActivationCheckpoint, Query
from torchnlq.models import QUERY_TYPES, ModelArgs
from torchnlq.parallel.activation_checkpoint import apply_activation_checkpointing
from torchnlq.parallel.parallelize import apply_compile
from torchnlq.models import build_model

pytestmark = pytest.mark.integration  # torch.compile (dynamo + AOT autograd), ~1 s per case

QUERY_TYPE_NAMES = ("linear", "identity", "residual", "residual_mlp", "anchored")
CASES: list[Any] = [pytest.param(q, {}, {}, "none", id=q) for q in QUERY_TYPE_NAMES]
CASES += [
    pytest.param("residual_mlp", {"positions": "rope"}, {}, "none", id="residual_mlp-rope"),
    pytest.param("linear", {"positions": "rope", "n_kv_heads": 1}, {}, "none", id="linear-rope-gqa"),
    pytest.param("residual_mlp", {"n_kv_heads": 1}, {}, "none", id="residual_mlp-gqa"),
]
CASES += [pytest.param("residual_mlp", {}, {}, m, id=f"residual_mlp-ac-{m}") for m in ("full", "selective", "op")]
CASES += [pytest.param("linear", {"positions": "rope"}, {}, "op", id="linear-rope-ac-op")]
# The Llama-style block (every block option away from GPT-2's) with every query type.
LLAMA = {"positions": "rope", "norm": "rms", "mlp_activation": "swiglu", "qk_norm": True, "bias": True,
         "rope_scaling_factor": 8.0, "rope_original_max_seq_len": 8, "n_kv_heads": 1, "init": "depth",
         "tie_embeddings": False}
CASES += [pytest.param(q, LLAMA, {}, "none", id=f"{q}-llama") for q in QUERY_TYPE_NAMES]
CASES += [pytest.param("residual_mlp", LLAMA, {}, "selective", id="residual_mlp-llama-ac-selective")]


def test_the_cases_cover_every_registered_query_type() -> None:
    covered = {case.values[0] for case in CASES}
    assert covered >= {name for name in QUERY_TYPES if not name.startswith("my_")}


@pytest.mark.parametrize("qtype, model_kw, query_kw, ac_mode", CASES)
def test_compiled_blocks_have_no_graph_breaks_and_no_recompiles(
    qtype: str, model_kw: dict[str, Any], query_kw: dict[str, Any], ac_mode: str,
) -> None:
    args = ModelArgs(n_layers=2, dim=32, n_heads=2, vocab_size=64, max_seq_len=16,
                     query=Query(type=qtype, **query_kw), **model_kw)
    torch.manual_seed(0)
    model = build_model(args)
    apply_activation_checkpointing(model, ActivationCheckpoint(mode=ac_mode, every=2))
    torch._dynamo.reset()
    counters.clear()
    apply_compile(model, fullgraph=True, backend="aot_eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))

    chunk = 7 if model_kw else 0  # the head's loss as training computes it: chunked (Llama cases) or full logits

    def step() -> None:
        model(tokens[:, :-1], targets=tokens[:, 1:], loss_chunk_tokens=chunk).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # compiles
    with torch._dynamo.config.patch(error_on_recompile=True):
        step()
        step()
    assert dict(counters["graph_break"]) == {}
    # One graph for all blocks (selective checkpointing, every 2nd block, has two kinds of block) and one for the
    # head's loss.
    assert counters["stats"]["unique_graphs"] == (2 if ac_mode == "selective" else 1) + 1
    torch._dynamo.reset()
