"""The first GPU run: one command that says whether this machine trains the default profile as it should.

    python -m benchmarks.gpu_check [CONFIG] [--section.key=value ...] [--steps N] [--warmup N]
                                   [--query-types linear,residual_mlp | all] [--device cuda|cpu]
                                   [--compile-backend inductor|aot_eager|eager] [--no-float8]
                                   [--variants model-compile,cudnn-attention,max-autotune] [--json OUT]

CONFIG defaults to train_configs/gpt_small_res_gelu.toml (the default profile: gpt_small, bf16 autocast,
compile, micro-batch 12 x 1024) on CUDA, and to train_configs/debug_model.toml with --device cpu (the
CPU smoke mode, for machines without a GPU). Config overrides (--training.micro_batch_size=6,
--training.compile=true, --metrics.peak_tflops=400, ...) apply to every row; --device decides the
device (it overrides training.device).

It prints the device (name, compute capability, memory, torch / CUDA versions, the peak dense bf16
TFLOP/s MFU is measured against), then one row per query type (default: linear, residual_mlp and the
config's own; --query-types all: every registered type), and on GPUs with float8 matmuls (compute
capability >= 8.9) a float8 row per query type. A row is a real Trainer of the config, as
``python -m benchmarks.train_step`` builds it (random tokens, no checkpoints, no
validation): --warmup untimed steps (the first compiles), --steps timed steps, one more step for the
peak memory. Each row gives tokens/s, step time, TFLOP/s, MFU, peak memory (with the memory estimate
from torchnlq.train.memory_estimate), graph breaks and recompilations (dynamo's counters), the
data loader's share of the step, and ends with a verdict: ``ok`` or what is wrong and what to do.
When the config's micro-batch runs out of GPU memory, the row says so and retries with half the
micro-batch and twice the accumulation steps (the same tokens per step).

The compiled blocks are traced as the trainer traces them, but with ``fullgraph=False``: a graph
break then shows up as a count with its reason (the trainer, compiling with ``fullgraph=True``,
would stop at the first one). ``--compile-backend aot_eager`` (or ``eager``) traces without
inductor: the tests' cheap mode; graph breaks and recompilations are dynamo's and do not depend on it.

``--variants`` adds, per query type, a row for each candidate way of running the same step (bf16, the
config's compile), with its tokens/s against the query type's plain row: ``model-compile`` compiles the
whole model as one graph (nanoGPT's way) instead of each block and the head's loss; ``cudnn-attention``
restricts SDPA to cuDNN's attention (CUDA only); ``max-autotune`` lets inductor benchmark Triton matmul
templates while compiling (inductor's ``max_autotune``, torch.compile's mode ``max-autotune-no-cudagraphs``:
minutes of compilation). They measure what
docs/performance.md lists as candidates; none is a training option.

--json OUT writes every figure (each step time, each loss), the device and the thresholds.
The verdict thresholds are the named constants below; docs/performance.md, "The first GPU run",
says what the figures should look like.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from benchmarks.timing import machine_info, markdown_table
from benchmarks.train_step import Variant
from benchmarks.train_step_args import BenchOptions
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.config.job_config import JobConfig, loss_chunk_tokens
from torchnlq.config.manager import load_job_config
from torchnlq.errors import UserError, script_command, unknown_choice
from torchnlq.models import QUERY_TYPES
from torchnlq.parallel.float8 import MIN_CAPABILITY, float8_supported
from torchnlq.train.memory_estimate import HEADROOM, estimate_memory
from torchnlq.parallel.parallelize import apply_compile
from torchnlq.parallel.device_figures import PEAK_BF16_TFLOPS, peak_tflops
from torchnlq.train.preflight import check_job_config
from torchnlq.train.trainer import TrainingDiverged

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The default profile (the paper's best run): gpt_small, bf16 autocast, compile, micro-batch 12 x 1024.
DEFAULT_CONFIG = "train_configs/gpt_small_res_gelu.toml"
#: What --device cpu runs when no config is given: the debug model trains in seconds on a CPU.
CPU_SMOKE_CONFIG = "train_configs/debug_model.toml"
#: The query types every check runs (the config's own is added when it is another).
DEFAULT_QUERY_TYPES = ("linear", "residual_mlp")
DEVICES = ("cuda", "cpu")
#: --variants: candidate ways of running the same step, measured beside the plain row (see the module doc).
VARIANTS = ("model-compile", "cudnn-attention", "max-autotune")
#: Variants that need a GPU (cuDNN has no CPU attention kernel).
CUDA_VARIANTS = ("cudnn-attention",)
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")

# ----- verdict thresholds: references and project rules (docs/performance.md, "The first GPU run") ---
#: Below this MFU a row is flagged: the low end of published figures for dense bf16 training.
MFU_MIN = 0.30
#: The project's target for the default profile: a row under it is not flagged, but noted.
MFU_TARGET = 0.45
#: The data loader's share of a step above which a row is flagged.
DATA_SHARE_MAX = 0.01
#: A peak above this share of the device's memory is flagged (the memory estimate's HEADROOM).
MEMORY_SHARE_MAX = 1.0 - HEADROOM
#: Training compiles with fullgraph=True, one graph per kind of block: any break or recompilation is a problem.
GRAPH_BREAKS_MAX = 0
RECOMPILES_MAX = 0

GIB = 2**30


# ----- the command line ---------------------------------------------------------------------------


@dataclass
class CheckOptions:
    """gpu_check's own flags; ``config_args`` is the config path (if given) and its overrides."""

    config_args: list[str] = field(default_factory=list)
    steps: int = 5
    warmup: int = 2
    query_types: list[str] = field(default_factory=list)  # empty: the default list
    device: str = "cuda"
    compile_backend: str = "inductor"
    float8: bool = True
    variants: list[str] = field(default_factory=list)
    json: str | None = None
    help: bool = False


