"""Run folders as the trainer leaves them (config.toml, run_info.json, tb/), for the comparison tools' tests."""

from __future__ import annotations

import json
from pathlib import Path

from torchnlq.config.manager import load_job_config
from torchnlq.config.render import to_toml


def make_run(root: Path, name: str, val: dict[int, float], *overrides: str, seed: int = 1337,
             batch_fp: str = "aaaa", val_fp: str = "vvvv", query: str = "linear", world_size: int | None = 1,
             train: dict[int, float] | None = None, config: Path | None = None,
             scalars: dict[str, dict[int, float]] | None = None) -> Path:
    """A run folder as the trainer leaves it: resolved config.toml, run_info.json, tb/ events.

    ``world_size=None`` leaves it out of run_info.json (a hand-made or foreign record); ``train``: the training
    losses (default: the validation loss + 0.1 at each validation step); ``config``: a TOML file the overrides
    apply to; ``scalars``: more TensorBoard series (tag -> {step: value}, e.g. a mixture's loss/val/<name>).
    """
    from torch.utils.tensorboard import SummaryWriter

    run = root / name
    cfg = load_job_config([*([str(config)] if config else []), f"--job.name={name}", f"--training.seed={seed}",
                           f"--model.query.type={query}", *overrides])
    run.mkdir(parents=True)
    (run / "config.toml").write_text(to_toml(cfg))
    info = {
        "name": name, "step": max(val), "steps": max(val), "finished": True, "last_val_loss": val[max(val)],
        "query_type": query, "non_embedding_params": 1000 if query == "linear" else 1064,
        "batch_fingerprint": batch_fp, "validation_fingerprint": val_fp, "world_size": world_size,
    }
    (run / "run_info.json").write_text(json.dumps({k: v for k, v in info.items() if v is not None}))
    writer = SummaryWriter(str(run / "tb"))
    for step, loss in val.items():
        writer.add_scalar("loss/val", loss, step)
    for step, loss in (train or {step: loss + 0.1 for step, loss in val.items()}).items():
        writer.add_scalar("loss/train", loss, step)
    for tag, values in (scalars or {}).items():
        for step, value in values.items():
            writer.add_scalar(tag, value, step)
    writer.close()
    return run


def branch(root: Path, name: str, trunk: Path, at: int, val: dict[int, float], *overrides: str) -> Path:
    """A branched decay of ``trunk`` from its step ``at``: it validates at the branch point, then on its own."""
    end = max(val)
    run = make_run(root, name, {at: val.pop(at), **val}, "--lr_schedule.name=wsd", f"--training.steps={end}",
                   f"--lr_schedule.decay_steps={end}", f"--lr_schedule.decay_length={end - at}",
                   f"--checkpoint.initial_load_path={trunk / 'checkpoints' / f'step-{at}'}",
                   "--checkpoint.initial_load_model_only=false", *overrides)
    info = json.loads((run / "run_info.json").read_text())
    info["initialized_from"] = str(trunk / "checkpoints" / f"step-{at}")
    (run / "run_info.json").write_text(json.dumps(info))
    return run
