"""Shared entry-point behaviour: user errors become one line and exit code 2.

Under ``torchnlq.train.launch``, a worker leaves its ``error:`` line, traceback or clean stop in
the launcher's folder (``TORCHNLQ_LAUNCH_DIR``) instead: the launcher shows the first, since the
other ranks then fail in their collectives with tracebacks that say nothing about the cause.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable

from torchnlq.errors import UserError
from torchnlq.files import os_error_line

LAUNCH_DIR_ENV = "TORCHNLQ_LAUNCH_DIR"


def _error(line: str) -> int:
    if not tell_launcher("error", line):
        print(f"error: {line}", file=sys.stderr)
    return 2


def tell_launcher(kind: str, text: str) -> bool:
    """Leave ``text`` for the launcher as ``<kind>-rank<RANK>.txt``; False when not under the launcher."""
    folder = os.environ.get(LAUNCH_DIR_ENV)
    if not folder or not Path(folder).is_dir():
        return False
    path = Path(folder) / f"{kind}-rank{os.environ.get('RANK', '0')}.txt"
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # the launcher never reads half a line
    except OSError:
        return False
    return True


class ArgumentParser(argparse.ArgumentParser):
    """argparse with torchnlq's one-line mistakes: a bad command line raises :class:`UserError` (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help)")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after an option's help, unless the help names its default already or it is unset."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, "") or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that ``finally`` blocks remove temporaries as for Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


# SIGTERM around a fork of a tool (datasets' worker pools). Pool.terminate, at the end of every multi-process
# load and map, sends SIGTERM to each worker, and a worker must die of it: raised as Terminated, it could leave
# its pool's queue lock held and a sibling blocked for ever, so the tool would never return. The child therefore
# starts with SIGTERM's default action at the C level (a Python handler may never run, or miss an early signal);
# in the parent, a SIGTERM that arrives during the fork is held back and raised right after it.
_fork_state: list[tuple[bool, bool]] = []  # per fork in progress: (SIG_DFL set by us, SIGTERM blocked by us)


def _before_fork() -> None:
    main_thread = threading.current_thread() is threading.main_thread()  # signal.signal works there only
    if not (main_thread and signal.getsignal(signal.SIGTERM) is _raise_terminated):
        _fork_state.append((False, False))
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _fork_state.append((True, signal.SIGTERM not in before))


def _after_fork(in_child: bool) -> None:
    changed, blocked = _fork_state.pop() if _fork_state else (False, False)
    if not changed:
        return
    if not in_child:
        signal.signal(signal.SIGTERM, _raise_terminated)
    if blocked:  # the parent raises a SIGTERM that came meanwhile; the child dies of one
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


_fork_hook_registered = False


class _ThreadFaults:
    """``threading.excepthook`` while a tool runs: a writer thread that dies of an environment fault (TensorBoard's
    event writer on a full disk) prints no traceback; its owner raises the fault on its next call, and a fault
    nobody raised is the tool's one line at the end."""

    def __init__(self, previous: Callable[[threading.ExceptHookArgs], object]) -> None:
        self.previous = previous
        self.lines: list[str] = []

    def __call__(self, args: threading.ExceptHookArgs) -> None:
        line = os_error_line(args.exc_value) if isinstance(args.exc_value, OSError) else None
        if line is None:
            self.previous(args)
        else:
            self.lines.append(line)


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Call ``main(argv)``; a :class:`UserError`, or an environment fault (read-only, full disk, a path of the
    wrong kind: :func:`torchnlq.files.os_error_line`, also in a writer's thread), prints one ``error: ...`` line
    and returns 2.

    SIGTERM is turned into :class:`Terminated` (the trainer replaces this with its own save-and-stop
    handler), so an interrupted tool cleans up and exits with one line, as for Ctrl-C.
    """
    global _fork_hook_registered
    args = sys.argv[1:] if argv is None else argv
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread and not _fork_hook_registered:  # once per process, when a tool first runs (not at import)
        os.register_at_fork(before=_before_fork, after_in_parent=lambda: _after_fork(False),
                            after_in_child=lambda: _after_fork(True))
        _fork_hook_registered = True
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    thread_faults = _ThreadFaults(threading.excepthook)
    threading.excepthook = thread_faults
    try:
        code = main(args) or 0
        return _error(thread_faults.lines[0]) if thread_faults.lines and code == 0 else code
    except UserError as e:
        return _error(str(e))
    except OSError as e:
        line = os_error_line(e)
        if line is None:
            raise
        return _error(line)
    except KeyboardInterrupt as e:
        print("terminated: stopped before finishing; run the command again to finish" if isinstance(e, Terminated)
              else "interrupted", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    except Exception:
        if tell_launcher("crash", traceback.format_exc()):
            return 1
        raise
    finally:
        threading.excepthook = thread_faults.previous
        if in_main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)
