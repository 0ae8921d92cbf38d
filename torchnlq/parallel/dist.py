"""Process group and device mesh from torchrun's environment (without it: one process, no process group)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchnlq.config.job_config import Parallelism
from torchnlq.errors import UserError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: its global and node-local rank, the world size and its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise UserError(f"environment variable {name}={value!r} must be an integer (torchrun sets it)") from None


def _pick_device(device_pref: str, local_rank: int, local_world_size: int) -> torch.device:
    """The device of this process for ``training.device`` = auto | cuda | cpu."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device_pref == "cpu" or (device_pref == "auto" and visible == 0):
        return torch.device("cpu")
    if visible == 0:
        raise UserError("training.device='cuda' but no CUDA device is visible; use --training.device=cpu or auto")
    if local_world_size > visible:
        raise UserError(
            f"NGPU={local_world_size} but only {visible} CUDA device{'s are' if visible != 1 else ' is'} visible; "
            f"set NGPU<={visible} or use --training.device=cpu"
        )
    return torch.device("cuda", local_rank)


def init_distributed(device_pref: str) -> DistInfo:
    """Read torchrun's environment, pick this process's device and, for several processes, join the group."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    if not (0 <= rank < world_size and 0 <= local_rank < local_world_size):
        raise UserError(
            f"inconsistent torchrun environment: RANK={rank} LOCAL_RANK={local_rank} WORLD_SIZE={world_size} "
            f"LOCAL_WORLD_SIZE={local_world_size}"
        )
    device = _pick_device(device_pref, local_rank, local_world_size)
    if device.type == "cuda":
        # Before the process group: NCCL binds each rank to the current device.
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"  # gloo: checkpoint planning's CPU tensors
        dist.init_process_group(
            backend=backend, rank=rank, world_size=world_size, device_id=device if device.type == "cuda" else None
        )
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def destroy_distributed() -> None:
    """Tear down the process group, if any (safe to call when there is none)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def resolve_degrees(world_size: int, cfg: Parallelism) -> tuple[int, int]:
    """(dp_replicate, dp_shard) with ``dp_shard = -1`` resolved; UserError unless their product is the world size."""
    replicate = cfg.dp_replicate  # at least 1: the config's min
    if cfg.dp_shard == -1:
        if world_size % replicate:
            raise UserError(
                f"parallelism.dp_replicate={replicate} does not divide the world size {world_size}; "
                f"choose a divisor of {world_size}"
            )
        shard = world_size // replicate
    elif cfg.dp_shard < 1:
        raise UserError(f"parallelism.dp_shard={cfg.dp_shard} must be -1 (derive) or at least 1")
    else:
        shard = cfg.dp_shard
    if replicate * shard != world_size:
        raise UserError(
            f"parallelism.dp_replicate={replicate} x parallelism.dp_shard={shard} = {replicate * shard} "
            f"!= world size {world_size}; set parallelism.dp_shard=-1 to derive it"
        )
    return replicate, shard


def build_mesh(info: DistInfo, cfg: Parallelism) -> DeviceMesh | None:
    """The device mesh FSDP2 shards over (``fsdp_single_process``: a 1-rank one), or None for a single process."""
    replicate, shard = resolve_degrees(info.world_size, cfg)
    if info.world_size == 1:
        if not cfg.fsdp_single_process:
            return None
        if not dist.is_initialized():  # a 1-rank group on an in-memory store: no port, no torchrun needed
            backend = "nccl" if info.device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    elif not dist.is_initialized():
        raise RuntimeError("build_mesh: world_size > 1 but no process group; call init_distributed first")
    if replicate == 1:
        return init_device_mesh(info.device.type, (shard,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(info.device.type, (replicate, shard), mesh_dim_names=("dp_replicate", "dp_shard"))
