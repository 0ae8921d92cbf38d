"""How much memory one process of a run needs, estimated without allocating it.

One eager training step of the real model runs on fake tensors, counting the bytes an allocator would hold,
so the figure follows the code. Allocator caching is not modelled (compare with the peak *allocated*);
docs/performance.md has the details.
"""

from __future__ import annotations

import contextlib
import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from torchnlq.config.job_config import JobConfig, loss_chunk_tokens
from torchnlq.models.args import ModelArgs
from torchnlq.models.family import build_model, get_family
from torchnlq.models.lm_loss import loss_path
from torchnlq.parallel.activation_checkpoint import apply_activation_checkpointing
from torchnlq.parallel.device_memory import GIB
from torchnlq.train.optim import optimizer_state_bytes, plan_groups

# The memory of the default profile's card (an RTX 5090); model_summary.py reports against it.
DEFAULT_CARD_GIB = 32.0
# Leave this share of a card free for the allocator's cache, CUDA context and fragmentation.
HEADROOM = 0.125


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages ops create, as an allocator would hold them: (live, peak)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, int] = {}

    def _release(self, key: int, nbytes: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, nbytes = storage._cdata, storage.nbytes()
                if key not in self._refs:
                    self._refs[key] = 0
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                self._refs[key] += 1
                weakref.finalize(t, self._release, key, nbytes)
        return out


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per process. ``step`` is what one training step adds above the state held between steps."""

    weights: int
    gradients: int
    optimizer: int
    step: int  # activations, the loss path and temporaries, at their peak (gradients not included)
    world_size: int
    precision: str

    @property
    def total(self) -> int:
        """The peak of a step: weights + optimizer state + gradients + what the step adds."""
        return self.weights + self.optimizer + self.gradients + self.step

    def describe(self) -> str:
        """One line: the total and its parts, in GiB (MiB below 1 GiB)."""
        scale, unit = (GIB, "GiB") if self.total >= GIB else (2**20, "MiB")
        parts = (f"weights {self.weights / scale:.2f} + gradients {self.gradients / scale:.2f} + optimizer "
                 f"{self.optimizer / scale:.2f} + activations and temporaries {self.step / scale:.2f}")
        shard = f", sharded over {self.world_size} processes" if self.world_size > 1 else ""
        return f"{self.total / scale:.2f} {unit} per process ({parts}; {self.precision}{shard})"


def fit_warning(estimate: MemoryEstimate, capacity_bytes: int, where: str) -> str | None:
    """A warning with what to change when ``estimate`` does not fit ``capacity_bytes`` with headroom; else None."""
    usable = capacity_bytes * (1 - HEADROOM)
    if estimate.total <= usable:
        return None
    return (
        f"memory estimate {estimate.total / GIB:.1f} GiB per process exceeds {usable / GIB:.1f} GiB "
        f"({100 * (1 - HEADROOM):.0f}% of {where}'s {capacity_bytes / GIB:.0f} GiB): lower "
        "training.micro_batch_size (and raise grad_accum_steps to keep the batch), set "
        "activation_checkpoint.mode = \"selective\" or \"full\", or shard over more processes (NGPU)"
    )


def _fake_model(model: nn.Module, fake: Any, dtype: torch.dtype | None) -> None:
    """Replace a meta model's parameters and buffers by fake CPU tensors (tied weights stay tied)."""
    made: dict[int, nn.Parameter] = {}
    with fake:
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                if id(p) not in made:
                    data = torch.empty(p.shape, dtype=dtype or p.dtype, device="cpu")
                    made[id(p)] = nn.Parameter(data, requires_grad=p.requires_grad)
                module._parameters[name] = made[id(p)]
            for name, b in list(module._buffers.items()):
                if b is not None:
                    module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cpu")


class _FusedCrossEntropy(torch.autograd.Function):
    """What the compiled full-logits loss holds, for the estimate: inductor fuses the fp32 upcast, the softmax and
    its gradient into kernels that read the logits, and the backward writes the gradient over the saved logits
    (AOTAutograd donates saved activations to the backward: ``torch._functorch.config.donated_buffer``), so the
    step holds one [tokens, vocab] tensor in the matmul's dtype and no fp32 copy (no value is computed: the
    estimate runs on fake tensors)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = hidden @ weight.T
        ctx.save_for_backward(hidden, weight, logits)
        return logits.new_empty((), dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        hidden, weight, grad_logits = ctx.saved_tensors  # the logits' buffer, reused for their gradient
        return grad_logits @ weight, (grad_logits.T @ hidden).to(weight.dtype)


class _CompiledHeadLoss(nn.Module):
    """The model's :class:`~torchnlq.models.lm_loss.HeadLoss` as compiled with full logits (memory only)."""

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_tokens: int) -> torch.Tensor:
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden.dtype
        flat = hidden.reshape(-1, hidden.shape[-1])
        return _FusedCrossEntropy.apply(flat.to(dtype), weight.to(dtype))


