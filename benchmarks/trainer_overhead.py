"""What the trainer costs beyond the model: whole trainer runs against a bare step loop, interleaved.

    python -m benchmarks.trainer_overhead [--shape toy|matched|debug] [--steps K] [--rounds N] [--threads T]

Each round builds a fresh :class:`~torchnlq.train.trainer.Trainer` and takes one step with it (neither
timed: the optimizer's state and the allocator warm up), then times, in a shuffled order, in the same
process and on the same model and optimizer objects:

- ``trainer``: ``Trainer.train()`` for the next K steps: everything a run does per step (LR, data reads,
  forward, loss, backward, clipping, the non-finite check, the optimizer, metrics every
  ``metrics.log_interval`` steps, the schedules of validation, diagnostics and checkpoints, which
  are off here), and its end (the last log line, run_info.json);
- ``bare``: K steps of nanoGPT's inner loop on pre-read batches: ``F.cross_entropy(model(x), y)``,
  backward, ``clip_grad_norm_``, ``optimizer.step()``, ``zero_grad``.

Times are CPU seconds of this process per step (steadier than wall time on a shared machine); the
ratio is the median over rounds of trainer / bare within a round. A cProfile of one more trainer
run splits the step into model (forward + loss), backward, optimizer, clipping, data and the rest.

Shapes (fp32; TensorBoard, validation and diagnostics off):
- ``toy``: nanoGPT's toy comparison, 4 layers, d 128, 4 heads, 16 x 128 tokens, GPT-2 vocabulary;
- ``matched``: the torchtitan comparison, 6 layers, d 256, 16 heads, RoPE, untied, a 2048-row
  vocabulary (``model.vocab_size``; the tokens are bytes), 8 x 256 tokens;
- ``debug``: train_configs/debug_model.toml as it is, on CPU.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.timing import describe_machine, machine_info, markdown_table, median
from benchmarks.train_step_support import quiet_trainer_logs, write_random_corpus
from torchnlq.config.manager import load_job_config
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.errors import UserError
from torchnlq.train.trainer import Trainer

COMMON = ["--training.device=cpu", "--validation.enabled=false", "--metrics.tensorboard=false",
          "--metrics.query_diagnostics_interval=0", "--metrics.weight_dynamics_interval=0",
          "--checkpoint.enabled=false"]
RANDOM_DATA = ["--data.synthetic=false", "--model.query.type=linear"]
SHAPES = {
    "toy": ("gpt2", ["--model.flavor=debug", "--model.n_layers=4", "--model.dim=128", "--model.n_heads=4",
                     "--training.micro_batch_size=16", "--training.seq_len=128"]),
    "matched": ("byte", ["--model.flavor=debug", "--model.n_layers=6", "--model.dim=256", "--model.n_heads=16",
                         "--model.positions=rope", "--model.tie_embeddings=false", "--model.vocab_size=2048",
                         "--training.micro_batch_size=8", "--training.seq_len=256"]),
    "debug": ("byte", ["train_configs/debug_model.toml"]),
}
#: cProfile functions whose cumulative time is one part of the step, in the order they are subtracted.
PARTS = {
    "forward + loss": "micro_batch_loss",
    "backward": "run_backward",
    "optimizer": "optimizer.py",
    "clipping": "clip_grad_norm",
    "data": "micro_batches",
    "metrics (log steps)": "log_step",
    "query diagnostics": "log_query_diagnostics",
    "weight dynamics": "log_weight_dynamics",
    "run_info.json": "write_run_info",
}


def _config(shape: str, folder: Path, tmp: Path, steps: int, name: str, extra: list[str]) -> object:
    tokenizer, args = SHAPES[shape]
    # The debug run's own synthetic corpus, made in the temporary folder (its relative path would be the cwd's).
    data = ([f"--data.path={folder / 'synthetic'}"] if shape == "debug"
            else [*RANDOM_DATA, f"--data.path={folder}", f"--data.tokenizer={tokenizer}"])
    return load_job_config([*args, *COMMON, *data, f"--training.steps={steps}", f"--job.dump_folder={tmp}",
                            f"--job.name={name}", *extra])


def _trainer(cfg: object) -> Trainer:
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = Trainer(cfg)  # type: ignore[arg-type]
    quiet_trainer_logs()
    return trainer


def _bare_loop(trainer: Trainer, steps: int) -> float:
    """CPU seconds per step of nanoGPT's inner loop on the trainer's model and optimizer."""
    model, optimizer, max_norm = trainer.model, trainer.optimizer, trainer.cfg.training.max_norm
    batches = [next(iter(trainer.loader.micro_batches(s))) for s in range(steps)]
    start = time.process_time()
    for x, y in batches:
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.process_time() - start) / steps


def _trainer_run(trainer: Trainer, steps: int) -> float:
    start = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return (time.process_time() - start) / steps


def breakdown(trainer: Trainer, steps: int) -> list[tuple[str, float]]:
    """(part, CPU ms per step) of one profiled trainer run; 'the rest' is the trainer's own work."""
    profile = cProfile.Profile()
    profile.enable()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, fn), (_, _, tt, _, _) in stats.items())
    parts = []
    for label, name in PARTS.items():
        if name.endswith(".py"):  # the optimizer: torch's wrapper of every optimizer.step()
            cumulative = sum(ct for (file, _, fn), (_, _, _, ct, _) in stats.items()
                             if file.endswith(f"torch/optim/{name}") and fn == "wrapper")
        else:
            cumulative = max((ct for (_, _, fn), (_, _, _, ct, _) in stats.items() if name in fn), default=0.0)
        parts.append((label, 1000 * cumulative / steps))
    parts.append(("the rest (the trainer's own work)", 1000 * total / steps - sum(ms for _, ms in parts)))
    return parts


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.trainer_overhead``."""
    parser = ArgumentParser(prog="python -m benchmarks.trainer_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="toy", help="the model and batch (default: toy)")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed run (default: 20)")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default: 12)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args(argv)
    for flag in ("steps", "rounds", "threads"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    torch.set_num_threads(args.threads)
    trainer_s, bare_s = [], []
    with tempfile.TemporaryDirectory(prefix="torchnlq-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        tokenizer = SHAPES[args.shape][0]
        folder = write_random_corpus(tmp / "data", tokenizer) if args.shape != "debug" else tmp
        rng = random.Random(0)
        for index in range(args.rounds + 1):  # round 0 warms up (allocator, caches) and is not counted
            trainer = _trainer(_config(args.shape, folder, tmp, args.steps + 1, f"r{index}", []))
            trainer.train_step()  # untimed: the optimizer's state and the allocator's first sizes, for both loops
            order = [0, 1]
            rng.shuffle(order)
            times = {}
            for which in order:
                times[which] = _trainer_run(trainer, args.steps) if which == 0 else _bare_loop(trainer, args.steps)
            if index:
                trainer_s.append(times[0])
                bare_s.append(times[1])
        profiled = _trainer(_config(args.shape, folder, tmp, args.steps + 1, "profiled", []))
        profiled.train_step()
        parts = breakdown(profiled, args.steps)
    ratios = [t / b for t, b in zip(trainer_s, bare_s)]
    print(f"# trainer overhead, shape {args.shape}: {args.rounds} rounds of {args.steps} steps, {args.threads} "
          f"thread(s); {describe_machine(machine_info(torch.device('cpu')))}")
    print(markdown_table(
        ["loop", "CPU ms/step (median)", "vs bare (median of rounds)", "range"],
        [["trainer", f"{1000 * median(trainer_s):.1f}", f"{median(ratios):.3f}×",
          f"{min(ratios):.3f}–{max(ratios):.3f}"],
         ["bare", f"{1000 * median(bare_s):.1f}", "1.000×", ""]],
        right=[False, True, True, True]))
    print()
    print(markdown_table(["part of the trainer step (cProfile)", "CPU ms/step"], [[p, f"{ms:.2f}"] for p, ms in parts],
                         right=[False, True]))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
