"""Stops a run's task processes when its executor dies, however it dies (SIGKILL included).

Run as a script by the executor (`python -I -S watchdog.py RUN_DIR GRACE_S`, in its own session so a terminal's
SIGHUP or a Ctrl-C to the executor's process group does not reach it), it reads the executor's notes on stdin:

    +PID START    a task process started (its own session and process group, both numbered PID)
    -PID          that process was reaped by the executor
    net FOLDER    the run's pod network (simulated nodes), recorded in FOLDER (pod_network.py's registry)
    exit          the executor finished normally: nothing to do

End of input without `exit` means the executor is gone. Each live task session then gets SIGTERM (to its process
group and to every process of its session, so grandchildren that changed group go too), SIGKILL after GRACE_S, the
pod network is removed (its namespaces with what runs in them, its bridge and veths, its record) unless a live
process owns it now, and status.json is rewritten: a Running run becomes Failed "executor stopped", as do its
Running nodes.

The kernel already sends each task's direct process SIGTERM when the executor thread that started it dies
(PR_SET_PDEATHSIG, set in process.py); the watchdog reaches the rest of the tree. It imports only the standard
library and phase.py (it runs without site-packages), and process.py, rundir.py and pod_network.py reuse its helpers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:
    from eksflow.local.phase import Phase
except ImportError:  # run as a script without site-packages: phase.py (the enum alone) sits beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from phase import Phase  # type: ignore[import-not-found,no-redef]

STOPPED_MESSAGE = "executor stopped"
NETNS = Path("/run/netns")  # where `ip netns` keeps the namespaces it names
_NETNS_KILL_WAIT_S = 5.0
_NETNS_DELETE_TRIES = 10
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


def started_at(pid: int) -> float | None:
    """When process `pid` started, in seconds since the epoch (/proc/PID/stat's start time after /proc/stat's btime)."""
    ticks = start_time(pid)
    if not ticks:
        return None
    with open("/proc/stat", encoding="ascii") as boot:
        booted = next(int(line.split()[1]) for line in boot if line.startswith("btime "))
    return booted + int(ticks) / os.sysconf("SC_CLK_TCK")


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


def netns_pids(netns: str) -> list[int]:
    """The processes inside network namespace `netns` (what `ip netns pids` lists)."""
    try:
        target = (NETNS / netns).stat().st_ino
    except OSError:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "ns" / "net").stat().st_ino == target:
                    pids.append(int(entry.name))
    return pids


def kill_netns(netns: str, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to every process in `netns`; for SIGKILL, until none is left (a node's loss, or its end)."""
    deadline = time.monotonic() + _NETNS_KILL_WAIT_S
    while pids := netns_pids(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if sig != signal.SIGKILL or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def delete_netns(netns: str) -> None:
    """Kill what is in `netns`, then remove it; retried while a dying pod's mount namespace still holds its file."""
    for _ in range(_NETNS_DELETE_TRIES):
        kill_netns(netns)
        if _ip("netns", "delete", netns) or not (NETNS / netns).exists():
            return
        time.sleep(0.2)


def remove_pod_network(folder: Path) -> None:
    """Remove the pod network recorded in `folder` (named after its tag): its pods, its bridge, then the record."""
    tag = folder.name
    for netns in sorted(NETNS.glob(f"ef{tag}-*")) if NETNS.is_dir() else []:
        delete_netns(netns.name)  # a pod's veth goes with its namespace
    _ip("link", "delete", f"efb{tag}")
    shutil.rmtree(folder, ignore_errors=True)


def owned_by_a_live_process(folder: Path) -> bool:
    """Whether the process a pod network's record names as its owner (`PID START`) still runs."""
    try:
        pid, _, started = (folder / "owner").read_text(encoding="utf-8").partition(" ")
        return bool(started.strip()) and alive(int(pid), started.strip())
    except (OSError, ValueError):
        return False  # a record cut short: its maker died while writing it


def _ip(*args: str) -> bool:
    """Run `ip ARGS`; whether it succeeded (what it said is of no use to a cleaner)."""
    try:
        return subprocess.run(["ip", *args], capture_output=True, check=False).returncode == 0
    except OSError:
        return False


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
    networks: list[Path] = []
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
            elif text.startswith("net "):
                networks.append(Path(text[4:]))
    stop_sessions(list(live), grace_s)
    for network in networks:  # a network handed over to a daemon (pod_network.hand_over) lives as long as it does
        if network.is_dir() and not owned_by_a_live_process(network):
            remove_pod_network(network)
    with contextlib.suppress(OSError):  # a state folder that cannot be written: readers show the run Failed anyway
        mark_stopped(run_dir)


if __name__ == "__main__":
    for ignored in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are for the executor, not its cleaner
        signal.signal(ignored, signal.SIG_IGN)
    watch(sys.argv[1], float(sys.argv[2]))
