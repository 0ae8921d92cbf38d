"""Compare finished training runs the way the paper's Table 1 does, with seeds grouped.

Runs whose configs differ only in ``training.seed`` (and result-neutral keys) form one group;
the table and its statistics are described in docs/experiments.md.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.config.manager import flatten
from torchnlq.errors import UserError
from torchnlq.files import OwnedFolder, no_folder_left_on_failure, replace_file
from torchnlq.experiments.compare_bytes import bits_per_byte, tokenizer_label
from torchnlq.experiments.compare_plots import X_AXES, tokens_per_step  # imports no matplotlib

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Sections that cannot change a run's losses (but checkpoint.initial_load_*, see result_config).
IGNORED_SECTIONS = ("job", "checkpoint", "metrics")
# Config keys the table always shows in columns of its own (query, max LR, min LR, weight decay).
FIXED_COLUMN_KEYS = ("model.query.type", "optimizer.lr", "lr_schedule.min_lr", "optimizer.weight_decay")
_SEED_IN_NAME = re.compile(r"(^|[_-])seed-?\d+")


@dataclass
class RunData:
    """What a comparison needs from one run folder."""

    path: Path
    name: str
    config: dict[str, Any]
    info: dict[str, Any]
    val: dict[int, float]  # step -> validation loss
    train: dict[int, float]  # step -> training loss
    # tag -> {step: value} of the weight-dynamics scalars (weights/layer{i}/{matrix}/{stat}), if logged
    weights: dict[str, dict[int, float]] = field(default_factory=dict)
    # "lr", and lr/<group> for each optimizer group when the groups are not the paper's two: {step: value}
    lrs: dict[str, dict[int, float]] = field(default_factory=dict)
    # task -> {step: acc_norm} of the multiple-choice tasks scored in the loop ([downstream]), if any
    downstream: dict[str, dict[int, float]] = field(default_factory=dict)
    # a mixture's sources: name -> {step: validation loss} (loss/val/<name>)
    val_sources: dict[str, dict[int, float]] = field(default_factory=dict)
    # step -> validation bits per byte, filled by compare() for runs of different tokenizers
    bits_per_byte: dict[int, float] | None = None

    @property
    def tokenizer(self) -> str:
        """The tokenizer the run used (its name; an hf tokenizer.json's sha256 too)."""
        return tokenizer_label(self.config, self.info)

    @property
    def seed(self) -> Any:
        return self.config.get("training", {}).get("seed")


@dataclass
class Group:
    """Runs that differ only by training.seed."""

    name: str
    runs: list[RunData]
    row: dict[str, Any] = field(default_factory=dict)  # filled by compare()


def read_scalars(tb_dir: Path) -> dict[str, dict[int, float]]:
    """TensorBoard scalars as {tag: {step: value}}; a later event at a step wins (a resumed run's rewrite)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def load_run(path: Path) -> RunData:
    """Read a run folder; a missing piece is a one-line UserError."""
    for needed in ("config.toml", "run_info.json"):
        if not (path / needed).is_file():
            raise UserError(f"'{path}' is not a run folder: it has no {needed}")
    try:
        with (path / "config.toml").open("rb") as f:
            config = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"'{path / 'config.toml'}' is not valid TOML ({e}); the trainer writes it: restore it "
                        "or leave this run out") from None
    try:
        info = json.loads((path / "run_info.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"'{path / 'run_info.json'}' is not valid JSON ({e}); the trainer rewrites it when the run "
                        "resumes, or leave this run out") from None
    if not isinstance(info, dict):
        raise UserError(f"'{path / 'run_info.json'}' is not a JSON object; leave this run out")
    # What the comparison reads of the two records, checked here: a hand-edited or foreign file is one line.
    for section in ("training", "data", "checkpoint", "optimizer", "lr_schedule"):
        if not isinstance(config.get(section, {}), dict):
            raise UserError(f"'{path / 'config.toml'}' has {section} = {config[section]!r}, not a table; the trainer "
                            "writes it: restore it or leave this run out")
    for section, key in (("optimizer", "lr"), ("optimizer", "weight_decay"), ("lr_schedule", "min_lr")):
        value = config.get(section, {}).get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"'{path / 'config.toml'}' has no number {section}.{key} (it has {value!r}); the trainer "
                            "writes it: restore it or leave this run out")
    for key, kinds in (("non_embedding_params", (int,)), ("active_non_embedding_params", (int, type(None))),
                       ("batch_fingerprint", (str, type(None))),
                       ("validation_fingerprint", (str, type(None)))):
        value = info.get(key)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise UserError(f"'{path / 'run_info.json'}' has {key} = {value!r}, not what the trainer writes; it "
                            "rewrites the file when the run resumes, or leave this run out")
    scalars = read_scalars(path / "tb") if (path / "tb").is_dir() else {}
    val = scalars.get("loss/val", {})
    if not val:
        raise UserError(f"run '{path}' has no validation losses (loss/val) in {path / 'tb'}")
    weights = {tag: values for tag, values in scalars.items() if tag.startswith("weights/layer")}
    lrs = {tag: values for tag, values in scalars.items() if tag == "lr" or tag.startswith("lr/")}
    downstream = {tag.split("/")[1]: values for tag, values in scalars.items()
                  if tag.startswith("downstream/") and tag.endswith("/acc_norm")}
    val_sources = {tag[len("loss/val/"):]: values for tag, values in scalars.items() if tag.startswith("loss/val/")}
    return RunData(path, str(info.get("name", path.name)), config, info, val, scalars.get("loss/train", {}), weights,
                   lrs, downstream, val_sources)


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Run folders as given; a folder without run_info.json stands for the run folders inside it."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / "run_info.json").is_file():
            out.append(p)
        elif p.is_dir() and (children := sorted(c for c in p.iterdir() if (c / "run_info.json").is_file())):
            out.extend(children)
        else:
            raise UserError(f"'{p}' is neither a run folder (with run_info.json) nor a folder of runs")
    seen: dict[Path, Path] = {}
    for p in out:  # one run given twice (a symlink, "a/../a") would count as two seeds
        if p.resolve() in seen and seen[p.resolve()] != p:
            raise UserError(f"'{p}' and '{seen[p.resolve()]}' are the same run folder; give each run once")
        seen.setdefault(p.resolve(), p)
    return list(dict.fromkeys(out))


def result_config(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config without the seed and the result-neutral sections (what makes runs different arms)."""
    kept = {k: v for k, v in config.items() if k not in IGNORED_SECTIONS}
    kept["checkpoint"] = {k: v for k, v in config.get("checkpoint", {}).items() if k.startswith("initial_load")}
    kept["training"] = {k: v for k, v in config.get("training", {}).items() if k != "seed"}
    return kept


def differing_keys(groups: list[Group]) -> list[str]:
    """The section.key names whose values differ between the groups (beside the table's fixed columns)."""
    flat = [flatten(result_config(g.runs[0].config)) for g in groups]
    names = dict.fromkeys(k for f in flat for k in f)
    return [k for k in names if k not in FIXED_COLUMN_KEYS
            and len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flat}) > 1]


