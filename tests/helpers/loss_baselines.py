"""The stored losses of the debug run (tests/data/loss_baselines/<case>.json), and the one way they are made.

Each case is a short run of a debug config (SHORT_RUN below), trained in-process on one CPU thread, as
tests/test_loss_regression.py trains it again to compare. After a deliberate change of the numerics
(an init, an op's order, the data order), re-bless the stored losses and say why in the commit:

    python tests/helpers/loss_baselines.py              # every case
    python tests/helpers/loss_baselines.py linear       # the cases named

A file records the equivalent ./run_train.sh command, so scripts/loss_compare.py can compare it with a run.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: `helpers` and this checkout's torchnlq (not tests/helpers/*.py)
    sys.path[0:1] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

import torch

from helpers import REPO_ROOT
from torchnlq.config.manager import load_job_config
from torchnlq.experiments.loss_compare import Losses, read_run

FOLDER = REPO_ROOT / "tests" / "data" / "loss_baselines"
# Seconds each on two shared cores; every step's loss is logged, validation at 10, 20, 30.
SHORT_RUN = (
    "--training.steps=30", "--training.micro_batch_size=8", "--training.seq_len=64", "--training.device=cpu",
    "--lr_schedule.warmup_steps=5", "--validation.interval=10", "--validation.sequences=16",
    "--metrics.log_interval=1", "--debug.deterministic=true",
)
DEBUG, LLAMA = "train_configs/debug_model.toml", "train_configs/llama_debug.toml"
CASES: dict[str, tuple[str, tuple[str, ...]]] = {  # name -> (config, its overrides before SHORT_RUN)
    "residual_mlp": (DEBUG, ()),  # the paper's query, as the debug config has it
    "linear": (DEBUG, ("--model.query.type=linear",)),
    "identity": (DEBUG, ("--model.query.type=identity",)),
    "residual": (DEBUG, ("--model.query.type=residual",)),
    "llama_linear": (LLAMA, ("--model.n_layers=2",)),  # RMSNorm, SwiGLU, RoPE, untied head; 2 of its 6 layers
}


def overrides(name: str) -> list[str]:
    """The options of case ``name`` after its config file (what changes the numbers; paths are added apart)."""
    return [*CASES[name][1], *SHORT_RUN]


def train_case(name: str, folder: Path) -> Losses:
    """Train case ``name`` in-process on one thread (dump folder and synthetic corpus in ``folder``); its losses."""
    args = [str(REPO_ROOT / CASES[name][0]), *overrides(name),
            f"--job.dump_folder={folder}", f"--job.name={name}", f"--data.path={folder / 'data'}"]
    from torchnlq.train.trainer import Trainer

    import torch._inductor.config as inductor_config

    # debug.deterministic is process-wide: what the rest of a test session runs with is put back afterwards.
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, inductor_config.deterministic)
    torch.set_num_threads(1)  # two threads sum in another order: see docs/training.md, "Loss regression"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            Trainer(load_job_config(args)).train()
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, inductor_config.deterministic = before[2:]
    return read_run(folder / name)


def stored(name: str) -> dict:
    """The stored file of case ``name``."""
    return json.loads((FOLDER / f"{name}.json").read_text())


def write_baseline(name: str, losses: Losses) -> Path:
    """Store ``losses`` as case ``name``'s file, with how they were made."""
    record = {
        "case": name,
        "command": " ".join(["OMP_NUM_THREADS=1 ./run_train.sh", CASES[name][0], *overrides(name)]),
        "torch": torch.__version__,
        "threads": 1,
        "date": datetime.date.today().isoformat(),
        "regenerate": f"python tests/helpers/loss_baselines.py {name}",
        **{f"{kind}_loss": {str(step): loss for step, loss in sorted(losses[kind].items())} for kind in losses},
    }
    FOLDER.mkdir(parents=True, exist_ok=True)
    path = FOLDER / f"{name}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def main(argv: list[str]) -> int:
    import tempfile

    from torchnlq.cli import ArgumentParser
    from torchnlq.errors import UserError

    p = ArgumentParser(prog="loss_baselines.py", description="Re-bless the stored losses of the loss-regression "
                       "test (tests/data/loss_baselines/).")
    p.add_argument("cases", nargs="*", metavar="CASE", help=f"cases to regenerate (default: all): {', '.join(CASES)}")
    names = p.parse_args(argv).cases or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise UserError(f"unknown case(s) {', '.join(unknown)}; the cases are: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            print(f"wrote {write_baseline(name, train_case(name, Path(tmp) / name))}")
    return 0


if __name__ == "__main__":
    from torchnlq.cli import run_cli

    sys.exit(run_cli(main))
