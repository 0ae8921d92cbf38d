"""What training asks of a family's model beyond its forward: the hooks of :class:`FamilyRuntime`.

torchtitan's ``ModelSpec`` carries a family's ``parallelize_fn`` and its other hooks beside the model; here a
:class:`~torchnlq.models.family.Family` carries a ``FamilyRuntime``, and the trainer, the memory estimate and the
preflight checks call its methods without knowing the family. Every hook does nothing by default (the dense
family's); a family overrides those it needs (the moe family: its routers' statistics, balancing bias, router
losses and expert parallelism, in models/moe/runtime.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

#: An in-place sum of a tensor over the training processes (``torch.distributed.all_reduce``), or None for one.
Reduce = Callable[[torch.Tensor], Any] | None


class FamilyRuntime:
    """The hooks of one family's models during training (all no-ops here)."""

    #: The prefix of :meth:`step_statistics`' TensorBoard tags: ``<tag>/layer<i>/<key>`` and ``<tag>/mean/<key>``.
    statistics_tag: str = ""
    #: The boolean ``[parallelism]`` options :meth:`parallelize` reads (e.g. ``expert_parallel``): set for a model
    #: of a family that does not read them, they are warned about (they would change nothing).
    parallelism_options: tuple[str, ...] = ()

    def set_loss_scale(self, model: nn.Module, scale: float) -> None:
        """Once, after the model is built: the gradient scale of losses the model adds itself (an MoE's router
        losses), ``1 / grad_accum_steps`` as the trainer divides the language-model loss."""

    def start_step(self, model: nn.Module) -> None:
        """Before the first forward of each optimizer step (an MoE clears its routers' counts)."""

    def finish_step(self, model: nn.Module, reduce: Reduce) -> None:
        """After each optimizer update (not after a skipped one): ``reduce`` sums a tensor over the processes
        in place (None on one), so that state the step counted is the same everywhere."""

    def step_statistics(self, model: nn.Module) -> list[tuple[int, str, float]]:
        """(block index, statistic, value) of the last step, logged under :attr:`statistics_tag` with each
        statistic's mean over the blocks; nothing by default."""
        return []

    def check_parallelism(self, args: Any, cfg: Any, world: int | None) -> None:
        """Raise ConfigError when ``args`` (ModelArgs) cannot train as the job config ``cfg`` asks (its
        ``[parallelism]``, ``[training]``) over ``world`` processes: None while the process count is not known
        yet (the config's own checks), then again before torchrun starts them."""

    def parallelize(self, model: nn.Module, mesh: Any, parallelism: Any) -> set[nn.Parameter]:
        """Apply the family's own parallelism to ``model`` on the meta device, before FSDP (``mesh``: the 1-D
        device mesh of the processes); the parameters it shards itself, which FSDP then leaves alone."""
        return set()

    @contextlib.contextmanager
    def on_fake_tensors(self, model: nn.Module) -> Iterator[None]:
        """A context in which ``model`` runs on fake tensors (the memory estimate: shapes, no values), for a
        model whose computation depends on values (an MoE's routing)."""
        yield
