"""The query contract is the only way in (issue 33.1): a query type outside the package, whose matrices are named
unlike any built-in one, gets its nonlinear branch into ``[[optimizer.groups]] kind = "query_mlp"`` (with the
group's LR multiplier, stepped by the optimizer) and its matrices into the weight dynamics, because it says which
they are (``matrices()``, ``branch_matrices()``), not because of their names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torchnlq.config.job_config import Optimizer, OptimizerGroup, Query
from torchnlq.models import Decoder, ModelArgs
from torchnlq.models.query import QUERY_TYPES, QueryProjection, register_query, QueryShape
from torchnlq.train.optim import build_optimizer, plan_groups, set_lr
from torchnlq.train.weight_dynamics import weight_stats
from torchnlq.models import build_model


@pytest.fixture
def oddly_named() -> Iterator[str]:
    """``lens``: Q = X·anchorᵀ + tanh(X·squeezeᵀ)·unsqueezeᵀ, registered for the test only."""

    class Lens(QueryProjection):
        def __init__(self, cfg: Query, shape: QueryShape) -> None:
            super().__init__(cfg, shape)
            dim = shape.dim
            self.anchor = nn.Linear(dim, self.q_dim, bias=False)
            self.squeeze = nn.Linear(dim, dim // 4, bias=False)
            self.unsqueeze = nn.Linear(dim // 4, self.q_dim, bias=False)
            self.gain = nn.Parameter(torch.ones(self.q_dim))

        def matrices(self) -> dict[str, nn.Linear]:
            return {"anchor": self.anchor, "squeeze": self.squeeze, "unsqueeze": self.unsqueeze}

        def branch_matrices(self) -> dict[str, nn.Linear]:
            return {"squeeze": self.squeeze, "unsqueeze": self.unsqueeze}

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.anchor(x) + self.gain * self.unsqueeze(torch.tanh(self.squeeze(x)))

    register_query("lens_for_contract_test")(Lens)
    try:
        yield "lens_for_contract_test"
    finally:
        del QUERY_TYPES["lens_for_contract_test"]


def model_of(query_type: str, vocab_size: int = 64) -> Decoder:
    torch.manual_seed(0)
    return build_model(ModelArgs(n_layers=2, dim=32, n_heads=4, vocab_size=vocab_size, max_seq_len=16,
                         query=Query(type=query_type)))


def test_the_branch_of_a_plugin_lands_in_the_query_mlp_group_with_its_lr_multiplier(oddly_named: str) -> None:
    model = model_of(oddly_named)
    cfg = Optimizer(lr=1e-2, groups=[OptimizerGroup(name="branch", kind="query_mlp", lr_multiplier=0.25)])
    plans = {plan.name: plan for plan in plan_groups(cfg, model)}
    expected = {f"layers.{i}.attn.query.{m}.weight" for i in range(2) for m in ("squeeze", "unsqueeze")}
    assert set(plans["branch"].names) == expected
    assert not any("anchor" in n or "gain" in n for n in plans["branch"].names)  # W and the 1-D gain stay default
    optimizer = build_optimizer(cfg, model, "cpu", list(plans.values()))
    set_lr(optimizer, 1e-2)
    branch_ids = set(map(id, plans["branch"].params))
    lrs = [group["lr"] for group in optimizer.param_groups if set(map(id, group["params"])) == branch_ids]
    assert lrs == [pytest.approx(2.5e-3)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = torch.randint(0, 64, (2, 2, 16), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    optimizer.step()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in expected)


def test_the_built_in_branches_are_the_paper_querys_w1_w2() -> None:
    cfg = Optimizer(groups=[OptimizerGroup(name="f", kind="query_mlp")])
    plans = {plan.name: plan for plan in plan_groups(cfg, model_of("residual_mlp"))}
    assert set(plans["f"].names) == {f"layers.{i}.attn.query.w{k}.weight" for i in range(2) for k in (1, 2)}
    with pytest.raises(Exception, match="matches no parameter"):  # the linear query has no branch
        plan_groups(cfg, model_of("linear"))


def test_weight_dynamics_report_a_plugins_matrices_by_its_own_names(oddly_named: str) -> None:
    model = model_of(oddly_named)
    stats = weight_stats(model)
    for layer in range(2):
        for name in ("anchor", "squeeze", "unsqueeze"):
            weight = model.layers[layer].attn.query.matrices()[name].weight.detach().double()
            sigma = torch.linalg.svdvals(weight)  # the largest singular value, computed here
            assert stats[f"weights/layer{layer}/{name}/sigma_max"] == pytest.approx(sigma[0].item(), rel=1e-9)
    assert not any("/gain/" in key for key in stats)


def test_a_plugin_that_starts_from_linear_upcycles_a_pretrained_model(tmp_path) -> None:
    """``upcycles_from = ("linear",)``: the pretrained W_Q loads into the plugin's parameter of that name, the
    branch (named as the plugin likes) is drawn, and with its last matrix at zero the logits are the source's."""
    from helpers.checkpoints import BYTE_TOKENIZER

    from torchnlq.interop.export import export_safetensors
    from torchnlq.interop.load import LoadedModel
    from torchnlq.interop.upcycle import upcycle

    class Widened(QueryProjection):
        upcycles_from = ("linear",)

        def __init__(self, cfg: Query, shape: QueryShape) -> None:
            super().__init__(cfg, shape)
            dim = shape.dim
            self.w_q = nn.Linear(dim, self.q_dim, bias=False)
            self.squeeze = nn.Linear(dim, 8, bias=False)
            self.unsqueeze = nn.Linear(8, self.q_dim, bias=False)

        def branch_matrices(self) -> dict[str, nn.Linear]:
            return {"squeeze": self.squeeze, "unsqueeze": self.unsqueeze}

        def init_weights(self, init_std: float) -> None:
            super().init_weights(init_std)
            nn.init.zeros_(self.unsqueeze.weight)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w_q(x) + self.unsqueeze(torch.relu(self.squeeze(x)))

    register_query("widened_for_contract_test")(Widened)
    try:
        source = model_of("linear", vocab_size=320)  # the byte tokenizer's 257 ids, padded
        export_safetensors(LoadedModel(source, source.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "export")
        up = upcycle(tmp_path / "export", Query(type="widened_for_contract_test"))
        x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            torch.testing.assert_close(up.model(x), source(x))
        assert set(up.model.layers[0].attn.query.branch_matrices()) == {"squeeze", "unsqueeze"}
        with pytest.raises(Exception, match="only 'anchored', 'widened_for_contract_test' can"):
            upcycle(tmp_path / "export", Query(type="residual_mlp"))
    finally:
        del QUERY_TYPES["widened_for_contract_test"]
