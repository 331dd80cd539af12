"""A run's folder, and who owns it: the executor that runs it, alive or gone.

    state_dir/runs/<name>/
        manifest.yaml      the manifest as given, before substitution (what resume and retry re-read)
        status.json        Argo-like workflow status (status.py), rewritten atomically after every change
        owner.json         the executor running it: PID and start time, its watchdog, its live task processes
        owner.lock         held (flock) by that executor for as long as it runs: a second executor is refused
        .status.json.spare room that executor keeps allocated, and open, for the run's last status.json
        logs/<node>.log    combined stdout+stderr of every attempt of a node
        tasks/<node>/      outputs/ (output parameter files), progress ($ARGO_PROGRESS_FILE), bin/ (shims)
        volumes/<name>     emptyDir and other run-scoped volumes (PVCs live in state_dir/volumes/<claim>)

A run whose status says Running but whose executor is gone (killed, machine rebooted) reads as Failed "executor
stopped" (`read_settled`: computed, never written, so `list`, `get` and `logs` work on a read-only or full state
folder); the watchdog, or the next executor of the run (`settle`), records it. Task processes it left behind are
found by their recorded PIDs and start times.

Every write goes to a temporary sibling first and is renamed over the file, so a reader never sees half of one; a
write that fails (a full disk, a read-only folder) removes its temporary file and raises StateWriteError (`writing`):
one line naming the file, the cause and the fix. The run then ends Failed with that line, and its last status.json,
with every task as the run printed it, is written through the spare room (a disk that filled has none left; and
while the spare is open for writing, the kernel refuses to remount its file system read-only). Without it, `get`
would show the task that ended last as Failed "executor stopped".
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO

import yaml

from eksflow.local.errors import LocalExecutorError, StateWriteError
from eksflow.local.status import file_name, load_document, now
from eksflow.local.watchdog import (
    SPARE_STATUS,
    STOPPED_MESSAGE,
    alive,
    mark_stopped,
    session_members,
    start_time,
    stopped_document,
)

try:
    import fcntl
except ImportError:  # not POSIX: no lock, the owner's PID alone tells
    fcntl = None  # type: ignore[assignment]

# libyaml's safe dumper and loader where PyYAML has them: the flagship's manifest is large, and pure Python is slow.
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_LOCK_RETRY_S = 0.5  # a reader checking the lock holds it for microseconds; an executor retries that long
SPARE_MIN_BYTES = 64 * 1024  # the least room kept for the last status.json; twice its size once it is larger


@dataclass
class Owner:
    """The executor of a run, as owner.json records it."""

    pid: int
    start: str  # /proc start time of the executor: with the PID, it names one process
    started_at: str
    watchdog: int | None = None
    processes: dict[int, tuple[str, str]] = field(default_factory=dict)  # task PID -> (node key, start time)

    @property
    def alive(self) -> bool:
        """Whether the executor process still runs."""
        return alive(self.pid, self.start)

    def orphans(self) -> dict[int, str]:
        """Task sessions (leader PID -> node key) with processes still running although their executor is gone.

        A leader that ended may have left children in its session (a Ray worker, a server); Linux does not reuse
        a PID while it still numbers a session, so live members of session PID are that task's.
        """
        return {
            pid: key for pid, (key, started) in self.processes.items() if alive(pid, started) or session_members(pid)
        }


def owner_document(owner: Owner) -> dict[str, Any]:
    """owner.json's content."""
    return {
        "pid": owner.pid,
        "startTime": owner.start,
        "startedAt": owner.started_at,
        "watchdogPid": owner.watchdog,
        "processes": {str(pid): {"node": key, "startTime": s} for pid, (key, s) in owner.processes.items()},
    }


