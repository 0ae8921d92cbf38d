"""torchnlq's trainer against nanoGPT's own train.py, whole programs, at one shape, batch, corpus and precision.

    python -m benchmarks.versus_nanogpt --nanogpt PATH [CONFIG ...] [--section.key=value ...] [--steps N] [--json OUT]
    python -m benchmarks.versus_nanogpt --nanogpt PATH --mode cpu-seconds [--rounds N] [--steps LONG,SHORT] [--vocab V]

PATH is a checkout of https://github.com/karpathy/nanoGPT: its train.py, model.py and configurator.py run
unchanged from a scratch copy in a temporary folder (nothing is written into the checkout). Nothing needs a
network: the corpus is uniformly random GPT-2 (or byte) ids, written once in both programs' formats.

``--mode profile`` (the default where CUDA is available) is the one-call GPU benchmark: each CONFIG (default:
the default profile, ``train_configs/gpt_small_baseline.toml`` and ``gpt_small_res_gelu.toml``; the overrides
apply to all) runs once as ``python -m torchnlq.train`` and nanoGPT's train.py once at the first config's
shape (layers, width, heads, vocabulary rows, micro-batch, sequence length, accumulation steps, compile,
bf16 on CUDA or fp32). Each program trains ``--steps`` optimizer steps; tokens/s is the median over the
steps after the first two, from each program's own per-step log (torchnlq's TensorBoard
``throughput/tokens_per_s``, nanoGPT's ``iter N: ... time T ms``: both include the wait for the loss
that the log line reads). MFU is torchnlq's count (``torchnlq.models.counts.flops_per_token``) for every row,
peak memory the CUDA allocator's peak (nanoGPT's read by a launcher at exit), the estimate torchnlq's
(``train/memory_estimate.py``), the first step the wall time from the program's start to the end of its
first step (compilation included). ``--json OUT`` writes every figure, each step's time included.
On the CPU (``--device cpu``) it runs at any shape a CPU trains, e.g. the debug config (the test does).

``--mode cpu-seconds`` (the default without CUDA) compares the CPU cost of both programs at one toy shape:
fp32 on the CPU, one thread, no compile, no evaluation beyond nanoGPT's unavoidable one at iteration 0
(one batch here): 4 layers, d 128, 4 heads, 16 sequences of 128 tokens per step, AdamW, clipping
at 1.0. The time per iteration is (CPU of a LONG-step run − CPU of a SHORT-step run) / (LONG −
SHORT), so start-up and the end of a run cancel; each round runs the four programs in a shuffled
order and the ratio is the median over rounds of torchnlq / nanoGPT within a round.
``--vocab gpt2`` is nanoGPT's default 50,304-row head (the head is then most of the step); ``byte``
a 257-row character model (bytes and torchnlq's end-of-text) like nanoGPT's shakespeare_char (the blocks are
most of it).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.timing import (children_cpu_seconds, interleave, long_short_steps, markdown_table, median,
                               ratio_table)
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.errors import UserError
from torchnlq.models.counts import flops_per_token

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"n_layer": 4, "n_head": 4, "n_embd": 128, "batch_size": 16, "block_size": 128}
VOCABS = {"gpt2": 50304, "byte": 257}  # the rows of the head in both programs (cpu-seconds mode)
#: What --mode profile runs without CONFIG arguments: the default profile, linear and the paper's query.
PROFILE_CONFIGS = ("train_configs/gpt_small_baseline.toml", "train_configs/gpt_small_res_gelu.toml")
#: Steps left out of the tokens/s median: the first compiles, the second may still warm caches.
WARMUP_STEPS = 2
NANOGPT_FILES = ("train.py", "model.py", "configurator.py")

#: Runs nanoGPT's train.py as ``python train.py FLAGS`` would, then prints the CUDA allocator's peak at exit
#: (train.py reports none); nothing in its step changes.
NANOGPT_LAUNCHER = """\
import atexit, runpy, sys
import torch

