"""Who may run a serving fleet here: one run per pipeline and state folder, and one run's vLLM engines per machine.

Two runs at once in one project broke each other's rollout, naming no cause: the second run's proxy removed the
routes file they share and routed the public name to its own engine, and the first failed its canary
(`error_rate = 1.0000`); two engines also started on 2 cores, where one engine per machine was checked within a run
only. So a run's fleet holds two locks, each a file it keeps locked (flock) while the run lasts:

- its pipeline's fleet in its state folder (<state>/fleets/<pipeline>.lock), from the first object of the fleet the
  run applies: the routes file, the proxy and the public name are the pipeline's, in that folder;
- this machine's local vLLM engines (local-vllm.lock in the engines' cache, which every project of the user's on the
  machine shares), from the start of the run's first engine on 127.0.0.1, once for all its engines (how many one run
  may run: engine_ports.py): pods on simulated nodes stand for other machines, and an adopted engine
  ($EKSFLOW_VLLM_URL) runs already.

A run that finds one held waits for it (after its own first tasks, which need no fleet), saying once which run holds
it: its name, state folder and pid, which the holder writes into the file. Stopping the run stops the wait. The
kernel releases a lock when the process holding it ends, even by SIGKILL, so none is ever left behind.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eksflow.llm import engines
from eksflow.llm.serving.fleet_pods import FleetError
from eksflow.names import PIPELINE_LABEL

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: one fleet at a time is then the user's to keep
    fcntl = None  # type: ignore[assignment]

ENGINE_LOCK = "local-vllm.lock"
_POLL_S = 1.0  # how often a waiting run tries the lock again


class FleetLocks:
    """The locks one run's fleet holds: each taken once, by whichever task of the run gets there first."""

    def __init__(self, state_dir: Path, run_dir: Path, say: Callable[[str], None]) -> None:
        self._state_dir = state_dir
        self._holder = f"run {run_dir.name} (pid {os.getpid()}, state folder {state_dir})"
        self._say = say
        self._held: dict[Path, int] = {}  # lock file -> its open descriptor
        self._taking = threading.Lock()  # a second task of this run waits for the first's wait, not on itself

    def fleet(self, manifest: Mapping[str, Any], where: str, stop_reason: Callable[[], str]) -> None:
        """Hold the fleet of the object's pipeline in this state folder (waited for while another run holds it)."""
        labels = (manifest.get("metadata") or {}).get("labels") or {}
        pipeline = str(labels.get(PIPELINE_LABEL) or (manifest.get("metadata") or {}).get("name") or "fleet")
        name = re.sub(r"[^A-Za-z0-9._-]", "_", pipeline)[:100]
        self._take(
            self._state_dir / "fleets" / f"{name}.lock", f"the serving fleet of {pipeline} here", where, stop_reason
        )

    def engine(self, where: str, stop_reason: Callable[[], str]) -> None:
        """Hold this machine's local vLLM engines for the run (waited for while another run's engines run)."""
        self._take(engines.cache_dir() / ENGINE_LOCK, "this machine's local vLLM engines", where, stop_reason)

    def release(self) -> None:
        """Let the next run take what this one held."""
        with self._taking:
            for fd in self._held.values():
                os.close(fd)
            self._held.clear()

    def _take(self, path: Path, what: str, where: str, stop_reason: Callable[[], str]) -> None:
        with self._taking:
            if path in self._held or fcntl is None:
                return
            try:
                path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as err:
                raise FleetError(f"{where}: cannot open {path} ({err.strerror}), which keeps {what}") from None
            told = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                if not told:
                    holder = os.pread(fd, 400, 0).decode("utf-8", errors="replace").strip() or "another run"
                    self._say(f"{where}: waits for {holder} to end: it holds {what} ({path})")
                    told = True
                if why := stop_reason():
                    os.close(fd)
                    raise FleetError(f"{where}: {why} while waiting for {what}")
                time.sleep(_POLL_S)
            os.ftruncate(fd, 0)
            os.pwrite(fd, self._holder.encode(), 0)
            self._held[path] = fd
