"""Weight dynamics of the query (issue 13.5): singular-value summaries, effective rank, drift from init."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchnlq.config.job_config import Query
from torchnlq.models.args import ModelArgs
from torchnlq.train.weight_dynamics import initial_matrices, spectrum_stats, weight_stats
from torchnlq.models import build_model


def test_spectrum_summaries_match_numpys_singular_values() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(12, 7)) @ np.diag([5, 3, 1, 1, 0.5, 0.1, 0.01]) @ rng.normal(size=(7, 7))
    s = np.linalg.svd(w, compute_uv=False)
    p = s / s.sum()
    expected = {"sigma_max": s[0], "effective_rank": math.exp(-(p * np.log(p)).sum()),
                "stable_rank": (s**2).sum() / s[0] ** 2}
    got = spectrum_stats(torch.tensor(w, dtype=torch.float32))
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5), key
    # Limits: a rank-one matrix has effective and stable rank 1; an orthogonal one its full size.
    one = spectrum_stats(torch.outer(torch.arange(1.0, 5.0), torch.arange(1.0, 4.0)))
    assert one["effective_rank"] == pytest.approx(1.0, abs=1e-4) and one["stable_rank"] == pytest.approx(1.0)
    eye = spectrum_stats(torch.eye(6))
    assert eye["effective_rank"] == pytest.approx(6.0) and eye["stable_rank"] == pytest.approx(6.0)


@pytest.mark.parametrize("query,matrices", [
    (Query(type="linear"), ["w_q"]),
    (Query(type="residual_mlp"), ["w1", "w2"]),
    (Query(type="residual"), ["w_q"]),
    (Query(type="identity"), []),
    (Query(type="anchored", layers="1"), ["w_q", "w1", "w2"]),
])
def test_every_query_matrix_of_every_block_is_summarised(query: Query, matrices: list[str]) -> None:
    torch.manual_seed(0)
    model = build_model(ModelArgs(n_layers=2, dim=32, n_heads=4, vocab_size=64, max_seq_len=16, query=query))
    stats = weight_stats(model, initial_matrices(model))
    names = {key.split("/")[2] for key in stats if key.startswith("weights/layer")}
    assert names == set(matrices)
    if query.type == "anchored":  # f only in block 1: block 0 has W_Q alone
        assert "weights/layer0/w1/sigma_max" not in stats and "weights/layer1/w1/sigma_max" in stats
    for key, value in stats.items():
        if key.endswith("/drift"):
            assert value == 0.0  # at init


def test_drift_is_the_relative_frobenius_distance_from_init() -> None:
    torch.manual_seed(0)
    model = build_model(ModelArgs(n_layers=2, dim=32, n_heads=4, vocab_size=64, max_seq_len=16, query=Query(type="residual_mlp")))
    initial = initial_matrices(model)
    w1 = model.layers[1].attn.query.w1.weight
    before = w1.detach().clone()
    with torch.no_grad():
        w1.add_(0.01 * torch.randn_like(w1))
    stats = weight_stats(model, initial)
    expected = ((w1.detach() - before).norm() / before.norm()).item()
    assert stats["weights/layer1/w1/drift"] == pytest.approx(expected, rel=1e-5)
    assert stats["weights/layer0/w1/drift"] == 0.0
    assert stats["weights/mean/w1/drift"] == pytest.approx(expected / 2, rel=1e-5)


@pytest.mark.integration
def test_a_resumed_run_measures_drift_from_the_same_initial_weights(tmp_path) -> None:
    """The step-0 reference is rebuilt on resume: drift at step 8 equals the uninterrupted run's."""
    from helpers.train import scalars, tiny_config

    from torchnlq.train.trainer import Trainer

    extra = dict(metrics__weight_dynamics_interval=4, checkpoint__interval=4, validation__interval=4)
    Trainer(tiny_config(tmp_path, "whole", steps=8, **extra)).train()
    Trainer(tiny_config(tmp_path, "split", steps=4, lr_schedule__decay_steps=8, **extra)).train()
    Trainer(tiny_config(tmp_path, "split", steps=8, **extra)).train()  # resumes from step-4
    whole = scalars(tmp_path / "outputs" / "whole" / "tb")
    split = scalars(tmp_path / "outputs" / "split" / "tb")
    drift = [t for t in whole if t.startswith("weights/") and t.endswith("/drift")]
    assert drift and all(whole[t][8] == split[t][8] > 0 for t in drift)
    # And the figure is what the test computes from the saved weights against a fresh seeded init.
    from torchnlq.interop.load import load_model
    from torchnlq.parallel.parallelize import reference_state_dict

    final = load_model(tmp_path / "outputs" / "whole" / "checkpoints" / "step-8").model
    init = reference_state_dict(final.args, tiny_config(tmp_path, "whole").training.seed)
    w1, w1_0 = final.layers[1].attn.query.w1.weight.detach(), init["layers.1.attn.query.w1.weight"]
    assert whole["weights/layer1/w1/drift"][8] == pytest.approx(((w1 - w1_0).norm() / w1_0.norm()).item(), rel=1e-6)