def group_runs(runs: list[RunData]) -> list[Group]:
    """Seed groups in order of first appearance, named after their first run minus its seed."""
    by_key: dict[str, list[RunData]] = {}
    for run in runs:
        key = json.dumps(result_config(run.config), sort_keys=True, default=str)
        by_key.setdefault(key, []).append(run)
    groups, used = [], set()
    for members in by_key.values():
        name = members[0].name
        if len(members) > 1:
            name = _SEED_IN_NAME.sub("", name).strip("_-") or name
        while name in used:
            name += "+"
        used.add(name)
        groups.append(Group(name, members))
    return groups


def check_same_data(runs: list[RunData]) -> None:
    """Refuse runs that did not see identical training batches and validation sequences."""
    if len({r.tokenizer for r in runs}) > 1:  # losses per token of different vocabularies do not compare
        detail = ", ".join(f"{r.name}={r.tokenizer}" for r in runs)
        raise UserError(f"the runs use different tokenizers ({detail}): their losses per token do not compare; "
                        "pass --allow-different-data to compare them anyway (compare_runs.py then compares them in "
                        "bits per byte)")
    for key, what in (("batch_fingerprint", "training batches"), ("validation_fingerprint", "validation sequences")):
        values = {r.info.get(key) for r in runs}
        if len(values) > 1:
            detail = ", ".join(f"{r.name}={r.info.get(key)}" for r in runs)
            raise UserError(f"the runs saw different {what} ({key}: {detail}); compare runs with the same data.seed, "
                            "batch size and steps, or pass --allow-different-data")