def parse_args(argv: list[str]) -> CheckOptions:
    """Split gpu_check's flags from the config path and overrides (the rest); every mistake is one UserError.

    ``--query-types`` takes comma-separated or several names, or ``all``; a *.toml among them is the config.
    """
    parser = ArgumentParser(prog="python -m benchmarks.gpu_check", add_help=False, allow_abbrev=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--steps", type=int, default=CheckOptions.steps)
    parser.add_argument("--warmup", type=int, default=CheckOptions.warmup)
    parser.add_argument("--query-types", nargs="+", action="extend", default=[])
    parser.add_argument("--device", choices=DEVICES, default=CheckOptions.device)
    parser.add_argument("--compile-backend", choices=COMPILE_BACKENDS, default=CheckOptions.compile_backend)
    parser.add_argument("--no-float8", dest="float8", action="store_false")
    parser.add_argument("--variants", nargs="+", action="extend", default=[])
    parser.add_argument("--json")
    known, rest = parser.parse_known_args(argv)
    known.variants = list(dict.fromkeys(n.strip() for word in known.variants for n in word.split(",") if n.strip()))
    names = [n.strip() for word in known.query_types for n in word.split(",") if n.strip()]
    known.query_types = [n for n in names if not n.endswith(".toml")]
    opts = CheckOptions(config_args=[n for n in names if n.endswith(".toml")] + rest, **vars(known))
    if opts.help:
        return opts
    if opts.steps < 1:
        raise UserError(f"--steps must be at least 1, got {opts.steps}")
    if opts.warmup < 1:
        raise UserError(f"--warmup must be at least 1 (the first step compiles and is never timed), got {opts.warmup}")
    for qtype in opts.query_types:
        if qtype != "all" and qtype not in QUERY_TYPES:
            raise unknown_choice("--query-types", qtype, [*QUERY_TYPES, "all"])
    for variant in opts.variants:
        if variant not in VARIANTS:
            raise unknown_choice("--variants", variant, list(VARIANTS))
        if variant in CUDA_VARIANTS and opts.device == "cpu":
            raise UserError(f"--variants {variant} needs CUDA (cuDNN has no CPU attention); drop it with --device cpu")
    if opts.json:  # checked now, not after minutes of steps
        target = Path(opts.json).expanduser()
        if target.is_dir():
            raise UserError(f"--json {opts.json!r} is a folder; give a file name such as {target / 'gpu_check.json'}")
        if not target.parent.is_dir():
            raise UserError(f"--json {opts.json!r}: folder '{target.parent}' does not exist; create it or choose "
                            "another path")
    return opts


def _has_config_path(args: list[str]) -> bool:
    """Whether the config arguments name a TOML file (positionally or as --job.config_file), read as load_job_config."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            if arg.split("=", 1)[0] == "--job.config_file":
                return True
            if "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
        else:
            return True
        i += 1
    return False


def resolve_device(name: str) -> torch.device:
    """The device to check; a UserError that names the CPU smoke mode when CUDA was asked for and is absent."""
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build, no CUDA"
        raise UserError(
            f"no CUDA device is visible (torch {torch.__version__}, {build}); on a GPU machine install the CUDA "
            f"build of torch (docs/performance.md, 'The first GPU run'); for the CPU smoke mode run: "
            f"{script_command(f'-m benchmarks.gpu_check {CPU_SMOKE_CONFIG} --device cpu')}"
        )
    return torch.device("cuda", torch.cuda.current_device())


# ----- the plan: what each row runs, checked before anything runs ----------------------------------


@dataclass
class RowSpec:
    """One row to run: a query type, with or without float8, and its config."""

    query_type: str
    float8: bool
    cfg: JobConfig
    overrides: list[str]
    variant: str | None = None


def plan_rows(opts: CheckOptions, device: torch.device) -> tuple[list[str], list[RowSpec], tuple[bool, str]]:
    """(config args, the rows, (float8 runs, why or why not)); every row's config is checked before any runs."""
    config_args = list(opts.config_args)
    if not _has_config_path(config_args):
        default = DEFAULT_CONFIG if device.type == "cuda" else CPU_SMOKE_CONFIG
        path = REPO_ROOT / default
        if not path.is_file():
            raise UserError(f"no config given and the default {default} is not in {REPO_ROOT}; pass a config file")
        config_args = [str(path), *config_args]
    common = [f"--training.device={device.type}"]
    base = load_job_config([*config_args, *common])
    check_job_config(base)
    if "all" in opts.query_types:
        types = list(QUERY_TYPES)
    elif opts.query_types:
        types = list(dict.fromkeys(opts.query_types))
    else:
        types = list(dict.fromkeys([*DEFAULT_QUERY_TYPES, base.model.query.type]))
    supported, description = float8_supported(device)
    minimum = ".".join(map(str, MIN_CAPABILITY))
    if not opts.float8:
        float8 = (False, "float8: not run (--no-float8)")
    elif supported:
        float8 = (True, f"float8: a row per query type ({description}; float8 needs >= {minimum})")
    else:
        why = (f"float8: not run: this device is {description}; float8 matmuls need compute capability >= {minimum} "
               "(RTX 4090/5090, H100, B200, ...)")
        float8 = (False, why)
    rows = []
    for qtype in types:
        for f8 in (False, True) if float8[0] else (False,):
            overrides = [*common, f"--model.query.type={qtype}", f"--float8.enabled={str(f8).lower()}"]
            cfg = load_job_config([*config_args, *overrides])
            check_job_config(cfg)
            rows.append(RowSpec(qtype, f8, cfg, overrides))
        plain = rows[-2 if float8[0] else -1]  # this query type's bf16 row
        rows.extend(RowSpec(qtype, False, plain.cfg, plain.overrides, variant) for variant in opts.variants)
    return config_args, rows, float8


# ----- the device --------------------------------------------------------------------------------


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _system_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def describe_device(device: torch.device, cfg: JobConfig) -> dict[str, Any]:
    """What the header prints: the device, its memory, the software, and the peak MFU is measured against."""
    info = machine_info(device)
    out: dict[str, Any] = {
        "device": device.type, "name": info["device_name"], "torch": torch.__version__,
        "cuda": torch.version.cuda, "torchao": _version("torchao"), "threads": info["threads"],
        "cpus": info["cpus"], "load_avg_1m": info["load_avg_1m"], "capability": None, "memory_bytes": None,
        "cudnn": None, "nccl": None, "bf16_supported": None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(capability=f"{props.major}.{props.minor}", memory_bytes=props.total_memory,
                   cudnn=torch.backends.cudnn.version(), bf16_supported=torch.cuda.is_bf16_supported())
        with contextlib.suppress(Exception):  # NCCL's version is only in builds that ship it
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        out["memory_bytes"] = _system_memory_bytes()
    peak = peak_tflops(device, cfg.metrics.peak_tflops)
    out["peak_bf16_tflops"] = peak
    if cfg.metrics.peak_tflops is not None:
        out["peak_source"] = "--metrics.peak_tflops"
    elif peak is not None:
        key = next(k for k, v in PEAK_BF16_TFLOPS if k in out["name"])
        out["peak_source"] = f"torchnlq.parallel.device_figures.PEAK_BF16_TFLOPS entry {key!r}"
    else:
        out["peak_source"] = None
    return out


def _shown_path(arg: str) -> str:
    """A path inside the checkout as the user would type it (relative to the repository)."""
    with contextlib.suppress(ValueError):
        return str(Path(arg).resolve().relative_to(REPO_ROOT))
    return arg


def _load(info: dict[str, Any]) -> str:
    """The 1-minute load average: on a shared machine, read it before the figures."""
    return f", load average {info['load_avg_1m']:.2f}" if info.get("load_avg_1m") is not None else ""


def _gib(nbytes: float | None) -> str:
    """Bytes as GiB with three significant digits ('31.2 GiB', '0.0293 GiB'); '–' when unknown."""
    return "–" if nbytes is None else f"{nbytes / GIB:.3g} GiB"


def format_header(info: dict[str, Any], cfg: JobConfig, opts: CheckOptions, config_args: list[str],
                  float8_line: str, estimate_line: str) -> str:
    """The lines above the table: device, software, peak, float8, the profile, the memory estimate."""
    t = cfg.training
    if info["device"] == "cuda":
        device = f"device: {info['name']}, compute capability {info['capability']}, {_gib(info['memory_bytes'])}"
        if info["bf16_supported"] is False:
            device += " (no native bf16: bf16 autocast runs slowly here)"
        device += f"; host {info['cpus']} CPUs{_load(info)}"
        software = (f"software: torch {info['torch']}, CUDA {info['cuda']}, cuDNN {info['cudnn']}, "
                    f"NCCL {info['nccl'] or 'n/a'}, torchao {info['torchao'] or 'not installed'}")
    else:
        device = (f"device: cpu ({info['name']}), {info['threads']} torch thread(s) / {info['cpus']} CPUs, "
                  f"{_gib(info['memory_bytes'])} RAM{_load(info)}")
        software = (f"software: torch {info['torch']}, "
                    f"{'CUDA ' + info['cuda'] if info['cuda'] else 'CPU-only build (no CUDA)'}, "
                    f"torchao {info['torchao'] or 'not installed'}")
    if info["peak_bf16_tflops"] is not None:
        peak = f"peak bf16: {info['peak_bf16_tflops']:g} TFLOP/s dense ({info['peak_source']})"
    elif info["device"] == "cuda":
        peak = "peak bf16: unknown: pass --metrics.peak_tflops=X (this GPU's dense bf16 TFLOP/s) for MFU"
    else:
        peak = "peak bf16: none for a CPU, MFU not defined (--metrics.peak_tflops=X sets one)"
    precision = "bf16 autocast" if info["device"] == "cuda" and t.mixed_precision == "bf16" else "fp32"
    if info["device"] == "cpu":
        precision += " (a CPU trains in fp32)"
    compiled = f"compile ({opts.compile_backend}, fullgraph=False to count breaks)" if t.compile else "compile off"
    accum = f"{t.grad_accum_steps} accumulation step{'s' if t.grad_accum_steps != 1 else ''}"
    chunk = loss_chunk_tokens(t, info["device"])
    compiled += f", head loss {f'in {chunk}-token chunks' if chunk else 'from full logits'}"
    profile = (f"profile: {cfg.model.flavor}, {precision}, {compiled}, micro-batch {t.micro_batch_size} x "
               f"{t.seq_len}, {accum}; per row {opts.warmup} warm-up + {opts.steps} timed steps + 1 for memory")
    shown = [_shown_path(a) for a in config_args]
    return "\n".join([
        f"# gpu_check {' '.join(shown)}",
        device, software, peak, float8_line, profile, estimate_line,
    ])


# ----- the memory estimate (torchnlq/train/memory_estimate.py) ------------------------------------

def memory_estimate(cfg: JobConfig, device_type: str) -> tuple[int | None, str]:
    """(bytes, '') of the memory estimate for one process, else (None, why): it must never stop the check."""
    try:
        return estimate_memory(cfg, check_job_config(cfg), 1, device_type).total, ""
    except Exception as e:  # noqa: BLE001 - see the docstring
        return None, f"the memory estimate failed ({type(e).__name__}: {e})"


# ----- one row -----------------------------------------------------------------------------------


@dataclass
class Row:
    """One row's figures (times in ms or s, memory in bytes, shares as fractions) and its verdict (or ``error``)."""

    query_type: str
    float8: bool
    device: str
    precision: str
    compile: bool
    compile_backend: str | None
    micro_batch_size: int
    seq_len: int
    grad_accum_steps: int
    tokens_per_step: int
    out_of_memory_at: list[int] = field(default_factory=list)
    error: str | None = None
    flops_per_token: int | None = None
    first_step_s: float | None = None
    step_ms: float | None = None
    step_ms_all: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    peak_memory_bytes: int | None = None
    capacity_bytes: int | None = None
    estimate_bytes: int | None = None
    estimate_ratio: float | None = None
    estimate_note: str = ""  # why there is no estimate
    data_ms: float | None = None
    data_share: float | None = None
    compiled_graphs: int | None = None  # dynamo's unique graphs: one per kind of block (and resumes after breaks)
    graph_breaks: int | None = None
    graph_break_reasons: list[str] = field(default_factory=list)
    recompiles: int | None = None
    losses: list[float] = field(default_factory=list)
    variant: str | None = None  # --variants: a candidate way of running the step
    vs_bf16: float | None = None  # float8 and variant rows: tokens/s over the same query type's plain bf16 row
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verdict: str = ""

    @property
    def label(self) -> str:
        """The row's name in the table."""
        return self.query_type + (" + float8" if self.float8 else "") + (f" [{self.variant}]" if self.variant else "")


def smaller_micro_batch(micro: int, accum: int) -> tuple[int, int] | None:
    """The largest divisor of ``micro`` at most half of it, with the accumulation that keeps the tokens; None at 1."""
    if micro <= 1:
        return None
    smaller = next(d for d in range(micro // 2, 0, -1) if micro % d == 0)
    return smaller, accum * (micro // smaller)


@contextlib.contextmanager
def _fresh_dynamo() -> Iterator[None]:
    """Forget compiled code and counters before a row, so its counts are its own."""
    torch._dynamo.reset()
    counters.clear()
    try:
        yield
    finally:
        torch._dynamo.reset()


def compile_for_check(trainer: Any, backend: str, variant: str | None = None) -> None:
    """Re-compile the trainer's blocks and head loss with ``fullgraph=False`` (breaks are counted, not raised) on
    ``backend``; ``model-compile``: the whole model as one graph instead.

    Nothing was traced yet (a new Trainer runs no forward), so this replaces the trainer's setup.
    """
    if not trainer.cfg.training.compile:
        return
    if variant == "model-compile":
        for module in [*trainer.model.layers, trainer.model.head_loss]:
            module._compiled_call_impl = None  # what Module.compile set: traced inline in the model's graph
        trainer.model.compile(fullgraph=False, backend=backend)
        return
    apply_compile(trainer.model, fullgraph=False, backend=backend)


def variant_context(variant: str | None) -> contextlib.AbstractContextManager:
    """What a ``--variants`` row runs its steps (and so its compilation) under."""
    if variant == "cudnn-attention":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION])
    if variant == "max-autotune":
        import torch._inductor.config as inductor_config

        return inductor_config.patch(max_autotune=True)  # mode 'max-autotune-no-cudagraphs'
    return contextlib.nullcontext()


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0] if reason.strip() else reason


def _out_of_memory(error: BaseException) -> bool:
    """An out-of-memory error, also when a compiler (inductor autotuning, say) wrapped it."""
    return isinstance(error, torch.OutOfMemoryError) or isinstance(
        getattr(error, "inner_exception", None), torch.OutOfMemoryError)


def _compile_failure(error: BaseException) -> str:
    """The verdict of a compiler that cannot run here (no Triton, no C compiler, ...): the other rows still run."""
    cause = getattr(error, "inner_exception", None)  # what the backend (inductor) raised
    what = (f"backend {getattr(error, 'backend_name', '?')!r} raised {type(cause).__name__}: {_first_line(str(cause))}"
            if cause is not None else f"{type(error).__name__}: {_first_line(str(error))}")
    return (f"compile failed ({what}): --compile-backend aot_eager tells dynamo's part from inductor's; "
            "--training.compile=false runs eager")


def _close(variant: Variant | None) -> None:
    """Close a row's trainer (its writers and the run folder's lock)."""
    if variant is not None:
        variant.close()
        variant.trainer.close()


def _free_memory(device: torch.device) -> None:
    """Return what the last row held (after its last reference is dropped), so the next row starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_row(spec: RowSpec, config_args: list[str], opts: CheckOptions, device: torch.device, workdir: Path,
            index: int, capacity: int | None) -> Row:
    """Build the row's Trainer, warm it up (compiling), time ``opts.steps`` steps, measure memory; the figures."""
    t = spec.cfg.training
    micro, accum = t.micro_batch_size, t.grad_accum_steps
    bench_opts = BenchOptions(steps=opts.steps, warmup=opts.warmup)
    oom: list[int] = []
    while True:
        overrides = [*spec.overrides, f"--training.micro_batch_size={micro}", f"--training.grad_accum_steps={accum}"]
        row = Row(query_type=spec.query_type, float8=spec.float8, variant=spec.variant, device=device.type,
                  precision="", compile=t.compile, compile_backend=opts.compile_backend if t.compile else None,
                  micro_batch_size=micro, seq_len=t.seq_len, grad_accum_steps=accum,
                  tokens_per_step=micro * t.seq_len * accum, out_of_memory_at=list(oom), capacity_bytes=capacity)
        variant: Variant | None = None
        try:
            with _fresh_dynamo():
                # One run folder per attempt: a retry after running out of memory starts afresh.
                label = f"{row.label}-mb{micro}"
                variant = Variant(label, config_args, overrides, "config", bench_opts, workdir, index)
                with variant_context(spec.variant):
                    _measure(variant, row, opts, spec.variant)
            estimate, why = memory_estimate(variant.cfg, device.type)
            row.estimate_bytes, row.estimate_note = estimate, why
            if estimate and row.peak_memory_bytes:
                row.estimate_ratio = row.peak_memory_bytes / estimate
            return row
        except (torch.OutOfMemoryError, torch._dynamo.exc.TorchDynamoException) as e:
            if not _out_of_memory(e):
                row.error = _compile_failure(e)
                return row
            oom.append(micro)
            smaller = smaller_micro_batch(micro, accum)
            if smaller is None:
                row.error = (f"out of memory at micro-batch 1 x {t.seq_len}: lower training.seq_len or set "
                             "activation_checkpoint.mode=full")
                row.out_of_memory_at = list(oom)
                return row
            micro, accum = smaller
        except TrainingDiverged as e:
            row.error = f"loss not finite: {e}"
            return row
        finally:
            _close(variant)
            variant = None  # the last reference to the model and optimizer: freed before the next attempt
            _free_memory(device)


def _measure(variant: Variant, row: Row, opts: CheckOptions, candidate: str | None = None) -> None:
    """Warm-up, timed steps and the memory step of one Variant (``candidate``: a --variants row); fills ``row``."""
    trainer = variant.trainer
    compile_for_check(trainer, opts.compile_backend, candidate)
    inner: Callable[[], tuple[torch.Tensor, torch.Tensor]] = trainer.train_step
    losses: list[torch.Tensor] = []  # read after the timed steps: reading each at once would wait for the device

    def recorded() -> tuple[torch.Tensor, torch.Tensor]:
        loss, grad_norm = inner()
        losses.append(loss)
        return loss, grad_norm

    # Variant.step and timed_step look trainer.train_step up at each call: every step is recorded.
    trainer.train_step = recorded
    row.precision = variant.precision
    start = time.perf_counter()
    variant.step()  # compiles
    variant.timer.synchronize()
    row.first_step_s = time.perf_counter() - start
    frames_after_first = counters["frames"]["total"]
    for _ in range(opts.warmup - 1):
        variant.step()
    for _ in range(opts.steps):
        variant.timed_step()
    result = variant.result()  # + the memory step
    row.losses = [float(loss) for loss in losses]
    if row.compile:
        row.compiled_graphs = counters["stats"]["unique_graphs"]
        row.graph_breaks = sum(counters["graph_break"].values())
        row.graph_break_reasons = [_first_line(reason) for reason in counters["graph_break"]]
        # Frames dynamo compiled after the first step: every later step should reuse step 1's graphs.
        row.recompiles = counters["frames"]["total"] - frames_after_first
    row.flops_per_token, row.step_ms, row.step_ms_all = result.flops_per_token, result.step_ms, result.step_ms_all
    row.tokens_per_s, row.tflops, row.mfu = result.tokens_per_s, result.tflops, result.mfu
    row.peak_memory_bytes = round(result.peak_memory_mib * 2**20)
    row.data_ms, row.data_share = result.data_ms, result.data_share


# ----- the verdict -------------------------------------------------------------------------------


def judge(row: Row) -> tuple[list[str], list[str]]:
    """(problems, notes) of a row's figures against the thresholds above; no problem means ``ok``."""
    if row.error:
        return [row.error], []
    problems: list[str] = []
    notes: list[str] = []
    bad = [i + 1 for i, loss in enumerate(row.losses) if not math.isfinite(loss)]
    if bad:
        problems.append(f"loss not finite at step(s) {', '.join(map(str, bad))}")
    if row.graph_breaks is not None and row.graph_breaks > GRAPH_BREAKS_MAX:
        reason = row.graph_break_reasons[0] if row.graph_break_reasons else "no reason recorded"
        problems.append(f"{row.graph_breaks} graph break{'s' if row.graph_breaks != 1 else ''}: {reason} "
                        "(training compiles with fullgraph=True and would stop there)")
    if row.recompiles is not None and row.recompiles > RECOMPILES_MAX:
        problems.append(f"{row.recompiles} recompilation{'s' if row.recompiles != 1 else ''} after step 1: every "
                        "step should reuse the first step's graphs (TORCH_LOGS=recompiles says why)")
    if row.capacity_bytes and row.peak_memory_bytes is not None \
            and row.peak_memory_bytes > MEMORY_SHARE_MAX * row.capacity_bytes:
        problems.append(f"peak {_gib(row.peak_memory_bytes)} of {_gib(row.capacity_bytes)}: lower "
                        "training.micro_batch_size (and raise grad_accum_steps to keep the batch)")
    if row.data_share is not None and row.data_share > DATA_SHARE_MAX:
        timing = f" ({row.data_ms:.3g} of {row.step_ms:.3g} ms)" if row.data_ms is not None and row.step_ms else ""
        problems.append(f"data loading {100 * row.data_share:.1f}% of the step{timing} > {100 * DATA_SHARE_MAX:g}%: a "
                        "slow disk or a cold page cache, or a step too small to hide it "
                        "(python -m benchmarks.batch_reads times the reads alone)")
    if row.mfu is None:
        notes.append(f"{row.device}: MFU not defined" if row.device == "cpu"
                     else "MFU unknown: pass --metrics.peak_tflops")
    elif row.float8:
        notes.append("MFU against the bf16 peak (float8 mixes bf16 and float8 tensor cores)")
    elif row.variant:
        pass  # a candidate: judged by its tokens/s against the plain row (below), not by the MFU thresholds
    elif row.mfu < MFU_MIN:
        if not row.compile:
            hint = "compile is off: set --training.compile=true"
        elif row.data_share is not None and row.data_share > DATA_SHARE_MAX:
            hint = "the data loader is slow (above)"
        else:
            hint = ("check that nothing else runs on the GPU (nvidia-smi) and that the micro-batch was not lowered "
                    "(a smaller one lowers MFU)")
        problems.append(f"MFU {100 * row.mfu:.1f}% < {100 * MFU_MIN:g}% (published references ~30-39%: torchtitan, "
                        f"nanoGPT; not measured here; target {100 * MFU_TARGET:g}%): {hint}")
    elif row.mfu < MFU_TARGET:
        notes.append(f"MFU {100 * row.mfu:.1f}% is under the project's {100 * MFU_TARGET:g}% target")
    if row.vs_bf16 is not None:
        notes.append(f"{row.vs_bf16:.3f}x the plain row's tokens/s" if row.variant
                     else f"{row.vs_bf16:.2f}x the bf16 row's tokens/s")
    if not row.compile:
        notes.append("compile off")
    if row.out_of_memory_at:
        tried = ", ".join(str(m) for m in row.out_of_memory_at)
        notes.append(f"micro-batch {tried} ran out of memory: used {row.micro_batch_size} x {row.seq_len} with "
                     f"{row.grad_accum_steps} accumulation steps (same tokens per step)")
    return problems, notes


def finish_verdicts(rows: list[Row]) -> None:
    """Pair each float8 row with its query type's bf16 row, then judge every row."""
    bf16 = {r.query_type: r for r in rows if not r.float8 and not r.variant}
    for row in rows:
        partner = bf16.get(row.query_type)
        if (row.float8 or row.variant) and partner and partner.tokens_per_s and row.tokens_per_s:
            row.vs_bf16 = row.tokens_per_s / partner.tokens_per_s
        row.problems, row.notes = judge(row)
        row.verdict = "; ".join(row.problems) or "ok"


# ----- output ------------------------------------------------------------------------------------

COLUMNS = ["query", "micro-batch", "tokens/s", "step (ms)", "TFLOP/s", "MFU", "peak memory", "estimate",
           "graph breaks", "recompiles", "data (%)", "verdict"]


def format_row(row: Row) -> list[str]:
    """A row's table cells (numbers rounded; '–' where there is no figure)."""
    def num(value: float | None, spec: str) -> str:
        return "–" if value is None else format(value, spec)

    estimate = "n/a" if row.estimate_bytes is None else (
        f"{_gib(row.estimate_bytes)} ({row.estimate_ratio:.2f}x)" if row.estimate_ratio else _gib(row.estimate_bytes))
    notes = f" ({'; '.join(row.notes)})" if row.notes and not row.problems else ""
    return [
        row.label, f"{row.micro_batch_size} x {row.seq_len}", num(row.tokens_per_s, ",.0f"), num(row.step_ms, ",.1f"),
        num(row.tflops, ".3g"), "–" if row.mfu is None else f"{100 * row.mfu:.1f}%", _gib(row.peak_memory_bytes),
        estimate, num(row.graph_breaks, "d"), num(row.recompiles, "d"),
        "–" if row.data_share is None else f"{100 * row.data_share:.2g}%", row.verdict + notes,
    ]


def format_table(rows: list[Row]) -> str:
    """The Markdown table of all rows."""
    right = [False, False] + [True] * 9 + [False]
    return markdown_table(COLUMNS, [format_row(r) for r in rows], right=right)


def format_summary(rows: list[Row], seconds: float) -> str:
    """The lines under the table: every graph break reason, how many rows need attention, the time taken."""
    lines = []
    for row in rows:
        for reason in row.graph_break_reasons:
            lines.append(f"graph break in {row.label}: {reason}")
    flagged = [r.label for r in rows if r.problems]
    lines.append(f"{len(rows) - len(flagged)} of {len(rows)} rows ok" +
                 (f"; look at: {', '.join(flagged)}" if flagged else "") + f" ({seconds:.0f} s)")
    return "\n".join(lines)


def thresholds() -> dict[str, float]:
    """The verdict thresholds (JSON)."""
    return {"mfu_min": MFU_MIN, "mfu_target": MFU_TARGET, "data_share_max": DATA_SHARE_MAX,
            "memory_share_max": MEMORY_SHARE_MAX, "graph_breaks_max": GRAPH_BREAKS_MAX,
            "recompiles_max": RECOMPILES_MAX}


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.gpu_check`` (wrapped by :func:`torchnlq.cli.run_cli`)."""
    opts = parse_args(argv)
    if opts.help:
        print(__doc__)
        return 0
    device = resolve_device(opts.device)
    config_args, specs, (_, float8_line) = plan_rows(opts, device)
    info = describe_device(device, specs[0].cfg)
    estimate, why = memory_estimate(specs[0].cfg, device.type)
    estimate_line = (f"estimate: {_gib(estimate)} for the config's micro-batch ({estimate_memory.__module__})"
                     if estimate
                     else f"estimate: n/a ({why})")
    print(format_header(info, specs[0].cfg, opts, config_args, float8_line, estimate_line), flush=True)
    rows: list[Row] = []
    started = time.perf_counter()
    # Every row's dynamo caches are its own; a generous limit anyway, as the bench does for its variants.
    limit = max(torch._dynamo.config.recompile_limit, 8)
    with tempfile.TemporaryDirectory(prefix="torchnlq-gpu-check-") as tmp, \
            torch._dynamo.config.patch(recompile_limit=limit):
        for index, spec in enumerate(specs):
            compiling = " (the first compiles)" if spec.cfg.training.compile else ""
            print(f"[{index + 1}/{len(specs)}] {spec.query_type}{' + float8' if spec.float8 else ''}: "
                  f"{opts.warmup} warm-up{compiling} + {opts.steps} timed + 1 memory step ...", flush=True)
            rows.append(run_row(spec, config_args, opts, device, Path(tmp), index, info["memory_bytes"]))
    finish_verdicts(rows)
    print(format_table(rows))
    print(format_summary(rows, time.perf_counter() - started))
    if opts.json:
        payload = {"config_args": config_args, "options": asdict(opts), "device": info, "thresholds": thresholds(),
                   "float8": float8_line, "estimate_line": estimate_line, "rows": [asdict(r) for r in rows]}
        Path(opts.json).expanduser().write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
