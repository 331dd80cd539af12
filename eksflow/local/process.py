"""Task processes: started so that they die with the executor, waited for, stopped like a pod.

Each task process starts in its own session (so its own process group): Ctrl-C at the terminal reaches the
executor only, and the task's whole tree can be signalled at once. On Linux it also gets PR_SET_PDEATHSIG, so the
kernel sends it SIGTERM if the executor dies, even by SIGKILL; the run's watchdog (watchdog.py) then stops the
rest of its tree. Waiting uses a pidfd where the kernel has them, so a finished task is seen at once rather than
at the next poll.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from eksflow.local.watchdog import session_members, signal_session, start_time, stop_sessions

# SIGTERM -> SIGKILL: a pod's default terminationGracePeriodSeconds. A preempted train step finishes its step,
# commits a checkpoint and stops Ray inside it; 10 s was too short for that on 2 busy cores (it was SIGKILLed).
KILL_GRACE_S = 30.0
_CHECK_S = 0.2  # how often a waiting task checks for a stop request or its deadline
_PR_SET_PDEATHSIG = 1
_WATCHDOG = Path(__file__).with_name("watchdog.py")


def _setpriv() -> str | None:
    """util-linux `setpriv`, if it can set a parent-death signal (2.33 and later)."""
    found = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if found is None:
        return None
    # The option is in the binary's option table iff it is supported: reading 80 KB costs less than running
    # `setpriv --help` in every run's start-up.
    try:
        return found if b"pdeathsig" in Path(found).read_bytes() else None
    except OSError:
        return None


def _death_signal_preexec() -> Callable[[], None] | None:
    """Where there is no setpriv: a preexec function making the same prctl call (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: most machines have setpriv, and ctypes costs every run's start-up
    import ctypes.util

    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    term, zero = ctypes.c_ulong(signal.SIGTERM), ctypes.c_ulong(0)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, term, zero, zero, zero)

    return preexec


@functools.cache
def _launcher() -> tuple[list[str], Callable[[], None] | None]:
    """How to start a task so the kernel SIGTERMs it when the executor thread that started it dies.

    `setpriv --pdeathsig TERM --` sets the signal and execs the task (one more exec, no Python in the child); a
    preexec function does the same where setpriv is missing, at the price of running Python between fork and exec.
    """
    setpriv = _setpriv()
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "TERM", "--"], None
    return [], _death_signal_preexec()


@dataclass(frozen=True)
class Ended:
    """How a task process ended."""

    exit_code: int  # a container's view: killed by signal N is 128 + N
    stopped_for: str  # why the executor stopped it ("" if it ended by itself)
    duration_s: float


class ProcessTracker:
    """The run's live task processes, told to the watchdog (and kept for owner.json) as they start and end."""

    def __init__(self, notify: Callable[[str], None] | None = None, ended: Callable[[str], None] | None = None) -> None:
        self._notify = notify  # a process started: "+PID START\n"
        self._ended = ended  # a process was reaped: "-PID\n"
        self._lock = threading.Lock()
        self.live: dict[int, tuple[str, str]] = {}  # pid -> (node key, start time)

    def started(self, key: str, pid: int) -> None:
        """Record a new task process."""
        started = start_time(pid) or ""
        with self._lock:
            self.live[pid] = (key, started)
            if self._notify is not None:
                self._notify(f"+{pid} {started}\n")

    def ended(self, pid: int) -> None:
        """Forget a reaped task process."""
        with self._lock:
            self.live.pop(pid, None)
            if self._ended is not None:
                self._ended(f"-{pid}\n")


class Watchdog:
    """The run's watchdog process (watchdog.py): told of each task process, and that the run ended well."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, run_dir: Path) -> int:
        """Start it for the run in `run_dir`; its pid. OSError if it cannot start.

        In its own session: a terminal's SIGHUP and Ctrl-C are not for it.
        """
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_WATCHDOG), str(run_dir), str(KILL_GRACE_S)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        return self._proc.pid

    def tell(self, note: str) -> None:
        """Tell the watchdog a note: a task process that started or ended, or the run's pod network.

        ProcessTracker's `+pid start` and `-pid` notes keep its list of live task processes; `net <folder>` names the
        pod network it removes if the executor dies.
        """
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                os.write(self._proc.stdin.fileno(), note.encode())

    def end(self) -> None:
        """Tell it the run ended well; it exits on its own (no waiting for its interpreter to start)."""
        if self._proc is None or self._proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            self._proc.stdin.write(b"exit\n")
            self._proc.stdin.close()


def start(
    argv: list[str], *, key: str, cwd: Path, env: Mapping[str, str], log: IO[bytes], tracker: ProcessTracker
) -> subprocess.Popen[bytes]:
    """Start a task process in its own session, dying with the executor, told to the tracker; OSError if it cannot."""
    prefix, preexec = _launcher()
    if prefix:
        # A program that is not there must fail to start here (an Error), not as setpriv's exit 127 (a Failure).
        program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if program is None or not os.access(program, os.X_OK):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
        argv = [program, *argv[1:]]
    proc = subprocess.Popen(
        [*prefix, *argv],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own session and process group: killed as a whole, spared our Ctrl-C
        preexec_fn=preexec,  # noqa: PLW1509 (only without setpriv, and only one prebuilt ctypes call)
    )
    tracker.started(key, proc.pid)
    return proc


def end(proc: subprocess.Popen[bytes], tracker: ProcessTracker) -> int:
    """Kill what is left of a task process's group, reap it, tell the tracker; its exit code as a container's."""
    # Like a pod ending, the step's leftover children (daemons it did not stop) go with it. Its process group
    # holds them unless they moved out; the full sweep of its session (a scan of /proc) is for stops only.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    tracker.ended(proc.pid)
    code = proc.returncode
    return 128 - code if code < 0 else code


def run(
    argv: list[str],
    *,
    key: str,
    cwd: Path,
    env: Mapping[str, str],
    log: IO[bytes],
    tracker: ProcessTracker,
    stop_reason: Callable[[], str],
    deadline_s: float | None,
) -> Ended:
    """Run one task process to its end; stop it (TERM, then KILL after the grace) on request or past its deadline."""
    started = time.monotonic()
    proc = start(argv, key=key, cwd=cwd, env=env, log=log, tracker=tracker)
    stopped_for = ""
    try:
        while not _wait(proc, _CHECK_S):
            stopped_for = stop_reason()
            if not stopped_for and deadline_s is not None and time.monotonic() - started > deadline_s:
                stopped_for = f"exceeded activeDeadlineSeconds={deadline_s:g}"
            if stopped_for:
                stop_tree(proc, KILL_GRACE_S)
                break
    finally:
        code = end(proc, tracker)
    return Ended(code, stopped_for, time.monotonic() - started)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether `proc` ended within `timeout_s` (without reaping it: the caller does, after its tree is gone)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)
        return proc.returncode is not None
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def stop_tree(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the task's process, SIGKILL its whole session once it ended or after `grace_s` (a pod's termination).

    As kubelet stops a container: the signal goes to its main process alone, which stops its children its own way.
    The train step asks its Ray workers to commit a checkpoint and stop; a SIGTERM to every process of the session
    killed the workers and Ray's own daemons first, so nothing was committed and the step waited for the SIGKILL.
    """
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    signal_session(proc.pid, signal.SIGKILL)


def stop_orphans(sessions: list[int], grace_s: float = KILL_GRACE_S) -> list[int]:
    """Stop task sessions left by an executor that died; the ones that had processes."""
    found = [sid for sid in sessions if session_members(sid)]
    stop_sessions(found, grace_s)
    return found