@dataclass
class ComparedStep:
    """Where the comparison reads each run's validation loss: a step per run, and how it was chosen."""

    steps: dict[Path, int]  # run folder -> its step
    header: str  # the table's loss column
    how: str  # the sentence comparison.md says it with

    def of(self, run: RunData) -> int:
        """``run``'s step."""
        return self.steps[run.path]


def comparison_point(runs: list[RunData], step: int | None = None, tokens: int | None = None) -> ComparedStep:
    """``step`` (every run must have validated there), ``tokens`` (each run's step that saw that many); else, when a
    run is a branch (it went on from another's checkpoint), each run at its own last validation, as docs/training.md
    says: a step the branches share may find one still decaying; else the last validation step every run has, else
    again each run's own last validation."""
    if step is not None and tokens is not None:
        raise UserError("give --step or --tokens, not both")
    if tokens is not None:
        steps = {}
        for run in runs:
            per = tokens_per_step(run)
            if tokens % per or tokens // per not in run.val:
                near = sorted(run.val, key=lambda s: abs(s * per - tokens))[:3]
                raise UserError(f"run '{run.name}' has no validation at {tokens:,} tokens ({per:,} tokens per step; it "
                                f"validated nearest at {', '.join(f'{s * per:,}' for s in sorted(near))} tokens)")
            steps[run.path] = tokens // per
        return ComparedStep(steps, f"val loss @ {tokens:,} tokens",
                     f"Validation loss at {tokens:,} training tokens (the step column: each run's step there)")
    common = set.intersection(*(set(r.val) for r in runs))
    if step is not None:
        if step not in common:
            raise UserError(f"step {step} is not a validation step of every run (common: {sorted(common)[-5:]}...)")
        return ComparedStep({r.path: step for r in runs}, f"val loss @ {step}", f"Validation loss at step {step}")
    last = {r.path: max(r.val) for r in runs}
    branches = [r.name for r in runs if branch_start(r) is not None]
    if branches:
        return ComparedStep(last, "val loss @ last validation",
                     f"{', '.join(branches)} went on from another run's checkpoint (a branch): every run is compared "
                     "at its own last validation, the step column, where each branch's schedule ended (a step the "
                     "runs share may find a branch still decaying; --step or --tokens picks one)")
    if common:
        at = max(common)
        return ComparedStep({r.path: at for r in runs}, f"val loss @ {at}",
                     f"Validation loss at step {at}, the last validation step common to all runs")
    return ComparedStep(last, "val loss @ last validation",
                 "The runs share no validation step: each is compared at its own last validation, the step column")


