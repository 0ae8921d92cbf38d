"""torchnlq's trainer against nanoGPT's train.py at one toy shape, whole programs, interleaved.

    python scripts/bench_nanogpt.py --nanogpt PATH [--rounds N] [--steps LONG,SHORT] [--vocab gpt2|byte]

PATH is a checkout of https://github.com/karpathy/nanoGPT: its train.py, model.py and configurator.py run
unchanged from a scratch copy in a temporary folder (nothing is written into the checkout).
Both programs train the same shape from scratch on the same uniformly random tokens, fp32 on
the CPU, one thread, no compile, no evaluation beyond nanoGPT's unavoidable one at iteration 0
(one batch here): 4 layers, d 128, 4 heads, 16 sequences of 128 tokens per step, AdamW, clipping
at 1.0. The time per iteration is (CPU of a LONG-step run − CPU of a SHORT-step run) / (LONG −
SHORT), so start-up and the end of a run cancel; each round runs the four programs in a shuffled
order and the ratio is the median over rounds of torchnlq / nanoGPT within a round.
``--vocab gpt2`` is nanoGPT's default 50,304-row head (the head is then most of the step); ``byte``
a 257-row character model (bytes and torchnlq's end-of-text) like nanoGPT's shakespeare_char (the blocks are most of it).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.timing import children_cpu_seconds, interleave, long_short_steps, markdown_table, median
from torchnlq.cli import ArgumentParser
from torchnlq.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"n_layer": 4, "n_head": 4, "n_embd": 128, "batch_size": 16, "block_size": 128}
VOCABS = {"gpt2": 50304, "byte": 257}  # the rows of the head in both programs


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    """CPU seconds of one program; a failure is one error line with its last output line."""
    before = children_cpu_seconds()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise UserError(f"'{' '.join(argv[:3])} ...' exited {done.returncode}: {last}")
    return children_cpu_seconds() - before


def _write_data(tmp: Path, vocab: str) -> tuple[Path, Path]:
    """The same random tokens as nanoGPT's data/<name>/ and as a torchnlq data folder."""
    from torchnlq.data import token_format as fmt

    rng = np.random.default_rng(0)
    n_vocab = VOCABS[vocab] if vocab == "byte" else 50257
    tokens = {s: rng.integers(0, n_vocab, n, dtype=np.uint16) for s, n in (("train", 2_000_000), ("val", 50_000))}
    nano = tmp / "nanogpt_data" / "rand"
    nano.mkdir(parents=True)
    for split, t in tokens.items():
        t.tofile(nano / f"{split}.bin")
    if vocab == "byte":  # nanoGPT reads the vocabulary size of a character model from meta.pkl
        (nano / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": VOCABS["byte"]}))
    ours = tmp / "torchnlq_data"
    ours.mkdir()
    temps = {s: fmt.temp_name(fmt.split_file(ours, s)) for s in tokens}
    for split, t in tokens.items():
        fmt.write_tokens(temps[split], len(t), [t])
    name = "byte" if vocab == "byte" else "gpt2"
    info = {"name": name, "vocab_size": n_vocab, "eot_id": n_vocab - 1}
    fmt.commit(ours, temps, fmt.make_meta(info, {s: len(t) for s, t in tokens.items()}, {s: 1 for s in temps},
                                          {"kind": "bench"}))
    return nano, ours


def main(argv: list[str]) -> int:
    """Entry point of scripts/bench_nanogpt.py."""
    parser = ArgumentParser(prog="bench_nanogpt.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", required=True, help="a checkout of karpathy/nanoGPT (its train.py is run)")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default: 12)")
    parser.add_argument("--steps", default="60,10", help="LONG,SHORT steps per run (default: 60,10)")
    parser.add_argument("--vocab", choices=sorted(VOCABS), default="gpt2", help="the head (default: gpt2)")
    args = parser.parse_args(argv)
    nanogpt = Path(args.nanogpt).expanduser().resolve()
    if not all((nanogpt / name).is_file() for name in ("train.py", "model.py", "configurator.py")):
        raise UserError(f"--nanogpt {args.nanogpt!r} lacks train.py, model.py or configurator.py; clone "
                        "https://github.com/karpathy/nanoGPT and pass its folder")
    long, short = long_short_steps(args.steps, args.rounds, "60,10")
    with tempfile.TemporaryDirectory(prefix="torchnlq-vs-nanogpt-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
        nano_data, our_data = _write_data(tmp, args.vocab)
        # train.py reads configurator.py and data/<dataset> from its working directory: a scratch copy,
        # so nothing is written into the user's checkout.
        work = tmp / "nanogpt"
        (work / "data").mkdir(parents=True)
        (work / "data" / "rand").symlink_to(nano_data)
        for name in ("train.py", "model.py", "configurator.py"):
            shutil.copy2(nanogpt / name, work / name)

        def nanogpt_run(steps: int) -> list[str]:
            flags = {**SHAPE, "dataset": "rand", "device": "cpu", "compile": False, "dtype": "float32",
                     # lr_decay_iters > warmup_iters even for 1 step: nanoGPT divides by their difference.
                     "max_iters": steps, "lr_decay_iters": steps + 1, "warmup_iters": 1, "eval_interval": 10**9,
                     "eval_iters": 1, "log_interval": 10**9, "dropout": 0.0, "always_save_checkpoint": False,
                     "gradient_accumulation_steps": 1, "out_dir": str(tmp / "nanogpt_out")}
            return [sys.executable, "train.py", *[f"--{k}={v}" for k, v in flags.items()]]

        counter = iter(range(10**6))

        def torchnlq_run(steps: int) -> list[str]:
            return [sys.executable, "-m", "torchnlq.train", "--model.flavor=debug", "--model.n_layers=4",
                    "--model.dim=128", "--model.n_heads=4", "--model.query.type=linear", "--training.device=cpu",
                    "--training.micro_batch_size=16", "--training.seq_len=128", f"--training.steps={steps}",
                    "--lr_schedule.warmup_steps=1", f"--data.path={our_data}", "--data.synthetic=false",
                    f"--data.tokenizer={'byte' if args.vocab == 'byte' else 'gpt2'}", "--validation.enabled=false",
                    *(["--model.vocab_multiple=1"] if args.vocab == "byte" else []),
                    "--metrics.tensorboard=false", "--metrics.log_interval=1000000", "--checkpoint.enabled=false",
                    f"--job.dump_folder={tmp / 'runs'}", f"--job.name=r{next(counter)}"]

        programs = {("nanoGPT", s): (nanogpt_run, work) for s in (long, short)}
        programs |= {("torchnlq", s): (torchnlq_run, ROOT) for s in (long, short)}
        keys = list(programs)
        runs = [lambda key=key: _run(programs[key][0](key[1]), programs[key][1], env) for key in keys]
        cpu = dict(zip(keys, interleave(runs, args.rounds)))
    per_iter = {name: [(a - b) / (long - short) for a, b in zip(cpu[(name, long)], cpu[(name, short)])]
                for name in ("nanoGPT", "torchnlq")}
    ratios = [t / n for t, n in zip(per_iter["torchnlq"], per_iter["nanoGPT"])]
    print(f"# torchnlq vs nanoGPT train.py, vocab {args.vocab}, {args.rounds} rounds of {long} and {short} steps, "
          "1 thread, fp32, CPU seconds")
    print(markdown_table(
        ["program", "CPU ms per iteration (median)", "vs nanoGPT (median of rounds)", "range"],
        [["nanoGPT train.py", f"{1000 * median(per_iter['nanoGPT']):.1f}", "1.000×", ""],
         ["torchnlq", f"{1000 * median(per_iter['torchnlq']):.1f}", f"{median(ratios):.3f}×",
          f"{min(ratios):.3f}–{max(ratios):.3f}"]],
        right=[False, True, True, True]))
    return 0
