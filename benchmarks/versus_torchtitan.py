"""torchnlq's trainer against torchtitan's train.py at the matched shape, whole programs, interleaved.

    python -m benchmarks.versus_torchtitan --torchtitan PATH [--rounds N] [--steps LONG,SHORT]
    python -m benchmarks.versus_torchtitan --torchtitan PATH --model-only [--rounds N]

PATH is a folder that holds the importable ``torchtitan`` package (0.3.0) and the dependencies this
Python lacks (``pip install --no-deps --target PATH torchtitan==0.3.0 torchdata torch_checkpointing
tyro docstring-parser typeguard einops spmd_types==0.2.3 triton``: torchtitan imports triton at module
level even where it never runs it); it goes on PYTHONPATH for torchtitan's runs only. Nothing is
written into it: every program runs with its byte-code cache, Hugging Face cache, outputs and
temporary files in one temporary folder.

Both programs train the same shape from scratch, fp32 on the CPU, one thread, no compile, no
activation checkpointing, no checkpoints, no validation, logging only where it cannot be turned off:
torchtitan's Llama 3 ``debugmodel`` (6 layers, d 256, 16 heads, SwiGLU 768, RMSNorm, RoPE, untied
2048-row embedding and head: 6,163,712 parameters) and torchnlq's same model (``--model.norm=rms
--model.mlp_activation=swiglu --model.mlp_hidden=768``, linear query), 8 sequences of 256 tokens per
step, AdamW (each program's own default kernel on CPU: torchtitan's fused, torchnlq's for-loop),
clipping at 1.0. The parameter counts both programs report are printed.

torchtitan 0.3.0 does not run on a CPU as shipped; three stand-ins make it run there, none of them in its
files and none in its step's arithmetic:

- a launcher (written into the temporary folder) that makes torch report no accelerator but the CPU
  (``torch._utils._get_available_device_type`` returns "cpu": torchtitan falls back to "cuda"),
  gives ``torch.cpu`` the memory-statistics calls torchtitan's memory monitor makes (device name,
  total memory, empty statistics: logging only), drops ``device_ids`` from the one
  ``torch.distributed.barrier`` it makes after step 1 (it passes ``torch.cpu.current_device()``,
  the string "cpu", where the barrier's options take integers; gloo needs none) and, where this
  torch lacks ``torch.distributed.set_timeout`` (called once, after step 1), maps it to
  ``_set_pg_timeout``; then it runs ``torchtitan.train`` as ``python -m`` would, single process
  (RANK 0, WORLD_SIZE 1, gloo);
- a config function (torchtitan's ``--module``/``--config`` mechanism) that is ``llama3_debugmodel``
  with each layer's inner attention set to torchtitan's ``ScaledDotProductAttention`` (causal), as
  torchtitan's own graph_trainer tests do: its FlexAttention has no backward on CPU and its varlen
  attention is CUDA's; torchnlq's attention is causal SDPA too;
- the data: a word-level tokenizer of 2,048 entries (2,046 words, <bos>, <eos>; tokenizer.json)
  and a local JSON-lines corpus of random words (``--dataloader.dataset c4_test
  --dataloader.dataset-path``), tokenized by torchtitan's own loader as it trains; torchnlq reads
  uniformly random byte tokens from its token format.

torchtitan keeps its single-device path: FSDP2 on a one-rank mesh (mixed_precision_param set to
float32, so the step is fp32) and its loss, clipping and optimizer code.

``--model-only`` times the models alone, in this process: torchtitan's ``debugmodel`` (SDPA attention) built
from PATH and torchnlq's same model, torchnlq's weights copied into torchtitan's (its fused wqkv is
[W_Q; W_K; W_V]), each forward of 8 x 256 random tokens + ``F.cross_entropy`` of the full logits + backward, fp32,
one thread, freed memory kept as the trainer keeps it on a CPU (``train/cpu_allocator.py``); per round three
passes of each model in a shuffled order, CPU seconds. The rotary embedding differs in form, not in cost
that matters here: torchtitan rotates adjacent channel pairs as complex numbers, torchnlq channels i and
i + head_dim/2 (Hugging Face Llama's layout), so the two models compute equal-cost but not equal functions.

The time per iteration is (CPU of a LONG-step run − CPU of a SHORT-step run) / (LONG − SHORT), so
start-up and the end of a run cancel; one untimed SHORT run of each program first fills the caches
(byte code, the Hugging Face datasets cache of the corpus); each round then runs the four programs
in a shuffled order, and the ratio is the median over rounds of torchnlq / torchtitan within a
round. A line per round goes to stderr.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.timing import children_cpu_seconds, interleave, long_short_steps, ratio_table
from benchmarks.train_step_support import write_random_corpus
from torchnlq.cli import ArgumentParser, run_cli
from torchnlq.errors import UserError
from torchnlq.models import build_model

ROOT = Path(__file__).resolve().parents[1]
VOCAB, DIM, LAYERS, HEADS, HIDDEN, BATCH, SEQ = 2048, 256, 6, 16, 768, 8, 256
REQUIRED = ("torchtitan/train.py", "torchtitan/models/llama3/config_registry.py")

#: The launcher: torchtitan's train.py on the CPU (see the module's docstring for each stand-in).
LAUNCHER = '''\
import os, runpy, types
import torch, torch._utils, torch.distributed

torch._utils._get_available_device_type = lambda: "cpu"
cpu = torch.cpu
cpu.get_device_name = lambda device=None: "cpu"
cpu.get_device_properties = lambda device=None: types.SimpleNamespace(
    total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
cpu.reset_peak_memory_stats = lambda device=None: None
cpu.empty_cache = lambda: None
cpu.memory_stats = lambda device=None: {}
_barrier = torch.distributed.barrier
torch.distributed.barrier = lambda group=None, async_op=False, device_ids=None: (
    _barrier(async_op=async_op) if group is None else _barrier(group, async_op))
if not hasattr(torch.distributed, "set_timeout"):
    from torch.distributed.distributed_c10d import _set_pg_timeout
    torch.distributed.set_timeout = _set_pg_timeout
runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
'''

#: The config function: torchtitan's debugmodel with causal SDPA as each layer's inner attention.
CONFIG_MODULE = '''\
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3.config_registry import llama3_debugmodel


def llama3_debugmodel_sdpa():
    config = llama3_debugmodel()
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return config
'''


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    """CPU seconds and output of one program; a failure is one error line with its last output line."""
    before = children_cpu_seconds()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise UserError(f"'{' '.join(argv[:4])} ...' exited {done.returncode}: {last}")
    return children_cpu_seconds() - before, done.stdout + done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_torchtitan_inputs(tmp: Path) -> tuple[Path, Path, Path]:
    """The launcher and config module, the tokenizer folder and the corpus folder torchtitan reads."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    code = tmp / "torchtitan_code"
    code.mkdir()
    (code / "cpu_launch.py").write_text(LAUNCHER)
    (code / "versus_torchtitan_config.py").write_text(CONFIG_MODULE)
    words = [f"w{i}" for i in range(VOCAB - 2)]
    vocab = {"<bos>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assets = tmp / "torchtitan_tokenizer"
    assets.mkdir()
    tokenizer.save(str(assets / "tokenizer.json"))
    (assets / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": True, "add_eos_token": True}))
    corpus = tmp / "torchtitan_corpus"
    corpus.mkdir()
    rng = random.Random(0)
    with open(corpus / "train.jsonl", "w", encoding="utf-8") as f:
        for _ in range(2000):  # 2,000 documents of 1,000 words: 2 M tokens, far more than a run reads
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(1000))}) + "\n")
    return code, assets, corpus