def branch_start(run: RunData) -> int | None:
    """The step a branch went on from (its source checkpoint's step-N, when the run continued that progress)."""
    source = run.info.get("initialized_from")
    found = re.search(r"step-(\d+)/?$", source) if isinstance(source, str) else None
    if found is None or min(run.val) < int(found.group(1)):  # weights only: the run counted its own steps from 0
        return None
    return int(found.group(1))


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def compare(runs: list[RunData], baseline: RunData, step: int | None = None,
            allow_different_data: bool = False, tokens: int | None = None) -> tuple[list[Group], Group, ComparedStep]:
    """Group, pick where each run is read, fill each group's row; returns (groups, baseline group, point)."""
    if not allow_different_data:
        check_same_data(runs)
    at = comparison_point(runs, step, tokens)
    groups = group_runs(runs)
    for g in groups:  # seeds of one arm are averaged: read at one point, or the mean mixes stages of training
        steps = sorted({at.of(r) for r in g.runs})
        if len(steps) > 1:
            raise UserError(f"runs {', '.join(r.name for r in g.runs)} differ only in their seed "
                            "but share no validation "
                            f"step (each read at its last: {', '.join(map(str, steps))}); finish them to a common step "
                            "or compare at --step/--tokens")
    base = next(g for g in groups if any(r.path == baseline.path for r in g.runs))
    by_bytes = len({r.tokenizer for r in runs}) > 1  # per-token losses do not compare: bits per byte do
    if by_bytes:
        for r in runs:
            r.bits_per_byte = bits_per_byte(r.name, r.config, r.val, r.val_sources)
            if at.of(r) not in r.bits_per_byte:
                raise UserError(f"run '{r.name}' logged no loss of every source at step {at.of(r)}; compare at "
                                "another --step")
        at.how += (f" (runs of different tokenizers, {', '.join(f'{r.name}: {r.tokenizer}' for r in runs)}: the "
                   "relative improvement is of the validation bits per byte, loss / ln 2 x tokens / bytes of each "
                   "run's validation split, as its meta.json records them; losses per token do not compare)")

    def compared(r: RunData) -> float:  # what the improvement is of
        return r.bits_per_byte[at.of(r)] if r.bits_per_byte is not None else r.val[at.of(r)]

    base_mean, base_std = _mean_std([compared(r) for r in base.runs])
    for g in groups:
        first = g.runs[0]
        mean, std = _mean_std([compared(r) for r in g.runs])
        improvement = 100.0 * (base_mean - mean) / base_mean
        se = None
        if g is not base and std is not None and base_std is not None:
            se = 100.0 * math.sqrt(std**2 / len(g.runs) + base_std**2 / len(base.runs)) / base_mean
        loss_mean, loss_std = _mean_std([r.val[at.of(r)] for r in g.runs])
        g.row = {
            "name": g.name, "baseline": g is base, "runs": len(g.runs),
            "seeds": " ".join(str(r.seed) for r in g.runs), "query_type": first.info.get("query_type"),
            "non_embedding_params": first.info.get("non_embedding_params"),
            "active_non_embedding_params": first.info.get("active_non_embedding_params"),  # an older run's: None
            "max_lr": first.config["optimizer"]["lr"], "min_lr": first.config["lr_schedule"]["min_lr"],
            "weight_decay": first.config["optimizer"]["weight_decay"],
            "step": "/".join(str(s) for s in dict.fromkeys(at.of(r) for r in g.runs)),
            "val_loss_mean": loss_mean, "val_loss_std": loss_std, "rel_improvement_pct": improvement,
            "rel_improvement_se_pct": se,
        } | ({"tokenizer": first.tokenizer, "val_bpb_mean": mean, "val_bpb_std": std} if by_bytes else {})
    differing = differing_keys(groups)
    for g in groups:  # a key a run's config lacks (an older trainer's) is None
        g.row |= {key: flatten(result_config(g.runs[0].config)).get(key) for key in differing}
    for task in downstream_tasks(runs):  # beside the loss: the task's acc_norm where every run of a group scored it
        for g in groups:
            values = [r.downstream.get(task, {}).get(at.of(r)) for r in g.runs]
            g.row[f"{task} acc_norm"] = statistics.fmean(values) if None not in values else None
    return groups, base, at


def downstream_tasks(runs: list[RunData]) -> list[str]:
    """The multiple-choice tasks any run scored in its loop, in order of first appearance."""
    return list(dict.fromkeys(task for r in runs for task in r.downstream))


def _params_cell(row: dict) -> str:
    """The non-embedding parameters, and the active ones beside them where they differ (an MoE)."""
    total, active = row["non_embedding_params"], row.get("active_non_embedding_params")
    return f"{total:,}" + (f" (active {active:,})" if active is not None and active != total else "")


