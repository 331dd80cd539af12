"""One writer per run: a lease file in the checkpoint root (docs/reliability.md CK7) and the run identity.

A second trainer pointed at the same checkpoint root (a duplicate submission, a retry racing a zombie pod) would
interleave checkpoints with the first. The lease is created with O_EXCL, so exactly one process holds it; the
holder refreshes its mtime from a thread (`kept_alive`). A lease is stale, and is taken over, when its holder is
a dead process (or a zombie) on this host, when its holder ran on a node known to be lost (eksflow.runtime.nodes
lists a node once every process on it was killed: the Ray head's, say, whose retry starts once the attempt's other
pods, the workers that wrote for it, are gone too), or when its heartbeat is older than `ttl_s` (a holder on
another host, e.g. a pod killed with SIGKILL). A trainer waits that long for a holder on another host it cannot
tell is dead (the rank 0 of an MPIJob whose node was lost dies without releasing it, and the retry runs in a new
pod); a live holder makes the newcomer fail with LeaseHeldError naming the holder.

The run identity (`RUN_FILE`) records which workflow run owns the root: a retry of that run resumes; another
run_name is refused instead of silently continuing someone else's checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eksflow.runtime.nodes import lost_nodes, this_node

LEASE_FILE = "LEASE"
RUN_FILE = "RUN"
DEFAULT_TTL_S = 120.0
HEARTBEAT_S = DEFAULT_TTL_S / 4


class LeaseHeldError(Exception):
    """Another live process holds the lease for this checkpoint root."""


class RunMismatchError(Exception):
    """The checkpoint root belongs to a different run."""


@dataclass(frozen=True)
class Lease:
    """A held lease: release it when training ends (also on preemption) so a retry need not wait for the TTL."""

    path: Path
    token: str

    def heartbeat(self) -> None:
        """Refresh the lease's mtime: the holder is alive."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path)

    @contextlib.contextmanager
    def kept_alive(self, interval_s: float = HEARTBEAT_S) -> Iterator[None]:
        """Heartbeat from a background thread while the body runs (Ray workers do not touch the driver's lease)."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(interval_s):
                self.heartbeat()

        thread = threading.Thread(target=beat, name="lease-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def release(self) -> None:
        """Delete the lease if it is still ours (a takeover after a long stall must not be undone)."""
        if _read(self.path).get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def acquire(root: Path, run_name: str, *, ttl_s: float = DEFAULT_TTL_S, wait_s: float = 0.0) -> Lease:
    """Take the lease for `root`, taking over a stale one; raise LeaseHeldError if a live writer holds it.

    A holder on another host may be alive or gone (a pod killed with its node, whose retry starts in a new pod):
    for up to `wait_s` the newcomer waits for it to release the lease or for its heartbeat to stop long enough.
    """
    root.mkdir(parents=True, exist_ok=True)
    path = root / LEASE_FILE
    token = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
    record = {
        "host": socket.gethostname(),
        "node": this_node(),
        "pid": os.getpid(),
        "run_name": run_name,
        "token": token,
    }
    until, waiting = time.monotonic() + wait_s, False
    takeovers = 0
    while takeovers < 3:  # a takeover races other newcomers: whoever wins O_EXCL holds it
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = _read(path)
            reason = _stale_reason(path, holder, ttl_s)
            if reason is None and holder.get("host") != socket.gethostname() and time.monotonic() < until:
                if not waiting:
                    print(
                        f"{path} is held by pid {holder.get('pid')} on {holder.get('host')}, which this host cannot "
                        f"check: waiting up to {wait_s:.0f} s for its release or for its heartbeat to stop",
                        flush=True,
                    )
                    waiting = True
                time.sleep(1.0)
                continue
            if reason is None:
                raise LeaseHeldError(
                    f"{path} is held by pid {holder.get('pid')} on {holder.get('host')} "
                    f"(run {holder.get('run_name')!r}); another trainer is writing these checkpoints. Stop it, or "
                    f"wait {ttl_s:.0f} s after it died for the lease to go stale"
                ) from None
            print(f"taking over stale lease {path}: {reason}")
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, root / f".{LEASE_FILE}.stale-{os.getpid()}")
                (root / f".{LEASE_FILE}.stale-{os.getpid()}").unlink()
            takeovers += 1
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        return Lease(path, token)
    raise LeaseHeldError(f"{path}: lost the takeover race three times; another trainer is starting on this run")


def claim_run(root: Path, run_name: str) -> None:
    """Record `run_name` as the owner of `root`, or raise RunMismatchError if another run owns it."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / RUN_FILE
    if path.is_file():
        owner = path.read_text(encoding="utf-8").strip()
        if owner != run_name:
            raise RunMismatchError(
                f"checkpoints in {root} belong to run {owner!r}, not {run_name!r}; a new run must not resume "
                f"another run's checkpoints: use a fresh --output-dir, or --run-name={owner} to resume that run"
            )
        return
    tmp = root / f".{RUN_FILE}.{os.getpid()}"
    tmp.write_text(run_name, encoding="utf-8")
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # mid-write by its creator, or gone: judged by age alone
    return data if isinstance(data, dict) else {}


def _stale_reason(path: Path, holder: dict[str, object], ttl_s: float) -> str | None:
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return "released meanwhile"
    pid = holder.get("pid")
    if holder.get("host") == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
        return f"holder pid {pid} on this host is dead"
    if holder.get("node") and holder.get("node") in lost_nodes():
        return f"holder pid {pid} on {holder.get('host')} ran on node {holder.get('node')}, which was lost with it"
    if age > ttl_s:
        return f"no heartbeat for {age:.0f} s (> {ttl_s:.0f} s)"
    return None


def _alive(pid: int) -> bool:
    """Whether `pid` runs on this host.

    A zombie does not: a killed trainer whose parent died first waits as one for a PID 1 that may never reap it
    (slurmd is PID 1 of a node's pod), and writes nothing any more.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return not Path("/proc/self/stat").exists()  # it ended meanwhile; without /proc (macOS) kill's answer holds
    return state != "Z"