def _parameters(output: str, pattern: str) -> str:
    found = re.search(pattern, re.sub(r"\x1b\[[0-9;]*m", "", output))
    return found.group(1) if found else "?"


def model_only(site: Path, rounds: int) -> int:
    """``--model-only``: the two models' forward + loss + backward, interleaved in this process (see the module doc)."""
    import time

    import torch
    import torch.nn.functional as F

    from torchnlq.models import ModelArgs
    from torchnlq.train.cpu_allocator import keep_freed_memory

    sys.path.insert(0, str(site))
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    torch.set_num_threads(1)
    keep_freed_memory()
    spec = model_registry("debugmodel").model
    for layer in spec.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    titan = spec.build()
    torch.manual_seed(0)
    ours = build_model(ModelArgs(n_layers=LAYERS, dim=DIM, n_heads=HEADS, mlp_hidden=HIDDEN, vocab_size=VOCAB,
                         max_seq_len=SEQ, tie_embeddings=False, positions="rope", rope_theta=500000.0, norm="rms",
                         mlp_activation="swiglu", init="depth"))
    weights = ours.state_dict()
    mapped = {"tok_embeddings.weight": weights["tok_emb.weight"], "norm.weight": weights["ln_f.weight"],
              "lm_head.weight": weights["lm_head.weight"]}
    for i in range(LAYERS):
        ours_i, titan_i = f"layers.{i}.", f"layers.{i}."
        mapped[titan_i + "attention.qkv_linear.wqkv.weight"] = torch.cat(
            (weights[ours_i + "attn.query.w_q.weight"], weights[ours_i + "attn.kv.weight"]))
        for theirs, mine in (("attention.wo", "attn.proj"), ("feed_forward.w1", "mlp.gate"),
                             ("feed_forward.w3", "mlp.fc"), ("feed_forward.w2", "mlp.proj"),
                             ("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            mapped[f"{titan_i}{theirs}.weight"] = weights[f"{ours_i}{mine}.weight"]
    titan.load_state_dict(mapped)  # strict: every tensor of both models has its counterpart
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    models = {"torchtitan": titan, "torchnlq": ours}

    def passes(model: torch.nn.Module, count: int = 3) -> float:
        start = time.process_time()
        for _ in range(count):
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            model.zero_grad(set_to_none=True)
        return (time.process_time() - start) / count

    for model in models.values():
        passes(model, 2)  # warm-up: allocations, first-call costs
    times = dict(zip(models, interleave([lambda m=m: passes(m) for m in models.values()], rounds)))
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print(f"# the models alone: forward + full-logits cross-entropy + backward, {BATCH} x {SEQ} tokens, "
          "fp32, 1 thread, "
          f"{rounds} rounds of 3 passes, CPU seconds; parameters {params['torchtitan']:,} / {params['torchnlq']:,}")
    print(ratio_table("model", "CPU ms per forward + backward",
                      ("torchtitan 0.3.0 debugmodel (SDPA)", times["torchtitan"]),
                      ("torchnlq (linear query)", times["torchnlq"]), "torchtitan"))
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``python -m benchmarks.versus_torchtitan``."""
    parser = ArgumentParser(prog="python -m benchmarks.versus_torchtitan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--torchtitan", required=True,
                        help="a folder holding the importable torchtitan package and its dependencies")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default: 12)")
    parser.add_argument("--steps", default="12,2", help="LONG,SHORT steps per run (default: 12,2)")
    parser.add_argument("--model-only", action="store_true",
                        help="time the two models' forward + backward in this process instead of the programs")
    args = parser.parse_args(argv)
    site = Path(args.torchtitan).expanduser().resolve()
    if not all((site / name).is_file() for name in REQUIRED):
        raise UserError(f"--torchtitan {args.torchtitan!r} holds no torchtitan package ({REQUIRED[0]}); pass the "
                        "folder of 'pip install --no-deps --target DIR torchtitan==0.3.0' and its dependencies")
    if args.model_only:
        if args.rounds < 1:
            raise UserError(f"--rounds must be at least 1, got {args.rounds}")
        return model_only(site, args.rounds)
    long, short = long_short_steps(args.steps, args.rounds, "8,2")
    with tempfile.TemporaryDirectory(prefix="torchnlq-vs-torchtitan-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp), "HF_HOME": str(tmp / "hf"),
               "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
               "TRITON_HOME": str(tmp), "TRITON_CACHE_DIR": str(tmp / "triton"),
               "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}
        code = tmp / "torchtitan_code"  # the launcher and the config module (written below)
        tt_work = tmp / "torchtitan_work"  # its working directory: relative defaults land here
        tt_work.mkdir()
        paths = [str(site), str(code), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
        # Byte code goes to the temporary folder (none into PATH), and is written there even where
        # PYTHONDONTWRITEBYTECODE is set: otherwise every torchtitan run would compile torch from source.
        tt_env = {**{k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"},
                  "PYTHONPATH": os.pathsep.join(paths), "PYTHONPYCACHEPREFIX": str(tmp / "pycache"),
                  "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                  "MASTER_ADDR": "127.0.0.1"}
        check = subprocess.run([sys.executable, "-c", "import torchtitan.trainer"], cwd=tt_work, env=tt_env,
                               capture_output=True, text=True)
        if check.returncode != 0:
            last = (check.stderr or check.stdout).strip().splitlines()[-1:]
            raise UserError(f"--torchtitan {args.torchtitan!r}: 'import torchtitan.trainer' failed: {last}; install "
                            "its dependencies there with pip install --no-deps --target")
        code, assets, corpus = _write_torchtitan_inputs(tmp)
        our_data = write_random_corpus(tmp / "torchnlq_data", "byte")
        counter = iter(range(10**6))

        def torchtitan_run(steps: int) -> tuple[list[str], dict[str, str]]:
            flags = ["--module", "versus_torchtitan_config", "--config", "llama3_debugmodel_sdpa",
                     "--hf-assets-path", str(assets), "--dump-folder", str(tmp / "torchtitan_out" / str(next(counter))),
                     "--dataloader.dataset", "c4_test", "--dataloader.dataset-path", str(corpus),
                     "--training.local-batch-size", str(BATCH), "--training.seq-len", str(SEQ),
                     "--training.steps", str(steps), "--training.max-norm", "1.0",
                     "--training.mixed-precision-param", "float32", "--training.disable-cuda-graphs",
                     "--lr-scheduler.warmup-steps", "1", "--metrics.log-freq", "1000000",
                     "--checkpoint.no-enable", "--validator.no-enable", "--compile.no-enable",
                     "activation-checkpoint:none"]
            return [sys.executable, str(code / "cpu_launch.py"), *flags], {**tt_env, "MASTER_PORT": str(_free_port())}

        def torchnlq_run(steps: int) -> tuple[list[str], dict[str, str]]:
            flags = ["--model.flavor=debug", f"--model.n_layers={LAYERS}", f"--model.dim={DIM}",
                     f"--model.n_heads={HEADS}", "--model.positions=rope", "--model.rope_theta=500000",
                     "--model.tie_embeddings=false", f"--model.vocab_size={VOCAB}", "--model.norm=rms",
                     "--model.mlp_activation=swiglu", f"--model.mlp_hidden={HIDDEN}", "--model.query.type=linear",
                     "--model.init=depth", "--training.device=cpu", f"--training.micro_batch_size={BATCH}",
                     f"--training.seq_len={SEQ}", f"--training.steps={steps}", "--lr_schedule.warmup_steps=1",
                     f"--data.path={our_data}", "--data.synthetic=false", "--data.tokenizer=byte",
                     "--validation.enabled=false", "--metrics.tensorboard=false", "--metrics.log_interval=1000000",
                     "--checkpoint.enabled=false", f"--job.dump_folder={tmp / 'runs'}", f"--job.name=r{next(counter)}"]
            return [sys.executable, "-m", "torchnlq.train", *flags], env

        programs = {("torchtitan", s): (torchtitan_run, tt_work) for s in (long, short)}
        programs |= {("torchnlq", s): (torchnlq_run, ROOT) for s in (long, short)}
        # Untimed: fills the byte-code cache and torchtitan's tokenized-corpus cache; gives the parameter counts.
        argv_tt, env_tt = torchtitan_run(short)
        _, tt_out = _run(argv_tt, tt_work, env_tt)
        argv_nlq, env_nlq = torchnlq_run(short)
        _, nlq_out = _run(argv_nlq, ROOT, env_nlq)
        keys = list(programs)

        def run(key: tuple[str, int]) -> float:
            run_argv, run_env = programs[key][0](key[1])
            return _run(run_argv, programs[key][1], run_env)[0]

        def progress(index: int, results: list[list[float]]) -> None:
            last = dict(zip(keys, (r[-1] for r in results)))
            ms = {name: 1000 * (last[(name, long)] - last[(name, short)]) / (long - short)
                  for name in ("torchtitan", "torchnlq")}
            print(f"round {index + 1}/{args.rounds}: CPU ms per iteration torchtitan {ms['torchtitan']:.1f}, "
                  f"torchnlq {ms['torchnlq']:.1f}", file=sys.stderr, flush=True)

        cpu = dict(zip(keys, interleave([lambda key=key: run(key) for key in keys], args.rounds,
                                        after_round=progress)))
    per_iter = {name: [(a - b) / (long - short) for a, b in zip(cpu[(name, long)], cpu[(name, short)])]
                for name in ("torchtitan", "torchnlq")}
    version = _parameters(tt_out, r"torchtitan version: (\S+)")
    print(f"# torchnlq vs torchtitan {version} train.py, Llama 3 debugmodel shape ({LAYERS} layers, d {DIM}, {HEADS} "
          f"heads, vocab {VOCAB}, {BATCH} x {SEQ} tokens), {args.rounds} rounds of {long} and {short} steps, "
          "1 thread, fp32, CPU seconds")
    print(f"# parameters: torchtitan {_parameters(tt_out, r'size: ([0-9,]+) total parameters')}, "
          f"torchnlq {_parameters(nlq_out, r'params ([0-9,]+)')}")
    print(ratio_table("program", "CPU ms per iteration", (f"torchtitan {version} train.py", per_iter["torchtitan"]),
                      ("torchnlq", per_iter["torchnlq"]), "torchtitan"))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