def markdown_table(groups: list[Group], at: ComparedStep) -> str:
    """The comparison as a Markdown table (one row per seed group; a step column where the runs' steps differ)."""
    differing = differing_keys(groups)
    steps = len(set(at.steps.values())) > 1
    tasks = [key for key in groups[0].row if key.endswith(" acc_norm")]
    by_bytes = "val_bpb_mean" in groups[0].row  # runs of different tokenizers: the improvement is of bits per byte
    lines = [
        "| run | seeds | query | non-emb params | max LR | min LR | weight decay | "
        + ("tokenizer | " if by_bytes else "") + "".join(f"{key} | " for key in differing)
        + ("step | " if steps else "") + f"{at.header} | "
        + ("val bits/byte | " if by_bytes else "") + "rel. improvement |" + "".join(f" {task} |" for task in tasks),
        "| --- | --- | --- | ---: | ---: | ---: | ---: | " + ("--- | " if by_bytes else "") + "--- | " * len(differing)
        + ("---: | " if steps else "") + "---: | " + ("---: | " if by_bytes else "") + "---: |"
        + " ---: |" * len(tasks),
    ]
    for g in groups:
        r = g.row
        loss = f"{r['val_loss_mean']:.4f}" + (f" ± {r['val_loss_std']:.4f}" if r["val_loss_std"] is not None else "")
        gain = "0 (baseline)" if r["baseline"] else f"{r['rel_improvement_pct']:+.2f}%" + (
            f" ± {r['rel_improvement_se_pct']:.2f}" if r["rel_improvement_se_pct"] is not None else "")
        bpb = (f"{r['val_bpb_mean']:.4f}" + (f" ± {r['val_bpb_std']:.4f}" if r["val_bpb_std"] is not None else "")
               + " | ") if by_bytes else ""
        lines.append(f"| {r['name']} | {r['runs']} | {r['query_type']} | {_params_cell(r)} | "
                     f"{r['max_lr']:.3g} | {r['min_lr']:.3g} | {r['weight_decay']:.4g} | "
                     + (f"{_cell(r['tokenizer'])} | " if by_bytes else "")
                     + "".join(f"{_cell(r[key])} | " for key in differing) + (f"{r['step']} | " if steps else "")
                     + f"{loss} | {bpb}{gain} |" + "".join(" – |" if r[task] is None else f" {r[task]:.4f} |"
                                                           for task in tasks))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    """A config value as a Markdown table cell ("unset": the run's config.toml has no value, so the default)."""
    if value is None:
        return "unset"
    text = json.dumps(value, default=str) if isinstance(value, (bool, list, dict)) else str(value)
    return text.replace("|", "\\|")


def _csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_outputs(groups: list[Group], base: Group, at: ComparedStep, out: Path,
                  x: str = "steps") -> tuple[list[Path], str]:
    """comparison.md, comparison.csv, runs.csv and (with matplotlib) the two plots against ``x``; returns (paths, note).

    Files of the user's in ``out`` are never replaced (:class:`torchnlq.files.OwnedFolder`).
    """
    from torchnlq.experiments.compare_plots import plot_comparison

    plots, note = plot_comparison(groups, base, x)
    fp = groups[0].runs[0].info
    # The runs that did not start from scratch, and where they started (a branched decay, an upcycled model).
    lineage = "\n".join(f"- {r.name}: started from {r.info['initialized_from']}" for g in groups for r in g.runs
                         if isinstance(r.info.get("initialized_from"), str))
    text = (
        f"# Comparison against {base.name}\n\n{markdown_table(groups, at)}\n\n"
        f"{at.how}: mean ± sample std (n − 1) "
        f"over the seeds of a group. Relative improvement = (L_base − L)/L_base of the group means; ± is the "
        f"standard error of the difference of the two means, relative to L_base (needs ≥ 2 seeds on both sides). "
        f"Columns named section.key are the config values that differ between the groups.\n"
        f"Data: batch fingerprint {fp.get('batch_fingerprint')}, validation fingerprint "
        f"{fp.get('validation_fingerprint')}.\n"
        + (f"\nLineage:\n{lineage}\n" if lineage else "")
        + "".join(f"\n![{Path(name).stem}]({name})\n" for name in plots) + (f"\n{note}\n" if note else "")
    )
    files = {
        "comparison.md": text,
        "comparison.csv": _csv([g.row for g in groups]),
        "runs.csv": _csv([
            {"name": r.name, "group": g.name, "seed": r.seed, "path": str(r.path), "step": at.of(r),
             "val_loss": r.val[at.of(r)], "tokenizer": r.tokenizer,
             "val_bits_per_byte": r.bits_per_byte[at.of(r)] if r.bits_per_byte is not None else None,
             "finished": r.info.get("finished"), "batch_fingerprint": r.info.get("batch_fingerprint"),
             "initialized_from": r.info.get("initialized_from")}
            for g in groups for r in g.runs]),
        **plots,
    }
    folder = OwnedFolder(out)
    folder.check(list(files))  # before anything is written
    # Interrupted (SIGTERM, Ctrl-C, a full disk), the folder is put back as it was: never half a comparison.
    names = [*files, OwnedFolder.MANIFEST]
    kept = {n: (out / n).read_bytes() for n in names if (out / n).is_file() and not (out / n).is_symlink()}
    with no_folder_left_on_failure(out):  # a new folder (and the parents made for it) goes again
        try:
            return [folder.write(name, data) for name, data in files.items()], note
        except BaseException:
            for name in names:
                if name in kept:
                    replace_file(out / name, kept[name])
                else:
                    (out / name).unlink(missing_ok=True)
            raise


