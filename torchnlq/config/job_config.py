"""The job configuration: one dataclass per TOML section.

Every field is declared with :func:`option`: its one-line doc (``--help``, docs/configs.md) and its
allowed values or range (checked by :mod:`torchnlq.config.manager`). Builders receive only the
section they need, never the whole :class:`JobConfig`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

# The [model] sections are the model package's own (it is self-contained and exported as is).
from torchnlq.models.config import Model, Query, option  # noqa: F401 - Model, Query: importable from here too
from torchnlq.models.lm_loss import DEFAULT_CHUNK_TOKENS


# torch's generators take seeds up to 2**64 - 1 (a larger one overflows deep inside the first draw).
SEED_MAX = 2**64 - 1


def entry_type(section: Any, name: str) -> type | None:
    """The dataclass of a ``list[Entry]`` field (a TOML array of tables, ``[[optimizer.groups]]``), else None."""
    hint = typing.get_type_hints(type(section))[name]
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if dataclasses.is_dataclass(item):
            return item
    return None


def section(cls: type) -> Any:
    """Declare a nested section (a dataclass with its own options; its docstring's first line is the section's
    doc in ``--help`` and docs/configs.md)."""
    return field(default_factory=cls)


@dataclass
class Job:
    """Where the run lives. The run folder is ``dump_folder/name``."""

    dump_folder: str = option("./outputs", "Folder that holds all runs.", path=True)
    name: str = option("debug", "Run name; the run folder is dump_folder/name.")
    description: str = option(
        "", "Free text describing the run, kept in the resolved config. Options changed after the file that "
        "set it (by a config extending that file, or on the command line) are appended as [changed: key=value, ...].")
    rerun: bool = option(
        False,
        "Start the run folder again from step 0 when a run already started there and left no checkpoint to resume "
        "from: its train.log, run_info.json, config.toml, tb/ (and wandb/, export/, profiler/) are first moved into "
        "<run>/previous-N/. Unset, such a start is refused. A run with checkpoints resumes either way.",
    )
    plugins: list[str] = option(
        [],
        "Python modules imported before the config is checked, so that query types and flavors they register "
        "(register_query, FLAVORS) can be named (like torchtitan's custom_import); importable by name, e.g. from "
        "the working directory.",
    )


@dataclass
class Training:
    """The optimisation loop."""

    steps: int = option(100, "Number of optimizer steps.", min=1)
    seed: int = option(
        1337, "Seed for model init and every other random choice except the data order.", min=0, max=SEED_MAX
    )
    micro_batch_size: int = option(8, "Sequences per forward/backward on one device.", min=1)
    grad_accum_steps: int = option(1, "Micro-batches accumulated per optimizer step.", min=1)
    seq_len: int = option(256, "Tokens per training sequence (at most the model's max_seq_len).", min=1)
    mixed_precision: str = option(
        "bf16", "Autocast dtype on CUDA: bf16 or fp32 (no autocast). CPU always trains in fp32.",
        choices=("bf16", "fp32"),
    )
    max_norm: float = option(1.0, "Gradient clipping max norm; 0 disables clipping.", min=0.0)
    device: str = option("auto", "auto (CUDA when present, else CPU), cuda or cpu.", choices=("auto", "cuda", "cpu"))
    tf32: bool = option(True, "Allow TF32 matmuls on CUDA.")
    compile: bool = option(False, "torch.compile each transformer block (fullgraph) before sharding.")
    on_nonfinite: str = option(
        "stop",
        "A non-finite loss or gradient norm: stop (keep the last good checkpoint, save nothing of the bad "
        "state) or skip the update (counted in the metrics as skipped_steps).",
        choices=("stop", "skip"),
    )
    max_consecutive_skips: int = option(
        10,
        "With on_nonfinite = skip: stop (without saving the bad state) after this many skipped updates in a row; "
        "a run that cannot take a finite step is diverged, not unlucky.",
        min=1,
    )
    loss_chunk_tokens: int | None = option(
        None,
        "LM head + cross-entropy this many tokens at a time, never holding the full [tokens, vocab] logits (same loss "
        "and gradients; 256 when memory limits the micro-batch: docs/performance.md); 0 forms the full logits. Unset: "
        "0 when training compiles on CUDA (the fastest path there, and no more memory), else 4096. With compile = "
        "true the head and loss are compiled on either path.",
        min=0,
    )

    def global_batch(self, world_size: int = 1) -> int:
        """Sequences per optimizer step over ``world_size`` processes: micro_batch_size x grad_accum_steps x world."""
        return self.micro_batch_size * self.grad_accum_steps * world_size

    def tokens_per_step(self, world_size: int = 1) -> int:
        """Tokens per optimizer step over ``world_size`` processes (the global batch's sequences x seq_len)."""
        return self.global_batch(world_size) * self.seq_len


#: Options that no longer exist: a config or flag that sets one gets this reason and "delete it".
REMOVED_OPTIONS = {
    "training.compile_loss": "with training.compile = true the LM head and the loss are always compiled",
    "model.block": "families are model.family now (the pre-norm 'prenorm' blocks are the 'dense' family); set "
                   "that instead",
}


def loss_chunk_tokens(training: Training, device_type: str) -> int:
    """The chunk size of the LM head's loss on ``device_type`` (0: full logits), resolving an unset option."""
    if training.loss_chunk_tokens is not None:
        return training.loss_chunk_tokens
    return 0 if device_type == "cuda" and training.compile else DEFAULT_CHUNK_TOKENS


@dataclass
class OptimizerGroup:
    """One ``[[optimizer.groups]]`` entry: the parameters it claims and how they are optimised."""

    name: str = option("group", "The group's name (logs show lr/<name>; the run header lists its parameters).")
    params: list[str] = option(
        [], "Parameter-name patterns (fnmatch: layers.*.attn.query.w1.weight); empty means every name (then kind "
        "selects).",
    )
    kind: str | None = option(
        None,
        "Select by kind (with params: both must hold): hidden (2-D matrices of the blocks), embedding (token and "
        "position tables; a tied head is the token table), head (an untied LM head), gain_bias (norm gains, "
        "biases), query_mlp (the matrices of the query's nonlinear branch: branch_matrices(), W1 and W2 of the "
        "paper's query).",
        registry="parameter kinds",
    )
    optimizer: str = option("adamw", "adamw (or adamw8bit's, with optimizer.name) or muon (2-D matrices only).",
                            registry="group optimizers")
    lr_multiplier: float = option(1.0, "The group's LR is the schedule's times this.", min=0.0, min_exclusive=True)
    weight_decay: float | None = option(None, "The group's weight decay; unset means optimizer.weight_decay.", min=0.0)


@dataclass
class Optimizer:
    """AdamW (weight decay on tensors with two or more dimensions only), or Muon for the hidden matrices."""

    name: str = option(
        "adamw",
        "Optimizer: adamw (torch), adamw8bit (torchao's 8-bit AdamW states: pip install 'torchnlq[torchao]'), or "
        "muon (torch's Muon for the blocks' 2-D matrices, AdamW for embeddings, head, gains and biases: "
        "modded-nanogpt's split).",
        registry="optimizers",
    )
    lr: float = option(6e-4, "Peak learning rate (reached at the end of warmup).", min=0.0, min_exclusive=True)
    weight_decay: float = option(0.1, "Decoupled weight decay for >= 2-D tensors (norm gains are not decayed).",
                                 min=0.0)
    beta1: float = option(0.9, "AdamW beta1.", min=0.0, max=1.0, max_exclusive=True)
    beta2: float = option(0.95, "AdamW beta2.", min=0.0, max=1.0, max_exclusive=True)
    eps: float = option(1e-8, "AdamW epsilon.", min=0.0, min_exclusive=True)
    fused: bool | None = option(None, "Fused AdamW kernel; unset means on for CUDA, off otherwise.")
    muon_momentum: float = option(0.95, "Muon momentum.", min=0.0, max=1.0, max_exclusive=True)
    muon_nesterov: bool = option(True, "Muon: Nesterov momentum.")
    muon_ns_steps: int = option(5, "Muon: Newton-Schulz iterations of the orthogonalisation.", min=1)
    muon_adjust_lr: str = option(
        "match_rms_adamw",
        "Muon's per-matrix LR scale: match_rms_adamw (0.2·sqrt(max(rows, cols)), Moonshot's: the AdamW LR and "
        "weight decay carry over) or original (sqrt(max(1, rows/cols)), Keller Jordan's: wants a ~50x larger LR).",
        choices=("match_rms_adamw", "original"),
    )
    groups: list[OptimizerGroup] = option(
        [], "[[optimizer.groups]] entries (TOML only): parameters by pattern and/or kind with their own optimizer, "
        "LR multiplier and weight decay; the rest keep the default groups (docs/training.md).",
    )


@dataclass
class LRSchedule:
    """Linear warmup, then cosine decay (the paper's / nanoGPT's schedule) or warmup-stable-decay."""

    name: str = option(
        "cosine",
        "cosine (the paper's: decays from the end of the warmup) or wsd (warmup-stable-decay: the peak until the "
        "last decay_length steps, then decay_shape down to min_lr).",
        registry="lr schedules",
    )
    warmup_steps: int = option(10, "Warmup steps: lr * (step + 1) / (warmup_steps + 1).", min=0)
    min_lr: float = option(6e-5, "Learning rate at and after decay_steps.", min=0.0)
    decay_steps: int | None = option(
        None, "Step at which the schedule reaches min_lr; unset means training.steps.", min=1
    )
    decay_shape: str = option("linear", "wsd: the decay tail's shape: linear, cosine or 1-sqrt.",
                              registry="decay shapes")
    decay_length: int | None = option(None, "wsd: steps of the decay tail; unset means decay_fraction of decay_steps.",
                                      min=1)
    decay_fraction: float = option(
        0.2, "wsd: the decay tail as a fraction of decay_steps (when decay_length is unset).", min=0.0, max=1.0,
        min_exclusive=True,
    )


@dataclass
class DataSource:
    """One ``[[data.sources]]`` entry of a mixture: a token folder and its share of the training sequences."""

    path: str = option("", "Token folder (train.bin, val.bin, meta.json), as data.path.", path=True)
    weight: float = option(1.0, "Its share of the training sequences, relative to the other sources' weights.",
                           min=0.0, min_exclusive=True)
    name: str | None = option(None, "Its name in the logs (loss/val/<name>); unset: the folder's name.")


@dataclass
class Data:
    """Token files and their tokenizer."""

    path: str = option(
        "./outputs/data/synthetic",
        "Folder with train.bin, val.bin (uint16 or uint32 tokens, as meta.json records) and meta.json, as written "
        "by scripts/prepare_data.py.",
        path=True,
    )
    tokenizer: str = option(
        "gpt2",
        "Tokenizer of the token files: gpt2 (tiktoken), byte, or hf (any Hugging Face tokenizer.json, named by "
        "data.tokenizer_file; docs/data.md).",
        choices=("gpt2", "byte", "hf"),
    )
    tokenizer_file: str | None = option(
        None,
        "data.tokenizer = \"hf\": the tokenizer.json the data was prepared with (its sha256 must be the one "
        "meta.json records); it sizes the model's vocabulary, and checkpoints and exports carry a copy.",
        path=True,
    )
    eot_token: str | None = option(
        None,
        "data.tokenizer = \"hf\": the text of the end-of-text token that separates documents; unset means the first "
        "of the usual ones in the vocabulary (those of GPT-2, Llama 3, Llama 2 and Gemma, in that order: "
        "docs/data.md); it must be the one the data was prepared with (meta.json).",
    )
    verify_content: bool = option(
        False,
        "Hash the token files in full when the run opens them, even when their size and modification time are "
        "those meta.json recorded (a changed size or time always triggers the full check).",
    )
    tiktoken_file: str | None = option(
        None,
        "Local GPT-2 .tiktoken ranks file for machines without internet "
        "(also read from the TORCHNLQ_TIKTOKEN_FILE environment variable).",
        path=True,
    )
    seed: int = option(
        42, "Seed of the pre-drawn batch offsets: the same seed gives every model the same data.", min=0, max=SEED_MAX
    )
    synthetic: bool = option(
        False, "Generate the seeded offline corpus into path on first use when it holds no token files."
    )
    sources: list[DataSource] = option(
        [],
        "Train on a mixture: [[data.sources]] entries (path, weight, name) of token folders of one tokenizer; "
        "every training sequence is drawn from a source by weight, from a schedule seeded by data.seed; "
        "validation reports each source's loss and their weighted mean (docs/data.md, 'Mixtures'). data.path is "
        "then not read.",
    )


@dataclass
class Downstream:
    """Multiple-choice tasks scored in the loop (HellaSwag's JSON-lines format; docs/monitoring.md, "Downstream")."""

    tasks: list[str] = option(
        [], "HellaSwag-format .jsonl files (ctx, endings, label) to score every interval steps: acc and "
        "length-normalised acc_norm per task, logged as downstream/<file name>/...; empty: none.",
    )
    interval: int | None = option(
        None, "Score them every this many steps (and at the end); unset: validation.interval.", min=1)
    max_examples: int = option(500, "Rows read from each task (its first ones): the cost of one evaluation is "
                                    "their endings, one forward sequence each.", min=1)
    batch_size: int = option(16, "Sequences per forward while scoring.", min=1)


@dataclass
class Validation:
    """Validation batches, identical for every model: one fixed set, or the paper's row per evaluation."""

    enabled: bool = option(True, "Run validation every interval steps and at the end.")
    interval: int = option(50, "Validate every this many steps.", min=1)
    sequences: int = option(64, "Number of fixed validation sequences (2400 in the paper).", min=1)
    micro_batch_size: int | None = option(
        None, "Sequences per validation forward; unset means training.micro_batch_size.", min=1)
    seed: int = option(2357, "Seed of the fixed validation offsets (the paper's protocol: 42).", min=0, max=SEED_MAX)
    protocol: str = option(
        "fixed",
        "fixed: the same sequences at every validation. paper: the paper's code's rows, a fresh row of its seeded "
        "table at every validation (row = step // interval; with seed 42, interval 1000, 2400 sequences, seq_len "
        "1024 and OpenWebText, exactly the sequences behind Table 1).",
        choices=("fixed", "paper"),
    )


@dataclass
class Metrics:
    """Console, TensorBoard and (optionally) Weights & Biases logging."""

    log_interval: int = option(10, "Log one console line and the TensorBoard scalars every this many steps.", min=1)
    tensorboard: bool = option(True, "Write TensorBoard events to <run>/tb.")
    query_diagnostics_interval: int = option(
        1000,
        "Every this many steps (and at the last), log per-layer query diagnostics (|f(X)|/|X|, cos(Q, X), norm "
        "gains) of residual queries on one validation batch to TensorBoard; 0 turns them off. On by default: one "
        "forward of that batch, well under 1% of the training between (docs/performance.md).",
        min=0,
    )
    weight_dynamics_interval: int = option(
        0,
        "Every this many steps (and at the last), log per-layer summaries of the query's matrices (W_Q, W1, W2): "
        "largest singular value, effective and stable rank, and drift from the run's initial weights "
        "(docs/monitoring.md); 0 turns them off (the default: the drift's reference rebuilds the whole model's "
        "initial weights on the CPU, a cost at billions of parameters). Each costs one SVD per matrix.",
        min=0,
    )
    peak_tflops: float | None = option(
        None, "Peak dense bf16 TFLOP/s for MFU; unset means the built-in table (no MFU on unknown devices).",
        min=0.0, min_exclusive=True,
    )
    wandb: bool = option(
        False,
        "Also log the TensorBoard scalars (same tags, same steps) and the resolved config to Weights & Biases, "
        "from rank 0, into <run>/wandb; needs pip install 'torchnlq[wandb]' (docs/monitoring.md).",
    )
    wandb_project: str = option("torchnlq", "wandb: the W&B project of the run.")
    wandb_entity: str | None = option(None, "wandb: the W&B team or user; unset means your default entity.")
    wandb_run_name: str | None = option(None, "wandb: the run's display name in W&B; unset means job.name.")
    wandb_mode: str = option(
        "offline",
        "wandb: offline writes <run>/wandb only (nothing leaves the machine; upload later with wandb sync), "
        "online streams to the W&B server (needs wandb login or WANDB_API_KEY), disabled makes every call a no-op.",
        choices=("online", "offline", "disabled"),
    )


@dataclass
class Parallelism:
    """Data parallelism across processes: FSDP2 (shard) and HSDP (replicate x shard)."""

    dp_replicate: int = option(1, "Replicas (HSDP: replicate across nodes, shard within); 1 means plain FSDP.", min=1)
    dp_shard: int = option(-1, "FSDP shard degree; -1 means world_size / dp_replicate.", min=-1)
    fsdp_single_process: bool = option(
        False, "Apply FSDP even with one process (off by default: a single device needs no sharding)."
    )
    reshard_after_forward: bool = option(
        True, "Free gathered parameters after each block's forward (less memory, one more all-gather in backward)."
    )
    expert_parallel: bool = option(
        False, "An MoE's experts split over the processes (n_experts / processes each), tokens sent to their "
        "experts by all-to-all (the family's own parallelize hook: docs/parallelism.md); FSDP shards the rest. "
        "Eager only; not with HSDP."
    )


@dataclass
class ActivationCheckpoint:
    """Trade compute for memory by recomputing activations in the backward pass."""

    mode: str = option(
        "none",
        "none; full (every block); selective (every n-th block, see every); op (all blocks, keep matmul "
        "outputs, recompute cheap ops).",
        registry="activation checkpointing",
    )
    every: int = option(2, "selective: checkpoint every this many blocks.", min=1)


@dataclass
class Float8:
    """float8 training of the linear layers through torchao (GPUs with float8 support; pip install
    'torchnlq[torchao]')."""

    enabled: bool = option(False, "Swap eligible nn.Linear layers for float8 training linears.")
    recipe: str = option("tensorwise", "Scaling recipe.", choices=("tensorwise", "rowwise"))


@dataclass
class Checkpoint:
    """Distributed checkpoints (torch.distributed.checkpoint) in <run>/checkpoints/step-N."""

    enabled: bool = option(True, "Save checkpoints every interval steps and at the end.")
    interval: int = option(500, "Save every this many steps.", min=1)
    keep_latest_k: int = option(3, "Keep this many latest checkpoints (older ones are deleted); 0 keeps all.", min=0)
    async_mode: bool = option(False, "Save in the background: training goes on while the files are written.")
    resume: bool = option(True, "Resume from the run folder's latest (or load_step) checkpoint when one exists.")
    load_step: int = option(-1, "Checkpoint step to resume from; -1 means the latest.", min=-1)
    initial_load_path: str | None = option(
        None,
        "Start a new run from another run's checkpoint folder, or from a safetensors export (e.g. a pretrained "
        "GPT-2 from scripts/upcycle.py; weights only) (used only when this run has none of its own).",
        path=True,
    )
    initial_load_model_only: bool = option(
        True, "With initial_load_path: load the weights only (fresh optimizer, step 0)."
    )
    export_dtype: str = option(
        "fp32", "Dtype of the safetensors export written with export_at_end.",
        choices=("fp32", "bf16", "fp16"),
    )
    export_at_end: bool = option(
        False, "After the final checkpoint, also write a safetensors export of the model to <run>/export."
    )


@dataclass
class Profiling:
    """torch.profiler traces of chosen steps, and CUDA memory snapshots, in <run>/profiler (docs/performance.md)."""

    enabled: bool = option(
        False, "Record torch.profiler traces of the steps the schedule below picks into <run>/profiler/steps-A-B/ "
        "(rank<R>.pt.trace.json: Perfetto, chrome://tracing or TensorBoard's profiler plugin)."
    )
    wait: int = option(9, "Steps of each cycle not profiled before its warmup (the run's steps count from 1, "
                       "across resumes: the defaults record steps 11 and 12).", min=0)
    warmup: int = option(1, "Steps profiled but not kept before the recorded ones (the profiler's start-up cost).",
                         min=1)
    active: int = option(2, "Steps recorded per cycle, into one trace.", min=1)
    repeat: int = option(1, "Cycles of wait + warmup + active steps; 0 repeats them until the run ends.", min=0)
    memory_snapshot: bool = option(
        False, "CUDA only: record the allocator's history from the first step and save a snapshot "
        "(rank<R>.memory.pickle, for pytorch.org/memory_viz) with each trace and on an out-of-memory error."
    )


@dataclass
class Debug:
    """Settings that trade speed for reproducibility while debugging."""

    deterministic: bool = option(
        False, "Deterministic algorithms (torch.use_deterministic_algorithms, cuDNN without benchmarking, "
        "CUBLAS_WORKSPACE_CONFIG on CUDA, inductor without autotuning): the same config gives the same losses on "
        "the same machine; slower, and an op without a deterministic kernel stops the run."
    )


@dataclass
class JobConfig:
    """The whole job: one field per TOML section."""

    job: Job = section(Job)
    model: Model = section(Model)
    training: Training = section(Training)
    optimizer: Optimizer = section(Optimizer)
    lr_schedule: LRSchedule = section(LRSchedule)
    data: Data = section(Data)
    validation: Validation = section(Validation)
    downstream: Downstream = section(Downstream)
    metrics: Metrics = section(Metrics)
    parallelism: Parallelism = section(Parallelism)
    activation_checkpoint: ActivationCheckpoint = section(ActivationCheckpoint)
    float8: Float8 = section(Float8)
    checkpoint: Checkpoint = section(Checkpoint)
    profiling: Profiling = section(Profiling)
    debug: Debug = section(Debug)
