"""The µP coordinate check (benchmarks/coord_check.py) at small widths: under µP every layer kind's output scale
stays put as the width grows 8-fold after a few steps, under the standard parametrization the attention, MLP and
logits grow with it (so the test can fail: a µP that scaled nothing would show SP's slopes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import coord_check
from torchnlq.config.manager import load_job_config

from helpers import REPO_ROOT

WIDTHS = [32, 64, 128, 256]
TINY = ["--model.n_layers=2", "--model.n_heads=4", "--training.device=cpu"]


@pytest.mark.parametrize("query", ["residual_mlp", "linear"])
def test_mup_slopes_are_flat_and_sp_slopes_are_not(query: str) -> None:
    cfg = load_job_config([str(REPO_ROOT / "train_configs/debug_model.toml"), *TINY, f"--model.query.type={query}"])
    coords = coord_check.coord_check(cfg, WIDTHS, steps=4, lr=1e-2, batch=4, seq=32)
    fitted = coord_check.slopes(coords, WIDTHS)
    assert all(abs(s) < 0.3 for s in fitted["mup"].values()), fitted["mup"]
    for kind in ("attention", "mlp", "logits"):  # each grows by more than 2^0.8 per doubling of the width
        assert fitted["sp"][kind] > 0.8, (kind, fitted["sp"])
    # At the first step (the init) µP equals SP at the base width, the first width.
    assert all(coords["sp", 32][k][0] == coords["mup", 32][k][0] for k in coord_check.KINDS)


def test_the_moe_family_is_checked_too() -> None:
    cfg = load_job_config([str(REPO_ROOT / "train_configs/debug_model.toml"), *TINY, "--model.family=moe",
                           "--model.moe.n_experts=4", "--model.moe.top_k=2"])
    fitted = coord_check.slopes(coord_check.coord_check(cfg, WIDTHS[:3], steps=3, lr=1e-2, batch=4, seq=16),
                                WIDTHS[:3])
    assert all(abs(s) < 0.35 for s in fitted["mup"].values()), fitted["mup"]
    assert fitted["sp"]["attention"] > 0.8, fitted["sp"]


def test_the_command_prints_the_table_and_writes_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "coord.png"
    assert coord_check.main([str(REPO_ROOT / "train_configs/debug_model.toml"), *TINY, "--widths", "32,64",
                             "--steps", "2", "--batch", "2", "--seq", "16", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| mup | logits |" in out and "| sp | attention |" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def write_run(root: Path, name: str, parametrization: str, dim: int, lr: float, loss: float | None) -> None:
    run = root / name
    run.mkdir()
    (run / "run_info.json").write_text(json.dumps({"finished": loss is not None, "last_val_loss": loss}))
    (run / "config.toml").write_text(f'[model]\nparametrization = "{parametrization}"\ndim = {dim}\n'
                                     f"[optimizer]\nlr = {lr}\n")


def test_lr_transfer_reads_a_suite_and_counts_the_drift_in_grid_steps(tmp_path: Path) -> None:
    """A made-up suite: SP's best LR halves at each doubling of the width (2 steps of a 2x grid from 32 to 128),
    µP's stays; an unfinished run is left out."""
    from benchmarks import lr_transfer

    lrs = [1e-3, 2e-3, 4e-3, 8e-3]
    best = {("sp", 32): 8e-3, ("sp", 64): 4e-3, ("sp", 128): 2e-3, ("mup", 32): 8e-3, ("mup", 64): 8e-3,
            ("mup", 128): 8e-3}
    for (p, w), at in best.items():
        for lr in lrs:
            write_run(tmp_path, f"{p}_{w}_{lr}", p, w, lr, 3.0 + abs(math.log2(lr / at)) / 10)
    write_run(tmp_path, "unfinished", "sp", 32, 1.6e-2, None)
    losses = lr_transfer.read_suite(tmp_path)
    assert len(losses) == 24
    assert lr_transfer.best_lrs(losses, "sp") == {32: 8e-3, 64: 4e-3, 128: 2e-3}
    assert lr_transfer.drift(losses, "sp") == (-2.0, 1.0) and lr_transfer.drift(losses, "mup") == (0.0, 0.0)
    assert "**3.0000**" in "\n".join(lr_transfer.table(losses))