def check_out_folder(out: str | Path, runs: list[Path]) -> None:
    """Refuse an output folder that is a file, or a run folder (or inside one) among those compared."""
    target = Path(out).expanduser()
    if target.exists() and not target.is_dir():
        raise UserError(f"--out '{out}' exists and is not a folder; choose a folder for the comparison")
    for parent in target.parents:
        if parent.exists() and not parent.is_dir():
            raise UserError(f"--out '{out}' cannot be created: '{parent}' is a file, not a folder")
    resolved = target.resolve()
    for run in runs:
        run = run.resolve()
        if resolved == run or run in resolved.parents:
            raise UserError(f"--out '{out}' is inside the run folder '{run}' being compared; choose a folder outside "
                            "the runs (e.g. the default ./comparison)")


def compare_runs(paths: list[str | Path], baseline: str | Path, out: str | Path, step: int | None = None,
                 allow_different_data: bool = False, x: str = "steps", tokens: int | None = None) -> list[Path]:
    """Load, compare and write; ``baseline`` is a run folder or the name of one of the runs."""
    if x not in X_AXES:
        raise UserError(f"--x {x!r} is not an x axis; choose one of: {', '.join(X_AXES)}")
    folders = expand_paths(list(paths))
    check_out_folder(out, folders + ([Path(baseline)] if (Path(baseline) / "run_info.json").is_file() else []))
    runs = [load_run(p) for p in folders]
    base = next((r for r in runs if r.name == str(baseline) or r.path.resolve() == Path(baseline).resolve()), None)
    if base is None:
        if not (Path(baseline) / "run_info.json").is_file():
            raise UserError(f"baseline '{baseline}' is neither the name of one of the runs nor a run folder")
        base = load_run(Path(baseline))
        runs.insert(0, base)
    groups, base_group, at = compare(runs, base, step, allow_different_data, tokens)
    if x == "tokens":  # a run that cannot be put on a token axis is refused before anything is written
        for run in runs:
            tokens_per_step(run)
    written, _ = write_outputs(groups, base_group, at, Path(out), x)
    return written


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="compare_runs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders, or folders of run folders (e.g. a suite's dump folder)")
    p.add_argument("--baseline", required=True, help="the baseline run: its folder or its name among RUN")
    p.add_argument("--out", default="comparison", help="folder for comparison.md/.csv, runs.csv and plots")
    p.add_argument("--step", type=int, default=None,
                   help="compare at this validation step (default: with a branched run among them, each run at its "
                        "last validation; else the last common one, else each run's last)")
    p.add_argument("--tokens", type=int, default=None,
                   help="compare at this many training tokens (each run at its step that saw them)")
    p.add_argument("--allow-different-data", action="store_true", help="compare runs with different data fingerprints")
    p.add_argument("--x", choices=X_AXES, default="steps",
                   help="the plots' x axis: optimizer steps, or training tokens seen (each run's tokens per step)")
    args = p.parse_args(argv)
    if args.tokens is not None and args.tokens < 1:
        raise UserError(f"--tokens must be a positive number of training tokens, got {args.tokens}")
    written = compare_runs(args.runs, args.baseline, args.out, args.step, args.allow_different_data, args.x,
                           args.tokens)
    print(written[0].read_text())
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


def cli() -> int:
    """Entry point of scripts/compare_runs.py: user errors are one line with exit code 2."""
    return run_cli(main)
