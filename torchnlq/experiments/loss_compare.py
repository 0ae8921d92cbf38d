"""The per-step losses of two runs side by side (scripts/loss_compare.py; docs/training.md, "Loss regression").

A side that trains runs in a temporary folder of its own, removed afterwards; ``REF:CONFIG`` is extracted with
``git archive`` (git only reads the repository).
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError
from torchnlq.experiments.compare import read_scalars
from torchnlq.files import read_json

Losses = dict[str, dict[int, float]]  # "train" / "val" -> {step: loss}
KINDS = ("train", "val")
CHECKOUT = Path(__file__).resolve().parents[2]  # the repository whose commits REF:CONFIG names


@dataclass
class Side:
    """One side of the comparison: ``read`` (a run folder or loss file), or ``config`` to train (at ``commit``)."""

    label: str
    spec: str
    read: Path | None = None
    config: str = ""
    commit: str | None = None
    overrides: list[str] = field(default_factory=list)


def _git(*args: str, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=text)


def parse_side(label: str, spec: str, shared: list[str], own: list[str]) -> Side:
    """What ``spec`` names, trained with the overrides ``shared`` + ``own`` (--set, --set-a/b); a mistake (a missing
    file, an unknown commit, a bad override) is one line, before any run."""
    path = Path(spec)
    overrides = [_override(s) for s in shared + own]
    if path.is_dir() or (path.is_file() and path.suffix == ".json"):
        if own:
            raise UserError(f"--set-{label.lower()} applies to a side that trains (a config or REF:CONFIG), not to "
                            f"{label} '{spec}', whose losses are read")
        return Side(label, spec, read=path)
    if path.is_file() and path.suffix == ".toml":
        load_job_config([str(path), *overrides])  # the config's mistakes now, not after side A trained
        return Side(label, spec, config=str(path.resolve()), overrides=overrides)
    ref, sep, config = spec.partition(":")
    if not sep or path.exists() or not config.endswith(".toml"):
        raise UserError(f"{label} '{spec}' is neither a run folder, a loss file (.json), a config (.toml) nor "
                        "REF:CONFIG (a config at a git commit, e.g. HEAD~1:train_configs/debug_model.toml)")
    found = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if found.returncode != 0:
        raise UserError(f"{label} '{spec}': '{ref}' is not a commit of the git checkout '{CHECKOUT}'")
    commit = found.stdout.strip()
    if _git("cat-file", "-e", f"{commit}:{config}").returncode != 0:
        raise UserError(f"{label} '{spec}': commit {ref} has no file '{config}' (a path from the repository's root)")
    return Side(label, spec, config=config, commit=commit, overrides=overrides)


def _override(text: str) -> str:
    key, sep, value = text.partition("=")
    if not sep or not key or key.startswith("-"):
        raise UserError(f"--set '{text}' is not KEY=VALUE (e.g. --set training.steps=30)")
    return f"--{key}={value}"


def read_run(folder: Path) -> Losses:
    """A run folder's losses from its TensorBoard events."""
    scalars = read_scalars(folder / "tb") if (folder / "tb").is_dir() else {}
    if not scalars.get("loss/train"):
        raise UserError(f"'{folder}' holds no training losses (loss/train in {folder / 'tb'}); give a run folder "
                        "of a run with metrics.tensorboard = true")
    return {"train": scalars["loss/train"], "val": scalars.get("loss/val", {})}


def read_loss_file(path: Path) -> Losses:
    """A loss file's losses: {"train_loss": {step: loss}, "val_loss": {step: loss}}."""
    data = read_json(path, "a loss file", "give a loss file or a run folder")
    losses: Losses = {}
    for kind in KINDS:
        table = data.get(f"{kind}_loss", {}) if isinstance(data, dict) else None
        try:
            losses[kind] = {int(step): float(loss) for step, loss in table.items()}  # type: ignore[union-attr]
        except (AttributeError, TypeError, ValueError):
            raise UserError(f"'{path}' is not a loss file: its {kind}_loss must map steps to losses, e.g. "
                            '{"1": 5.73, "2": 5.41}') from None
    if not losses["train"]:
        raise UserError(f"'{path}' is not a loss file: it has no train_loss")
    return losses


def train(side: Side, work: Path) -> Losses:
    """Train ``side`` with run_train.sh (this checkout's, or its commit's files) in ``work``; its losses."""
    root = CHECKOUT
    if side.commit is not None:
        root = work / "checkout"
        # The commit's files from ``git archive``: git only reads the repository (a worktree would write into
        # .git, and a signal in the middle could leave it there, locked).
        archive = _git("archive", "--format=tar", str(side.commit), text=False)
        if archive.returncode != 0:
            raise UserError(f"git archive of {side.spec} failed: {archive.stderr.decode(errors='replace').strip()}")
        root.mkdir()
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(root, filter="data")  # no member outside root, no device files
    config = root / side.config if side.commit else Path(side.config)
    # This interpreter, importing that checkout's torchnlq: run_train.sh then uses it as it is (no new .venv).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(root), "NGPU": "1"}
    fixed = [f"--job.dump_folder={work / 'outputs'}", "--job.name=run"]  # where the losses are read back
    command = [str(root / "run_train.sh"), str(config), "--metrics.log_interval=1", *side.overrides, *fixed]
    print(f"training {side.label}: {side.spec} {' '.join(side.overrides)}".rstrip(), flush=True)
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise UserError(f"the run of {side.label} ({side.spec}) failed with exit code {done.returncode}: {last}")
    return read_run(work / "outputs" / "run")


