"""Worker for tests/test_launch.py, run by ``python -m torchnlq.train.launch --standalone --nproc_per_node 2``.

Usage: ``launch_worker.py SCENARIO`` where SCENARIO is
- ``rank1-mistake``: rank 1 finds a user mistake (as a device only one rank sees would be) while
  rank 0 waits for it in a collective, which then fails on rank 0 too;
- ``crash``: rank 1 hits a bug (not a user mistake), so torchrun's own report must stay.
"""

from __future__ import annotations

import sys

import torch.distributed as dist

from torchnlq.cli import run_cli
from torchnlq.errors import UserError


def main(args: list[str]) -> int:
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        if args[0] == "rank1-mistake":
            raise UserError("training.device 'cuda:1' does not exist on this node; use NGPU <= the GPUs it has")
        raise ZeroDivisionError("a bug, not a mistake")
    dist.barrier()  # never completes: rank 1 is gone
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
