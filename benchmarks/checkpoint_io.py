"""Measure checkpoint save/load times: how long training is blocked, sync vs async.

    python -m benchmarks.checkpoint_io [--flavor debug gpt_small] [--repeats 3]
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.checkpoint.checkpointer import Checkpointer
from torchnlq.checkpoint.record import RunRecord
from torchnlq.config.job_config import Checkpoint, Model
from torchnlq.errors import UserError, unknown_choice
from torchnlq.models import Decoder, build_model_args
from torchnlq.models.family import FLAVORS
from torchnlq.models import build_model


def _model_and_optimizer(flavor: str) -> tuple[Decoder, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = build_model(build_model_args(Model(flavor=flavor), vocab_size=50304 if flavor != "debug" else 320))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    return model, opt


def bench(flavor: str, repeats: int, folder: Path) -> dict[str, float]:
    """Median seconds for: sync save, async save (blocked part and total), load."""
    model, opt = _model_and_optimizer(flavor)
    log = logging.getLogger("torchnlq.bench")
    times: dict[str, list[float]] = {"sync_save": [], "async_blocked": [], "async_total": [], "load": []}
    # What the trainer saves beside the tensors; a benchmark run records no data (its fingerprint is the model's).
    record = RunRecord(model_args=model.args, tokenizer={"name": "byte"})
    step = 0
    for _ in range(repeats):
        step += 1
        sync = Checkpointer(Checkpoint(keep_latest_k=1), folder, 0, log)
        record.step = step
        t = time.perf_counter()
        sync.save(record, model, opt)
        times["sync_save"].append(time.perf_counter() - t)
        step += 1
        asyn = Checkpointer(Checkpoint(keep_latest_k=1, async_mode=True), folder, 0, log)
        record.step = step
        t = time.perf_counter()
        asyn.save(record, model, opt)
        times["async_blocked"].append(time.perf_counter() - t)
        asyn.wait()
        times["async_total"].append(time.perf_counter() - t)
        t = time.perf_counter()
        sync.load(folder / "checkpoints" / f"step-{step}", model, opt, {})
        times["load"].append(time.perf_counter() - t)
    size = sum(f.stat().st_size for f in (folder / "checkpoints" / f"step-{step}").rglob("*") if f.is_file())
    result = {k: statistics.median(v) for k, v in times.items()}
    result["size_mb"] = size / 1e6
    result["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    return result


def main(argv: list[str]) -> int:
    """``python -m benchmarks.checkpoint_io [--flavor debug gpt_small] [--repeats 3]``: print a Markdown table."""
    parser = ArgumentParser(prog="python -m benchmarks.checkpoint_io", description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", nargs="+", default=["debug", "gpt_small"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for flavor in args.flavor:  # all checked before the table starts
        if flavor not in FLAVORS:
            raise unknown_choice("--flavor", flavor, list(FLAVORS))
    if args.repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {args.repeats}")
    print("| flavor | params (M) | checkpoint (MB) | sync save (s) | async: training blocked (s) | async: total (s) "
          "| load (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for flavor in args.flavor:
        with tempfile.TemporaryDirectory() as tmp:
            r = bench(flavor, args.repeats, Path(tmp))
        print(f"| {flavor} | {r['params_m']:.1f} | {r['size_mb']:.0f} | {r['sync_save']:.3f} | "
              f"{r['async_blocked']:.3f} | {r['async_total']:.3f} | {r['load']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