@contextlib.contextmanager
def _simulated_autocast():
    """CPU bf16 autocast standing in for the device's, without the CPU kernels' own remarks.

    CPU autocast leaves a norm's bf16 input beside its fp32 weight, and ATen's CPU RMSNorm then warns that
    it cannot take its fused kernel: true of this fake step only, and printed on a GPU run's console.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight", category=UserWarning)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield


def _simulate_step(cfg: JobConfig, args: ModelArgs, *, autocast_bf16: bool, param_dtype: torch.dtype | None,
                   drop_grads: bool, device_type: str) -> tuple[int, int]:
    """(bytes of the parameters, peak bytes one step allocates above the state held before it).

    ``drop_grads``: free each gradient when complete (FSDP reduce-scatters it into a shard, counted apart).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    t = cfg.training
    with torch.device("meta"):
        model = build_model(args)
    apply_activation_checkpointing(model, cfg.activation_checkpoint)
    chunk = loss_chunk_tokens(t, device_type)
    if loss_path(chunk).fused_when_compiled and t.compile:
        model.head_loss = _CompiledHeadLoss()
    fake = FakeTensorMode()
    _fake_model(model, fake, param_dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if drop_grads:
        for p in params:
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    with fake:
        tokens = torch.zeros(t.micro_batch_size, t.seq_len, dtype=torch.long)
    autocast = _simulated_autocast if autocast_bf16 else contextlib.nullcontext
    optimizer = None if drop_grads else torch.optim.AdamW(params, lr=1e-3, foreach=True)
    if optimizer is not None:  # its states, so that the step below measures only the update's temporaries
        with fake:
            for p in params:
                p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    counter = LiveBytes()
    # A family whose computation reads values (an MoE's routing) says how it runs on fake tensors.
    with fake, counter, get_family(args.family).runtime.on_fake_tensors(model):
        for _ in range(min(t.grad_accum_steps, 2)):  # the second micro-batch runs with gradients held
            with autocast():
                loss = model(tokens, targets=tokens, loss_chunk_tokens=chunk)
            loss.backward()
            del loss
        if optimizer is not None:
            if t.max_norm:
                torch.nn.utils.clip_grad_norm_(params, t.max_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return sum(p.numel() * p.element_size() for p in params), counter.peak


def estimate_memory(cfg: JobConfig, args: ModelArgs, world_size: int = 1, device_type: str = "cuda") -> MemoryEstimate:
    """The peak memory per process of a training step of ``cfg`` on ``world_size`` processes of ``device_type``."""
    bf16 = device_type == "cuda" and cfg.training.mixed_precision == "bf16"
    precision = "bf16" if bf16 else "fp32"
    with torch.device("meta"):
        model = build_model(args)
    plans = plan_groups(cfg.optimizer, model)  # the run's own groups: which tensors AdamW and Muon hold state for
    master = sum(4 * p.numel() for plan in plans for p in plan.params)  # fp32 weights and gradients in every mode
    optimizer = optimizer_state_bytes(cfg.optimizer, plans)
    if world_size == 1:
        _, peak = _simulate_step(cfg, args, autocast_bf16=bf16, param_dtype=None, drop_grads=False,
                                 device_type=device_type)
        # The simulated peak includes the gradients (allocated during backward): report them apart.
        return MemoryEstimate(master, master, optimizer, max(peak - master, 0), world_size, precision)
    compute_dtype = torch.bfloat16 if bf16 else torch.float32
    compute_bytes, peak = _simulate_step(cfg, args, autocast_bf16=False, param_dtype=compute_dtype, drop_grads=True,
                                         device_type=device_type)
    # FSDP holds the all-gathered weights of about two blocks at a time (the current one and the prefetched one).
    gathered = 2 * compute_bytes // max(args.n_layers, 1)
    shard = lambda n: math.ceil(n / world_size)  # noqa: E731
    return MemoryEstimate(shard(master), shard(master), shard(optimizer), peak + gathered, world_size, precision)