def _peak():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        print(f"torchnlq-bench peak_memory_bytes {torch.cuda.max_memory_allocated()}", flush=True)

atexit.register(_peak)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    """CPU seconds of one program; a failure is one error line with its last output line."""
    before = children_cpu_seconds()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise UserError(f"'{' '.join(argv[:3])} ...' exited {done.returncode}: {last}")
    return children_cpu_seconds() - before


def _write_data(tmp: Path, tokenizer: str, head_rows: int) -> tuple[Path, Path]:
    """The same random tokens as nanoGPT's data/rand/ (with ``head_rows`` in its meta.pkl) and a torchnlq folder."""
    from torchnlq.data import token_format as fmt
    from torchnlq.data.tokenizer import BASE_VOCAB_SIZE

    rng = np.random.default_rng(0)
    n_vocab = BASE_VOCAB_SIZE[tokenizer]
    tokens = {s: rng.integers(0, n_vocab, n, dtype=np.uint16) for s, n in (("train", 2_000_000), ("val", 50_000))}
    nano = tmp / "nanogpt_data" / "rand"
    nano.mkdir(parents=True)
    for split, t in tokens.items():
        t.tofile(nano / f"{split}.bin")
    # nanoGPT sizes its head from meta.pkl (else 50,304 rows): the same rows as torchnlq's padded head.
    (nano / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": head_rows}))
    ours = tmp / "torchnlq_data"
    ours.mkdir()
    temps = {s: fmt.temp_name(fmt.split_file(ours, s)) for s in tokens}
    for split, t in tokens.items():
        fmt.write_tokens(temps[split], len(t), [t])
    info = {"name": tokenizer, "vocab_size": n_vocab, "eot_id": n_vocab - 1}
    fmt.commit(ours, temps, fmt.make_meta(info, {s: len(t) for s, t in tokens.items()}, {s: 1 for s in temps},
                                          {"kind": "bench"}))
    return nano, ours


def _checkout(path: str) -> Path:
    """The nanoGPT checkout, checked before anything runs."""
    nanogpt = Path(path).expanduser().resolve()
    if not all((nanogpt / name).is_file() for name in NANOGPT_FILES):
        raise UserError(f"--nanogpt {path!r} lacks train.py, model.py or configurator.py; clone "
                        "https://github.com/karpathy/nanoGPT and pass its folder")
    return nanogpt


def _nanogpt_workdir(tmp: Path, nanogpt: Path, nano_data: Path) -> Path:
    """A scratch copy of train.py, model.py, configurator.py with data/rand: train.py reads and writes in its
    working directory, so nothing is written into the user's checkout."""
    work = tmp / "nanogpt"
    (work / "data").mkdir(parents=True)
    (work / "data" / "rand").symlink_to(nano_data)
    for name in NANOGPT_FILES:
        shutil.copy2(nanogpt / name, work / name)
    (work / "torchnlq_launch.py").write_text(NANOGPT_LAUNCHER)
    return work


def _nanogpt_flags(shape: dict[str, Any], steps: int, out_dir: Path) -> list[str]:
    """train.py's flags for ``steps`` iterations at ``shape``: no evaluation beyond its unavoidable one at
    iteration 0 (one batch), no checkpoint, a line per iteration."""
    flags = {**shape, "dataset": "rand", "dropout": 0.0, "bias": False,
             # train.py runs iterations 0..max_iters; lr_decay_iters > warmup_iters (it divides by their difference).
             "max_iters": steps - 1, "lr_decay_iters": steps + 1, "warmup_iters": 1, "eval_interval": 10**9,
             "eval_iters": 1, "log_interval": 1, "always_save_checkpoint": False, "out_dir": str(out_dir)}
    return [f"--{k}={v}" for k, v in flags.items()]


# ----- --mode profile -----------------------------------------------------------------------------


@dataclass
class ProgramResult:
    """One program's figures; times in seconds, memory in bytes; None where a program reports nothing."""

    program: str
    command: list[str]
    tokens_per_step: int
    step_seconds: list[float] = field(default_factory=list)  # each step's wall time, from the program's own log
    first_step_s: float | None = None  # program start to the end of its first step (compilation included)
    peak_memory_bytes: int | None = None
    estimate_bytes: int | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    vs_nanogpt: float | None = None

    def summarise(self, flops_per_token: int, peak_tflops: float | None) -> None:
        """tokens/s from the median step after the warm-up ones; MFU from torchnlq's FLOP count."""
        timed = self.step_seconds[WARMUP_STEPS:] or self.step_seconds
        self.tokens_per_s = self.tokens_per_step / median(timed)
        if peak_tflops:
            self.mfu = flops_per_token * self.tokens_per_s / (peak_tflops * 1e12)


def _stream(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[float, list[tuple[float, str]]]:
    """Run a program; (its start time, each output line with the time it arrived). A failure or a run past
    ``timeout`` seconds is one error line with the program's last output line."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter(), line.rstrip("\n")))
            if time.perf_counter() - start > timeout:
                raise UserError(f"'{' '.join(argv[:3])} ...' ran past --timeout {timeout:g} s; "
                                "raise it or lower --steps")
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0:
        last = [text for _, text in lines if text.strip()][-1:]
        raise UserError(f"'{' '.join(argv[:3])} ...' exited {code}: {last}")
    return start, lines


def _parse_nanogpt(result: ProgramResult, start: float, lines: list[tuple[float, str]]) -> None:
    """Step times from train.py's ``iter N: loss L, time T ms, mfu M%`` lines, the peak from the launcher's line."""
    for arrived, text in lines:
        if text.startswith("iter ") and ", time " in text:
            if result.first_step_s is None:
                result.first_step_s = arrived - start
            result.step_seconds.append(float(text.split(", time ")[1].split("ms")[0]) / 1000)
        elif text.startswith("torchnlq-bench peak_memory_bytes "):
            result.peak_memory_bytes = int(text.split()[-1])
    if not result.step_seconds:
        raise UserError("nanoGPT's train.py printed no 'iter N: ... time T ms' line; is --nanogpt a nanoGPT checkout?")


def _parse_torchnlq(result: ProgramResult, start_wall: float, tb_dir: Path, device: torch.device) -> None:
    """Step times and the peak from the run's TensorBoard scalars (``throughput/tokens_per_s``, ``memory/peak_gib``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    throughput = sorted(acc.Scalars("throughput/tokens_per_s"), key=lambda e: e.step)
    result.step_seconds = [result.tokens_per_step / e.value for e in throughput]
    result.first_step_s = throughput[0].wall_time - start_wall
    if device.type == "cuda":  # on a CPU the scalar is the process's resident memory, not the allocator's peak
        result.peak_memory_bytes = round(max(e.value for e in acc.Scalars("memory/peak_gib")) * 2**30)


def _profile_configs(configs: list[str], overrides: list[str], device: torch.device) -> list[tuple[str, Any, Any]]:
    """(config, JobConfig, ModelArgs) of each config on ``device``; every mistake found before anything runs."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.preflight import check_job_config

    loaded = []
    for config in configs:
        cfg = load_job_config([config, *overrides, f"--training.device={device.type}"])
        loaded.append((config, cfg, check_job_config(cfg)))
    _, first, args = loaded[0]
    gpt2_block = (args.norm == "layer" and args.mlp_activation == "gelu" and args.positions == "learned"
                  and args.tie_embeddings and not args.bias and args.n_kv_heads == args.n_heads
                  and not args.qk_norm and args.head_dim * args.n_heads == args.dim)
    if not gpt2_block:
        raise UserError(f"{configs[0]}: nanoGPT's model is GPT-2's block (LayerNorm, GELU, learned positions, tied "
                        "head, no bias, n_heads x head_dim = dim): give a GPT-2-style config first")
    if first.data.tokenizer not in ("gpt2", "byte"):
        raise UserError(f"{configs[0]}: data.tokenizer = {first.data.tokenizer!r}; the benchmark's corpus is gpt2 "
                        "or byte ids")
    shared = ("training.micro_batch_size", "training.seq_len", "training.grad_accum_steps", "data.tokenizer",
              "training.mixed_precision", "training.compile")
    for config, cfg, _ in loaded[1:]:
        for key in shared:
            section, name = key.split(".")
            mine, theirs = getattr(getattr(cfg, section), name), getattr(getattr(first, section), name)
            if mine != theirs:
                raise UserError(f"{config}: {key} = {mine!r}, but {configs[0]} (nanoGPT's shape) has {theirs!r}; "
                                f"every config runs at one shape: pass --{key}=VALUE to set it for all")
    return loaded


def profile(opts: Any, overrides: list[str]) -> int:
    """``--mode profile``: the table (and ``--json``) of nanoGPT's train.py and each config, one run each."""
    from torchnlq.train.memory_estimate import estimate_memory
    from torchnlq.parallel.device_figures import peak_tflops

    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but this torch sees no GPU; use --device cpu for the CPU")
    if opts.steps_count <= WARMUP_STEPS:
        raise UserError(f"--steps must be more than the {WARMUP_STEPS} warm-up steps, got {opts.steps_count}")
    nanogpt = _checkout(opts.nanogpt)
    configs = [str(ROOT / c) for c in PROFILE_CONFIGS] if not opts.configs else opts.configs
    loaded = _profile_configs(configs, overrides, device)
    _, first, args = loaded[0]
    t = first.training
    bf16 = device.type == "cuda" and t.mixed_precision == "bf16"
    shape = {"n_layer": args.n_layers, "n_head": args.n_heads, "n_embd": args.dim, "block_size": t.seq_len,
             "batch_size": t.micro_batch_size, "gradient_accumulation_steps": t.grad_accum_steps,
             "device": device.type, "dtype": "bfloat16" if bf16 else "float32", "compile": t.compile}
    tokens_per_step = t.tokens_per_step()
    flops = flops_per_token(args, t.seq_len)
    peak = peak_tflops(device, first.metrics.peak_tflops)
    if opts.json:
        _check_json_path(opts.json)
    results: list[ProgramResult] = []
    with tempfile.TemporaryDirectory(prefix="torchnlq-vs-nanogpt-") as tmp_name:
        tmp = Path(tmp_name)
        nano_data, our_data = _write_data(tmp, first.data.tokenizer, args.vocab_size)
        work = _nanogpt_workdir(tmp, nanogpt, nano_data)

        def env_for(name: str) -> dict[str, str]:  # a cold compiler cache per program: first steps compare
            return {**os.environ, "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor-{name}")}

        argv = [sys.executable, "torchnlq_launch.py", *_nanogpt_flags(shape, opts.steps_count, tmp / "nanogpt_out")]
        print(f"[1/{len(loaded) + 1}] nanoGPT train.py, {opts.steps_count} steps ...", flush=True)
        start, lines = _stream(argv, work, env_for("nanogpt"), opts.timeout)
        nano = ProgramResult("nanoGPT train.py", argv[1:], tokens_per_step)
        _parse_nanogpt(nano, start, lines)
        results.append(nano)
        for index, (config, cfg, config_args) in enumerate(loaded):
            from benchmarks.train_step import BENCH_OVERRIDES

            argv = [sys.executable, "-m", "torchnlq.train", config, *overrides, f"--training.device={device.type}",
                    f"--training.steps={opts.steps_count}", f"--data.path={our_data}", "--data.synthetic=false",
                    *BENCH_OVERRIDES, "--metrics.tensorboard=true", "--metrics.log_interval=1",
                    "--metrics.weight_dynamics_interval=0", f"--job.dump_folder={tmp / 'runs'}", f"--job.name=r{index}"]
            print(f"[{index + 2}/{len(loaded) + 1}] torchnlq {_shown(config)}, {opts.steps_count} steps ...",
                  flush=True)
            start_wall = time.time()
            _stream(argv, Path.cwd(), env_for(f"r{index}"), opts.timeout)  # the user's relative paths hold
            ours = ProgramResult(f"torchnlq {_shown(config)} ({config_args.query.type})", argv[1:], tokens_per_step)
            _parse_torchnlq(ours, start_wall, tmp / "runs" / f"r{index}" / "tb", device)
            ours.estimate_bytes = estimate_memory(cfg, config_args, 1, device.type).total
            results.append(ours)
    for result in results:
        result.summarise(flops, peak)
        result.vs_nanogpt = result.tokens_per_s / nano.tokens_per_s
    precision = "bf16" if bf16 else "fp32"
    print(f"# torchnlq vs nanoGPT train.py on {_device_name(device)}: {args.n_layers} x {args.dim}, "
          f"{args.vocab_size:,}-row head, micro-batch {t.micro_batch_size} x {t.seq_len}, {t.grad_accum_steps} "
          f"accumulation steps, {precision}, compile {'on' if t.compile else 'off'}; median of steps "
          f"{WARMUP_STEPS + 1}-{opts.steps_count}; torch {torch.__version__}")
    print(markdown_table(
        ["program", "tokens/s", "vs nanoGPT", "MFU", "peak memory", "estimate", "first step (s)"],
        [[r.program, f"{r.tokens_per_s:,.0f}", f"{r.vs_nanogpt:.3f}×",
          "–" if r.mfu is None else f"{100 * r.mfu:.1f}%", _gib(r.peak_memory_bytes), _gib(r.estimate_bytes),
          "–" if r.first_step_s is None else f"{r.first_step_s:.1f}"] for r in results],
        right=[False, True, True, True, True, True, True]))
    if opts.json:
        payload = {"device": _device_name(device), "torch": torch.__version__, "shape": shape,
                   "tokens_per_step": tokens_per_step, "flops_per_token": flops, "peak_tflops": peak,
                   "warmup_steps": WARMUP_STEPS, "programs": [asdict(r) for r in results]}
        Path(opts.json).expanduser().write_text(json.dumps(payload, indent=2) + "\n")
    return 0


def _check_json_path(path: str) -> None:
    target = Path(path).expanduser()
    if target.is_dir():
        raise UserError(f"--json {path!r} is a folder; give a file name such as {target / 'versus_nanogpt.json'}")
    if not target.parent.is_dir():
        raise UserError(f"--json {path!r}: folder '{target.parent}' does not exist; create it or choose another path")


def _shown(config: str) -> str:
    """A config as the user gave it; the default ones relative to the repository."""
    path = Path(config)
    if path.is_absolute() and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return config


def _gib(nbytes: int | None) -> str:
    return "–" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"


# ----- --mode cpu-seconds --------------------------------------------------------------------------


def cpu_seconds(opts: Any) -> int:
    """``--mode cpu-seconds``: CPU ms per iteration at the toy shape, interleaved rounds (see the module doc)."""
    nanogpt = _checkout(opts.nanogpt)
    long, short = long_short_steps(opts.steps or "60,10", opts.rounds, "60,10")
    with tempfile.TemporaryDirectory(prefix="torchnlq-vs-nanogpt-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
        nano_data, our_data = _write_data(tmp, opts.vocab, VOCABS[opts.vocab])
        work = _nanogpt_workdir(tmp, nanogpt, nano_data)
        toy = {**SHAPE, "device": "cpu", "compile": False, "dtype": "float32", "gradient_accumulation_steps": 1}

        def nanogpt_run(steps: int) -> list[str]:
            return [sys.executable, "train.py", *_nanogpt_flags(toy, steps + 1, tmp / "nanogpt_out")]

        counter = iter(range(10**6))

        def torchnlq_run(steps: int) -> list[str]:
            return [sys.executable, "-m", "torchnlq.train", "--model.flavor=debug", "--model.n_layers=4",
                    "--model.dim=128", "--model.n_heads=4", "--model.query.type=linear", "--training.device=cpu",
                    "--training.micro_batch_size=16", "--training.seq_len=128", f"--training.steps={steps}",
                    "--lr_schedule.warmup_steps=1", f"--data.path={our_data}", "--data.synthetic=false",
                    f"--data.tokenizer={opts.vocab}", "--validation.enabled=false",
                    *(["--model.vocab_multiple=1"] if opts.vocab == "byte" else []),
                    "--metrics.tensorboard=false", "--metrics.log_interval=1000000", "--checkpoint.enabled=false",
                    f"--job.dump_folder={tmp / 'runs'}", f"--job.name=r{next(counter)}"]

        programs = {("nanoGPT", s): (nanogpt_run, work) for s in (long, short)}
        programs |= {("torchnlq", s): (torchnlq_run, ROOT) for s in (long, short)}
        keys = list(programs)
        runs = [lambda key=key: _run(programs[key][0](key[1]), programs[key][1], env) for key in keys]
        cpu = dict(zip(keys, interleave(runs, opts.rounds)))
    per_iter = {name: [(a - b) / (long - short) for a, b in zip(cpu[(name, long)], cpu[(name, short)])]
                for name in ("nanoGPT", "torchnlq")}
    print(f"# torchnlq vs nanoGPT train.py, vocab {opts.vocab}, {opts.rounds} rounds of {long} and {short} steps, "
          "1 thread, fp32, CPU seconds")
    print(ratio_table("program", "CPU ms per iteration", ("nanoGPT train.py", per_iter["nanoGPT"]),
                      ("torchnlq", per_iter["torchnlq"]), "nanoGPT"))
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.versus_nanogpt``."""
    parser = ArgumentParser(prog="python -m benchmarks.versus_nanogpt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", required=True, help="a checkout of karpathy/nanoGPT (its train.py is run)")
    parser.add_argument("--mode", choices=("profile", "cpu-seconds"), default=None,
                        help="profile (default with CUDA) or cpu-seconds (default without)")
    parser.add_argument("configs", nargs="*", help=f"profile: configs to run (default: {', '.join(PROFILE_CONFIGS)})")
    parser.add_argument("--steps", default=None,
                        help="profile: optimizer steps per program (default: 12); cpu-seconds: LONG,SHORT (60,10)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="profile: where both programs train (default: cuda when present)")
    parser.add_argument("--timeout", type=float, default=900.0, help="profile: seconds one program may run")
    parser.add_argument("--json", help="profile: write every figure to this file")
    parser.add_argument("--rounds", type=int, default=12, help="cpu-seconds: interleaved rounds (default: 12)")
    parser.add_argument("--vocab", choices=sorted(VOCABS), default="gpt2", help="cpu-seconds: the head (gpt2)")
    opts, overrides = parser.parse_known_args(argv)
    mode = opts.mode or ("profile" if torch.cuda.is_available() else "cpu-seconds")
    if mode == "cpu-seconds":
        if opts.configs or overrides:
            raise UserError(f"--mode cpu-seconds runs its own toy shape; it takes no config or override "
                            f"(got {[*opts.configs, *overrides][0]!r}); use --mode profile for configs")
        return cpu_seconds(opts)
    unknown = [a for a in overrides if not a.startswith("--") or a.count(".") < 1]
    if unknown:
        raise UserError(f"unrecognized argument {unknown[0]!r}: "
                        "configs come as paths, overrides as --section.key=value")
    try:
        opts.steps_count = 12 if opts.steps is None else int(opts.steps)
    except ValueError:
        raise UserError(f"--steps {opts.steps!r}: --mode profile takes one number of steps, such as 12") from None
    return profile(opts, overrides)


if __name__ == "__main__":
    sys.exit(run_cli(main))
