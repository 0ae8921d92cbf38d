"""Weights & Biases logging (``[metrics] wandb = true``): the TensorBoard scalars and the resolved config.

A :class:`WandbLogger` (rank 0) is the MetricsLogger's sink, imported only when the option is on. Its files live in
``<run>/wandb/`` whatever ``WANDB_DIR`` says, its id in ``<run>/wandb/run_id``: every resume continues the W&B run.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import secrets
from pathlib import Path
from typing import Any

from torchnlq.config.job_config import JobConfig, Metrics
from torchnlq.errors import UserError
from torchnlq.train.metrics import HParam, RunEnd

#: The file (under ``<run>/wandb``) that keeps the run's W&B id across resumes.
RUN_ID_FILE = "run_id"
_RUN_ID = re.compile(r"[a-z0-9]{1,64}")


def wandb_config(cfg: JobConfig, hparams: dict[str, HParam]) -> dict[str, Any]:
    """What W&B stores as the run's config: the resolved config, nested, and ``run``: the derived ``run.*`` hparams."""
    derived = {name.split(".", 1)[1]: value for name, value in hparams.items() if name.startswith("run.")}
    return {**dataclasses.asdict(cfg), "run": derived}


def _run_id(folder: Path, new: bool) -> str:
    """This run folder's W&B run id: read from ``folder/run_id``, or (``new``, or none saved) drawn and written
    there."""
    path = folder / RUN_ID_FILE
    if not new and path.is_file():
        saved = path.read_text().strip()
        if _RUN_ID.fullmatch(saved):
            return saved
        # Not ours (hand-edited, truncated): a new id starts a new W&B run instead of failing the run.
    folder.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(8)  # 16 characters of [0-9a-f]: what W&B accepts as an id
    path.write_text(run_id + "\n")
    return run_id


class WandbLogger:
    """One W&B run: scalars with :meth:`scalar`, ended by :meth:`close` (the MetricsLogger's sink)."""

    def __init__(self, run: Any, logger: logging.Logger) -> None:
        self.run, self.logger = run, logger

    @classmethod
    def start(
        cls, mcfg: Metrics, run_dir: Path, job_name: str, config: dict[str, Any], logger: logging.Logger,
        start_step: int = 0,
    ) -> WandbLogger:
        """Start (or, on resume, continue) the run folder's W&B run and record ``config``; UserError if W&B cannot."""
        import wandb  # only here: wandb is optional, and slow to import

        disabled = mcfg.wandb_mode == "disabled"
        # Step 0 is a new W&B run even in a used folder: W&B drops steps below those a run already has.
        run_id = None if disabled else _run_id(run_dir / "wandb", new=start_step == 0)  # a disabled run writes no file
        try:
            run = wandb.init(
                project=mcfg.wandb_project,
                entity=mcfg.wandb_entity,
                name=mcfg.wandb_run_name or job_name,
                id=run_id,
                resume="allow",
                dir=str(run_dir),
                mode=mcfg.wandb_mode,
                # A second trainer in the same process (tests, notebooks) must not end another's run.
                reinit="create_new",
                # console="off": train.log already holds the console, W&B must not wrap sys.stdout; silent: the
                # trainer says where the run is (below, and at the end) instead of W&B's banners.
                settings=wandb.Settings(console="off", silent=True),
            )
        except Exception as e:  # noqa: BLE001 - W&B's errors have many types; the user needs one line
            hint = ("run `wandb login` (or set WANDB_API_KEY), or use --metrics.wandb_mode=offline and `wandb sync` "
                    "later" if mcfg.wandb_mode == "online" else "set metrics.wandb = false to train without W&B")
            message = " ".join(str(e).split()) or type(e).__name__
            raise UserError(f"metrics.wandb: W&B could not start a run in {run_dir} ({message}); {hint}") from None
        # On resume the config may have changed (more steps, a new LR): the latest values win.
        run.config.update(config, allow_val_change=True)
        if not disabled:
            where = run.url if mcfg.wandb_mode == "online" else Path(run.dir).parent
            logger.info(f"wandb: {mcfg.wandb_mode} run {run.id} ({where})")
        return cls(run, logger)

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Log ``value`` under ``tag`` at ``step``; W&B merges the values of one step into one row."""
        self.run.log({tag: value}, step=step)

    def close(self, end: RunEnd | None) -> None:
        """Finish the W&B run: a stop (preemption) is reported as such, a failure as exit code 1."""
        if end == "stopped":
            self.run.mark_preempting()
        offline = self.run.settings.mode == "offline"
        where = Path(self.run.dir).parent if offline else None
        self.run.finish(exit_code=0 if end in ("success", "stopped") else 1)
        if offline:
            self.logger.info(f"wandb: offline run saved; upload it with: wandb sync {where}")
