"""Stops a run's task processes when its executor dies, however it dies (SIGKILL included).

Run as a script by the executor (`python -I -S watchdog.py RUN_DIR GRACE_S`, in its own session so a terminal's
SIGHUP or a Ctrl-C to the executor's process group does not reach it), it reads the executor's notes on stdin:

    +PID START    a task process started (its own session and process group, both numbered PID)
    -PID          that process was reaped by the executor
    exit          the executor finished normally: nothing to do

End of input without `exit` means the executor is gone. Each live task session then gets SIGTERM (to its process
group and to every process of its session, so grandchildren that changed group go too), SIGKILL after GRACE_S, and
status.json is rewritten: a Running run becomes Failed "executor stopped", as do its Running nodes.

The kernel already sends each task's direct process SIGTERM when the executor thread that started it dies
(PR_SET_PDEATHSIG, set in process.py); the watchdog reaches the rest of the tree. It imports only the standard
library and phase.py (it runs without site-packages), and process.py and rundir.py reuse its helpers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

try:
    from eksflow.local.phase import Phase
except ImportError:  # run as a script without site-packages: phase.py (the enum alone) sits beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from phase import Phase  # type: ignore[import-not-found,no-redef]

STOPPED_MESSAGE = "executor stopped"
# Room on the state folder's disk an executor keeps allocated for its run's last status.json (rundir.RunFolder.reserve).
SPARE_STATUS = ".status.json.spare"
_POLL_S = 0.1


_HAS_PROC = os.path.isdir("/proc/self")


def start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22); None if it is gone or a zombie.

    A PID is reused after its process ends; a PID and its start time name one process for good. Without /proc
    (not Linux) the start time is unknown: "" for a process that exists.
    """
    if not _HAS_PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return ""
        return ""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return None
    # fields[0] is the state; a zombie has ended and only waits to be reaped
    return fields[19].decode() if len(fields) > 19 and fields[0] not in (b"Z", b"X") else None


def alive(pid: int, started: str | None) -> bool:
    """Whether the process `pid` that started at `started` still runs (a zombie does not)."""
    now = start_time(pid)
    return now is not None and (not started or not now or now == started)


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (Linux; elsewhere only its leader, if it still runs)."""
    if not _HAS_PROC:
        return [] if start_time(sid) is None else [sid]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue
        # fields[0] is the state, fields[3] the session
        if len(fields) > 3 and fields[0] not in (b"Z", b"X") and int(fields[3]) == sid:
            members.append(int(entry))
    return members


def signal_session(sid: int, signum: int) -> bool:
    """Send `signum` to process group `sid` and every process of session `sid`; whether any was there."""
    found = False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signum)
        found = True
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
            found = True
    return found


def stop_sessions(sids: list[int], grace_s: float) -> None:
    """SIGTERM every process of these sessions, then SIGKILL what is left after `grace_s`."""
    live = [sid for sid in sids if signal_session(sid, signal.SIGTERM)]
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        live = [sid for sid in live if session_members(sid)]
    for sid in live:
        signal_session(sid, signal.SIGKILL)


def stopped_document(document: dict[str, Any], message: str = STOPPED_MESSAGE) -> bool:
    """Record in `document` (status.json's content) that its executor is gone: Running becomes Failed `message`.

    Whether it changed: only a run that claims Running (or Pending) is settled.
    """
    status = document.get("status", {})
    if status.get("phase") not in (Phase.RUNNING, Phase.PENDING):
        return False
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status.update(phase=str(Phase.FAILED), message=message, finishedAt=stamp)
    for node in status.get("nodes", {}).values():
        if node.get("phase") == Phase.RUNNING:
            node.update(phase=str(Phase.FAILED), message=message, finishedAt=stamp)
        elif node.get("phase") == Phase.PENDING:
            node.update(phase=str(Phase.OMITTED), message=f"not run: {message}")
    return True


def mark_stopped(run_dir: str, message: str = STOPPED_MESSAGE) -> bool:
    """Rewrite status.json of a run whose executor is gone (stopped_document); whether it changed.

    Raises OSError when the folder cannot be written, leaving status.json as it was and no temporary file.
    """
    path = os.path.join(run_dir, "status.json")
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(document, dict) or not stopped_document(document, message):
        return False
    # The room the executor kept, where it left it: rewriting allocated bytes takes none from a disk that filled.
    spare = os.path.join(run_dir, SPARE_STATUS)
    tmp = spare if os.path.isfile(spare) else os.path.join(run_dir, ".status.json.watchdog")
    try:
        with open(tmp, "r+" if tmp == spare else "w", encoding="utf-8") as f:
            json.dump(document, f, separators=(",", ":"), ensure_ascii=False)
            f.truncate()
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def watch(run_dir: str, grace_s: float) -> None:
    """Follow the executor's notes on stdin until it finishes, or clean up after it."""
    live: dict[int, str] = {}
    pending = b""
    while True:
        try:
            chunk = os.read(0, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace").strip()
            if text == "exit":
                return
            if text.startswith("+"):
                pid, _, started = text[1:].partition(" ")
                live[int(pid)] = started
            elif text.startswith("-"):
                live.pop(int(text[1:]), None)
    stop_sessions(list(live), grace_s)
    with contextlib.suppress(OSError):  # a state folder that cannot be written: readers show the run Failed anyway
        mark_stopped(run_dir)


if __name__ == "__main__":
    for ignored in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are for the executor, not its cleaner
        signal.signal(ignored, signal.SIG_IGN)
    watch(sys.argv[1], float(sys.argv[2]))
