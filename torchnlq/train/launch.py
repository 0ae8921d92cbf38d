"""``python -m torchnlq.train.launch [torchrun options] -m torchnlq.train ...``: torchrun, with one-line endings.

Only how a run ends changes: a worker's user mistake is one ``error:`` line, exit code 2 (the earliest line
left by ``torchnlq.cli.tell_launcher``); after SIGTERM/SIGINT the workers save and the resume hint is printed,
exit code 0; anything else shows the first worker's traceback and torchrun's report, exit code 1.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

from torchnlq.cli import LAUNCH_DIR_ENV

# Seconds the agent lets workers save after a signal (torchrun's 30 s is short for a large checkpoint).
DEFAULT_STOP_TIMEOUT = 300


def _messages(folder: Path, kind: str) -> list[str]:
    """The workers' messages of one kind, oldest first (the first error is the root cause)."""
    files = sorted(folder.glob(f"{kind}-rank*.txt"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    return [p.read_text().rstrip() for p in files]


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
        # The agent logs every worker it stops and every exit code; the launcher says what matters once.
        agent = "torch.distributed.elastic.agent.server"
        for name in ("torch.distributed.elastic", "torch.distributed.elastic.multiprocessing.api",
                     f"{agent}.api", f"{agent}.local_elastic_agent"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
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
