"""float8 training of the linear layers through torchao (imported lazily and quietly)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

import torch
import torch.nn as nn

from torchnlq.config.job_config import Float8
from torchnlq.errors import UserError
from torchnlq.models.layers import set_fused_projections

# float8 matmuls (torch._scaled_mm) need Ada (8.9) or Hopper/Blackwell (9.0+) tensor cores.
MIN_CAPABILITY = (8, 9)
# The float8 GEMM tiles want both matrix dimensions divisible by 16.
FLOAT8_MULTIPLE = 16


@contextlib.contextmanager
def quiet_torchao_import() -> Iterator[None]:
    """Silence torchao's import noise: "Failed to load ..." for its CUDA-only .so files and pytree deprecations."""
    levels = {logger: logger.level for logger in map(logging.getLogger, ("torchao", "torch.utils._pytree"))}
    try:
        for logger in levels:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in levels.items():
            logger.setLevel(level)


def is_float8_eligible(module: nn.Module, fqn: str) -> bool:
    """The module filter: an ``nn.Linear`` with both sizes multiples of 16, not the (precision-sensitive) LM head."""
    if not isinstance(module, nn.Linear) or fqn.rsplit(".", 1)[-1] == "lm_head":
        return False
    return module.in_features % FLOAT8_MULTIPLE == 0 and module.out_features % FLOAT8_MULTIPLE == 0


def convert_to_float8(model: nn.Module, recipe: str) -> nn.Module:
    """Swap every eligible ``nn.Linear`` for ``Float8Linear`` (torchao ``recipe``), in place; no hardware check.

    The queries stop sharing the K,V matmul (models/layers.py: set_fused_projections): a replaced Linear must run
    its own forward, which the fused matmul of the raw weights would skip.
    """
    with quiet_torchao_import():
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(recipe)
        convert_to_float8_training(model, config=config, module_filter_fn=is_float8_eligible)
    set_fused_projections(model, False)
    return model


def float8_supported(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` runs float8 matmuls, and a description of it for the error message."""
    if device.type != "cuda":
        return False, "a CPU" if device.type == "cpu" else f"a {device.type} device"
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    return (major, minor) >= MIN_CAPABILITY, f"{name} (compute capability {major}.{minor})"


def apply_float8(model: nn.Module, cfg: Float8, device: torch.device) -> nn.Module:
    """Convert the eligible linears to float8 training when ``cfg.enabled``; UserError on hardware without float8."""
    if not cfg.enabled:
        return model
    supported, description = float8_supported(device)
    if not supported:
        raise UserError(
            "float8.enabled needs a GPU with float8 support (compute capability >= 8.9: RTX 4090/5090, H100, ...); "
            f"this device is {description}; set --float8.enabled=false"
        )
    return convert_to_float8(model, cfg.recipe)