class RunFolder:
    """The files of one run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        self.manifest = path / "manifest.yaml"
        self.config = path / "config.json"  # the pipeline config the manifest was built from, when the CLI gave it
        self.status = path / "status.json"
        self.owner = path / "owner.json"
        self.lock_path = path / "owner.lock"
        self.logs = path / "logs"
        self.tasks = path / "tasks"
        self.volumes = path / "volumes"
        self.spare = path / SPARE_STATUS
        self._lock: IO[str] | None = None
        self._spare: int | None = None  # the open spare file, its bytes allocated
        self._spare_bytes = 0

    def make(self) -> None:
        """Create the folder and its subfolders; StateWriteError if the state folder cannot be written."""
        with writing(self.path):
            for sub in (self.logs, self.tasks, self.volumes):
                sub.mkdir(parents=True, exist_ok=True)

    def log(self, key: str) -> Path:
        """The log file of node `key`."""
        return self.logs / f"{file_name(key)}.log"

    def task_dir(self, key: str) -> Path:
        """The scratch folder of node `key` (outputs, progress, shims)."""
        return self.tasks / file_name(key)

    def open_log(self, key: str, header: str) -> BinaryIO:
        """Node `key`'s log, opened for appending, `header` written; StateWriteError if it cannot be written."""
        path = self.log(key)
        with writing(path):
            log = open(path, "ab")  # noqa: SIM115 (the caller closes it once the attempt has ended)
            try:
                log.write(header.encode())
                log.flush()
            except OSError:
                log.close()
                raise
        return log

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Keep the manifest as given."""
        atomic_write(self.manifest, yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, allow_unicode=True))

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Keep the config the manifest was built from: a resume with other settings names the keys that differ."""
        atomic_write(self.config, json.dumps(config, sort_keys=True))

    def read_config(self) -> dict[str, Any] | None:
        """The recorded config, or None (a run started without one, or before configs were recorded)."""
        try:
            loaded = json.loads(self.config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def read(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The saved manifest and status.json; LocalExecutorError if the folder is not a run's."""
        try:
            manifest = yaml.load(self.manifest.read_text(encoding="utf-8"), Loader=_Loader)  # safe: no Python objects
            status = load_document(self.status)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise LocalExecutorError(
                f"{self.path} is not a readable run folder (manifest.yaml, status.json): {exc}"
            ) from None
        if not isinstance(manifest, dict):
            raise LocalExecutorError(f"{self.manifest} does not hold a Workflow manifest")
        return manifest, status

    def write_document(self, path: Path, document: dict[str, Any]) -> None:
        """Replace status.json or owner.json atomically: a reader never sees half of it.

        After each status.json, the room kept for the last one (`reserve`) grows to twice its size.
        """
        text = compact_json(document)
        atomic_write(path, text)
        if path == self.status:
            self.reserve(max(SPARE_MIN_BYTES, 2 * len(text.encode())))

    def write_status(self, document: dict[str, Any]) -> None:
        """Replace status.json atomically (write_document)."""
        self.write_document(self.status, document)

    def reserve(self, size: int) -> None:
        """Keep `size` bytes allocated on the state folder's disk for the run's last status.json (write_last_status).

        A disk that fills during a run (a task's checkpoints, another process) leaves no room for a new status.json,
        and a reader would take the run's stale one for an executor that died. Best effort: where the bytes cannot
        be allocated, the disk is full already and the next write that needs room says so.
        """
        if size <= self._spare_bytes:
            return
        with contextlib.suppress(OSError):
            if self._spare is None:
                self._spare = os.open(self.spare, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            os.posix_fallocate(self._spare, 0, size)
            self._spare_bytes = size

    def write_last_status(self, document: dict[str, Any]) -> bool:
        """Write status.json through the room `reserve` kept, once a write that needed new room failed; whether it did.

        The spare file's allocated bytes are rewritten (no room taken from the disk) and renamed over status.json,
        so a reader still never sees half of it. Used once: the spare file is gone after.
        """
        text = compact_json(document).encode()
        spare, self._spare, size, self._spare_bytes = self._spare, None, self._spare_bytes, 0
        if spare is None:
            return False
        try:
            if len(text) > size:
                return False
            written = 0
            while written < len(text):
                written += os.pwrite(spare, text[written:], written)
            os.ftruncate(spare, len(text))
            os.replace(self.spare, self.status)
            return True
        except OSError:
            return False
        finally:
            os.close(spare)
            with contextlib.suppress(OSError):
                self.spare.unlink(missing_ok=True)

    # -- ownership -------------------------------------------------------------------------------------------

    def claim(self, watchdog: int | None) -> Owner:
        """Become the run's executor: refused (one line) while another executor holds it, or if it cannot be written."""
        if fcntl is not None:
            with writing(self.lock_path):
                handle = open(self.lock_path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
            deadline = time.monotonic() + _LOCK_RETRY_S
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        handle.close()
                        raise LocalExecutorError(self.busy_message()) from None
                    time.sleep(0.05)
            self._lock = handle
        else:
            owner = self.read_owner()
            if owner is not None and owner.alive and owner.pid != os.getpid():
                raise LocalExecutorError(self.busy_message())
        owner = Owner(os.getpid(), start_time(os.getpid()) or "", now(), watchdog)
        self.write_owner(owner)
        return owner

    def busy_message(self) -> str:
        """One line: another executor holds this run."""
        owner = self.read_owner()
        who = f" (executor PID {owner.pid})" if owner is not None else ""
        return (
            f"run {self.name!r} is still being run by another executor{who}; wait for it, or stop it "
            "(Ctrl-C, or kill that PID) and resume again"
        )

    def release(self) -> None:
        """Stop being the run's executor: its lock, and the room kept for a last status.json, are let go."""
        if self._spare is not None:
            os.close(self._spare)
            self._spare, self._spare_bytes = None, 0
            with contextlib.suppress(OSError):
                self.spare.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def held(self) -> bool:
        """Whether an executor (this process or another) currently holds the run."""
        if self._lock is not None:
            return True
        if fcntl is None:
            owner = self.read_owner()
            return owner is not None and owner.alive
        try:
            with open(self.lock_path, encoding="utf-8") as handle:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except FileNotFoundError:
            owner = self.read_owner()  # a run folder from before owner.lock existed
            return owner is not None and owner.alive
        except BlockingIOError:
            return True
        return False

    def write_owner(self, owner: Owner) -> None:
        """Record the owner and its live task processes."""
        self.write_document(self.owner, owner_document(owner))

    def read_owner(self) -> Owner | None:
        """The recorded owner, or None for a folder without one."""
        try:
            raw = load_document(self.owner)
        except (OSError, ValueError):
            return None
        processes = {int(pid): (p["node"], p.get("startTime", "")) for pid, p in raw.get("processes", {}).items()}
        return Owner(
            int(raw["pid"]), raw.get("startTime", ""), raw.get("startedAt", ""), raw.get("watchdogPid"), processes
        )

    def settle(self) -> dict[int, str]:
        """If the run claims to be Running but its executor is gone, record it as Failed "executor stopped".

        For the run's next executor (resume, retry): StateWriteError if the folder cannot be written. Returns the
        task processes (PID -> node key) the dead executor left running, for the caller to stop or report; empty
        when the run is owned by a live executor or ended cleanly.
        """
        if self.held():
            return {}
        with writing(self.status):
            mark_stopped(str(self.path), STOPPED_MESSAGE)
        return self._orphans()

    def read_settled(self) -> tuple[dict[str, Any], dict[str, Any], dict[int, str]]:
        """What a reader sees: the manifest, status.json, and the task processes a dead executor left running.

        A run whose executor is gone reads as settle() would record it, but nothing is written: reading works on a
        read-only or full state folder. LocalExecutorError if the folder is not a run's.
        """
        held = self.held()  # first: an executor that ended wrote its last status.json before it let go
        manifest, document = self.read()
        if held or not stopped_document(document, STOPPED_MESSAGE):
            return manifest, document, {}
        return manifest, document, self._orphans()

    def _orphans(self) -> dict[int, str]:
        owner = self.read_owner()
        return {} if owner is None else owner.orphans()


class LatestWriter:
    """Writes the latest document given for each file, on a thread of its own, so no task waits for the disk.

    status.json changes with every phase change; writing it under the run's lock put a file write (milliseconds
    on a busy machine) on the path of every task. Here each change hands over a finished document (built under the
    lock, so it is consistent) and returns; the writer thread has `write` replace the file, skipping documents
    that a newer one for the same file has already replaced. `flush` waits until the latest ones are on disk. A
    write that fails leaves the file as it was and goes to `on_error`; later documents are still tried.
    """

    def __init__(
        self, write: Callable[[Path, dict[str, Any]], None], on_error: Callable[[StateWriteError], None]
    ) -> None:
        self._write = write
        self._on_error = on_error
        self._cond = threading.Condition()
        self._latest: dict[Path, dict[str, Any]] = {}
        self._submitted = 0
        self._written = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="run-folder-writer", daemon=True)
        self._thread.start()

    def submit(self, path: Path, document: dict[str, Any]) -> None:
        """Have `document` written to `path` (unless a newer one for `path` comes first)."""
        with self._cond:
            self._latest[path] = document
            self._submitted += 1
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._latest and not self._closed:
                    self._cond.wait()
                if not self._latest:
                    return
                documents, number, self._latest = self._latest, self._submitted, {}
            try:
                for path, document in documents.items():
                    try:
                        self._write(path, document)
                    except StateWriteError as exc:
                        self._on_error(exc)
            finally:
                with self._cond:
                    self._written = number
                    self._cond.notify_all()

    def flush(self) -> None:
        """Wait until the latest documents submitted are on disk."""
        with self._cond:
            while self._written < self._submitted and self._thread.is_alive():
                self._cond.wait(1.0)

    def close(self) -> None:
        """Flush, then stop the writer thread."""
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()


def compact_json(document: dict[str, Any]) -> str:
    """JSON without whitespace: json's C encoder (an indented dump takes the pure-Python one, 4x slower)."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename; StateWriteError, no temporary file left, if not."""
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path):
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Writes to the state folder inside: an OSError becomes StateWriteError, one line naming the file and the fix."""
    try:
        yield
    except OSError as exc:
        raise StateWriteError(state_problem(exc, path)) from None


def state_problem(exc: OSError, path: Path) -> str:
    """One line: the file of the state folder that could not be written, why, and what to do."""
    failed = Path(os.fsdecode(exc.filename)) if exc.filename else path
    # A temporary sibling (`.status.json.tmp`) means its file; a folder `mkdir` could not make is named as it is.
    where = path if failed.parent == path.parent and failed.name.startswith(f".{path.name}.") else failed
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space on its disk, or use another state folder (--state-dir, EKSFLOW_STATE_DIR)"
    else:
        fix = "use a state folder this user can write (--state-dir, EKSFLOW_STATE_DIR)"
    return f"cannot write the state folder: {where}: {exc.strerror or type(exc).__name__}; {fix}"
