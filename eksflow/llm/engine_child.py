"""Run an installer's command so that it dies with the installer, even one killed with SIGKILL.

    python -m eksflow.llm.engine_child PARENT_PID -- COMMAND [ARG ...]

The engines' installer (eksflow.llm.engines) runs `python -m venv` (which runs ensurepip) and pip through this:
`kill -9` of `install` left its pip running under init, writing into the virtualenv that the next install removed
and made again beside it. Linux signals this process when the thread that started it ends (PR_SET_PDEATHSIG); it then
kills the command's whole process group (pip's own children too) and exits. A command whose parent is already gone
is not started. Elsewhere than Linux the command runs without that guard.

Files the command makes are writable by their owner only (umask 022): the engines' cache refuses folders others may
write (eksflow.llm.engine_trust). Standard library only, as the installer.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType

_PR_SET_PDEATHSIG = 1  # prctl(2)
_ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def argv(command: Sequence[str]) -> list[str]:
    """`command` run through this module, the calling process its parent."""
    return [sys.executable, "-m", __name__, str(os.getpid()), "--", *command]


def main(args: Sequence[str]) -> int:
    """Start the command in a process group of its own; its exit code, or 128 + the signal that ended either."""
    parent, _, *command = args
    os.umask(0o022)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the parent died before the guard was set: nothing to run for
        return 128 + signal.SIGTERM
    started: list[subprocess.Popen[bytes]] = []

    def end(signum: int, frame: FrameType | None) -> None:
        for child in started:  # not waited for: the main thread's wait holds Popen's lock (init reaps it)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        os._exit(128 + signum)

    for signum in _ENDING:  # before the command starts: a signal meanwhile still ends it
        signal.signal(signum, end)
    child = subprocess.Popen(command, start_new_session=True)
    started.append(child)
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
