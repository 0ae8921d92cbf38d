"""``python -m torchnlq.train.launch [torchrun options] -m torchnlq.train ...``: torchrun, with one-line endings.

run_train.sh starts multi-process runs through this instead of ``torchrun``. It runs torchrun's
own launcher (same options, same rendezvous, same elastic agent) and changes only how a run ends:

- a user mistake that a worker finds (a device, a checkpoint it cannot resume, anything the
  single-process preflight cannot see) is one ``error:`` line and exit code 2, instead of
  torchrun's multi-rank failure report and exit code 1. Workers leave their line in a private
  folder (``torchnlq.cli.tell_launcher``); the earliest one is the root cause, because the
  other ranks then fail in their collectives or are stopped by the agent.
- SIGTERM/SIGINT to the launcher: the agent passes the signal on, the workers finish the step and
  save, and the launcher prints the trainer's resume hint and exits 0 (torchrun would raise and
  exit 1 with a traceback, though the checkpoint is complete).
- anything else (a bug, a crash, a worker killed) ends with the first worker's traceback (the
  ranks that failed after it only failed because it was gone) and torchrun's report, exit code 1.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

from torchnlq.cli import LAUNCH_DIR_ENV

# Seconds the agent waits for workers to finish their step and save after a signal before it
# kills them (torchrun's default is 30 s, short for a large checkpoint on a slow disk).
DEFAULT_STOP_TIMEOUT = 300


def _messages(folder: Path, kind: str) -> list[str]:
    """The workers' messages of one kind, oldest first (the first error is the root cause)."""
    files = sorted(folder.glob(f"{kind}-rank*.txt"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    return [p.read_text().rstrip() for p in files]


def _quiet_agent_logs() -> None:
    """The agent logs every worker it stops and every exit code; the launcher says what matters once."""
    agent = "torch.distributed.elastic.agent.server"
    for name in ("torch.distributed.elastic", "torch.distributed.elastic.multiprocessing.api",
                 f"{agent}.api", f"{agent}.local_elastic_agent"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: list[str]) -> int:
    """Run torchrun's launcher with ``argv`` (torchrun's own command line) and translate how it ends."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    if args.shutdown_timeout is None:
        args.shutdown_timeout = DEFAULT_STOP_TIMEOUT
    with tempfile.TemporaryDirectory(prefix="torchnlq-launch-") as tmp:
        folder = Path(tmp)
        os.environ[LAUNCH_DIR_ENV] = tmp  # the workers inherit the launcher's environment
        _quiet_agent_logs()
        try:
            run(args)
        except ChildFailedError as e:
            errors = _messages(folder, "error")
            if errors:
                print(f"error: {errors[0]}", file=sys.stderr)
                return 2
            crashes = _messages(folder, "crash")
            if crashes:
                print(f"the first worker to fail:\n{crashes[0]}", file=sys.stderr)
            print(e.format_msg(), file=sys.stderr)
            return 1
        except SignalException as e:
            stopped = _messages(folder, "stopped")
            if stopped:
                print(stopped[0], flush=True)
                return 0
            print(f"error: stopped by {e.sigval.name} before the workers could save; the run resumes from its last "
                  "complete checkpoint (raise the stop timeout, STOP_TIMEOUT in run_train.sh, if saves take longer)",
                  file=sys.stderr)
            return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