def difference_table(a: Losses, b: Losses, tolerance: float) -> tuple[str, list[str]]:
    """The per-step table (rows beyond ``tolerance`` marked ``*``) with its summary, and the list of problems: the
    steps from where both sides start (a branch's first step, say) that differ or that one side lacks."""
    lines = [f"{'loss':<5} {'step':>6} {'A':>15} {'B':>15} {'B - A':>11} {'rel diff':>9}"]
    problems: list[str] = []
    for kind in KINDS:
        seen: list[tuple[float, float, int]] = []  # (relative difference, NaN as inf; |B - A|; step)
        # A branch (a run started from another's checkpoint) has no losses before its branch point: compared from
        # where both sides have losses, and said.
        start = max(min(a[kind]), min(b[kind])) if a[kind] and b[kind] else 0
        if start and min(a[kind]) != min(b[kind]):
            lines.append(f"{kind}: A starts at step {min(a[kind])}, B at step {min(b[kind])}; "
                         f"compared from step {start}")
        for step in sorted(s for s in a[kind].keys() | b[kind].keys() if s >= start):
            x, y = a[kind].get(step), b[kind].get(step)
            if x is None or y is None:
                problems.append(f"{kind} step {step} is only in {'A' if y is None else 'B'}")
                lines.append(f"{kind:<5} {step:>6} {'-' if x is None else f'{x:.9g}':>15} "
                             f"{'-' if y is None else f'{y:.9g}':>15}")
                continue
            # |B - A| / |A|: 0 for equal values (two NaNs included), inf when A = 0 != B, NaN for NaN against a number
            if x == y or (math.isnan(x) and math.isnan(y)):
                rel = 0.0
            else:
                rel = abs(y - x) / abs(x) if x != 0 else math.inf
            beyond = not rel <= tolerance  # NaN against a number is beyond any tolerance
            if beyond:
                problems.append(f"{kind} step {step}: rel diff {rel:.2e}")
            seen.append((math.inf if math.isnan(rel) else rel, abs(y - x) if rel else 0.0, step))
            mark = " *" if beyond else ""
            lines.append(f"{kind:<5} {step:>6} {x:>15.9g} {y:>15.9g} {y - x:>+11.2e} {rel:>9.2e}{mark}")
        if seen:
            rel, _, step = max(seen)
            where = f" (step {step})" if rel else ""
            lines.append(f"{kind}: max |B - A| {max(s[1] for s in seen):.3e}, max rel diff {rel:.3e}{where}")
    verdict = (f"{len(problems)} problem(s) beyond tolerance {tolerance:g}: " + "; ".join(problems[:5])
               + (" ..." if len(problems) > 5 else "")) if problems else f"equal within tolerance {tolerance:g}"
    return "\n".join([*lines, verdict]), problems


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="loss_compare.py", description=__doc__.split("\n\n")[0])
    for name in ("A", "B"):
        p.add_argument(name.lower(), metavar=name, help="a run folder, a loss file (.json), a config (.toml) to "
                       "train with this checkout, or REF:CONFIG to train at git commit REF")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for the sides that train (repeatable), e.g. --set training.steps=30")
    for name in ("a", "b"):
        p.add_argument(f"--set-{name}", action="append", default=[], metavar="KEY=VALUE",
                       help=f"a config override for side {name.upper()} only (after --set's)")
    p.add_argument("--tolerance", type=float, default=0.0, metavar="REL",
                   help="the relative difference |B - A| / |A| allowed at a step (default 0: bitwise equal)")
    p.add_argument("--assert-equal", action="store_true",
                   help="exit 1 when a step differs beyond --tolerance or is missing on one side")
    args = p.parse_args(argv)
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise UserError(f"--tolerance must be a finite number at least 0, got {args.tolerance}")
    sides = [parse_side("A", args.a, args.set, args.set_a), parse_side("B", args.b, args.set, args.set_b)]
    if args.set and all(side.read for side in sides):
        raise UserError("--set applies to the sides that train (a config or REF:CONFIG); A and B are both read")
    with tempfile.TemporaryDirectory(prefix="loss_compare-", ignore_cleanup_errors=True) as tmp:
        losses = []
        for side in sides:
            (Path(tmp) / side.label).mkdir()
            if side.read is None:
                losses.append(train(side, Path(tmp) / side.label))
            else:
                losses.append(read_loss_file(side.read) if side.read.is_file() else read_run(side.read))
    table, problems = difference_table(*losses, args.tolerance)
    print(f"A: {args.a}\nB: {args.b}\n{table}")
    return 1 if args.assert_equal and problems else 0


def cli() -> int:
    """Entry point of scripts/loss_compare.py: user errors are one line with exit code 2."""
    return run_cli(main)
