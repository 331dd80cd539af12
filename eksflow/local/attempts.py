"""The attempts of a run's pods: each placed on the node, run by its template kind's handler, retried as it says.

A pod gets a thread of its own (`start`). Each attempt waits for room on the node (node.py: Pending with the reason
until then), runs through the handler of its template's kind (handlers.py) with the run's services, simulated nodes
and supervised processes (process.py), and is retried per the template's retryStrategy (retry.py) until it succeeds,
runs out of retries or the run stops. The pod's last attempt is its result in the book (book.py); a succeeded
memoized pod's outputs are saved. A container's output goes to the task's log in the run folder (rundir.py), and
its progress file is where ARGO_PROGRESS_FILE points.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from eksflow.local import process
from eksflow.local.book import NodeBook
from eksflow.local.errors import StateWriteError
from eksflow.local.handlers import NodesContext, TaskContext, handler_for
from eksflow.local.model import ContainerTemplate, Mount
from eksflow.local.node import Node, Ticket, template_requests
from eksflow.local.phase import Phase
from eksflow.local.process import ProcessTracker
from eksflow.local.retry import Attempt, next_delay
from eksflow.local.rundir import RunFolder, writing
from eksflow.local.scheduler import Unit
from eksflow.local.services import RunServices
from eksflow.local.sim_nodes import SimulatedCluster
from eksflow.local.status import now, short
from eksflow.local.substitution import Scope
from eksflow.local.trainer_status_server import read_status
from eksflow.runtime.readable import format_duration, log_tail
from eksflow.runtime.rundir import RUN_DIR_ENV


@dataclass
class PodRunner:
    """Runs the pods of one run, a thread each, in its folder, on its node and simulated nodes."""

    book: NodeBook
    node: Node
    folder: RunFolder
    state_dir: Path
    cwd: Path  # where task processes start
    base_env: Mapping[str, str]
    tracker: ProcessTracker
    services: RunServices
    cluster: SimulatedCluster | None
    stop_reason: Callable[[], str]  # why the run is stopping ("" while it is not)
    wait_stop: Callable[[float], bool]  # wait up to that many seconds for the run to stop; whether it did
    state_failed: Callable[[StateWriteError], None]  # the state folder could not be written: the run stops
    save_memo: Callable[[Unit], None]  # a succeeded pod's outputs, for its template's memoize cache
    threads: dict[str, threading.Thread] = field(default_factory=dict)  # each started pod's, by node key

    def join(self, timeout_s: float) -> None:
        """Wait for every pod's thread (each up to `timeout_s`)."""
        for thread in list(self.threads.values()):
            thread.join(timeout_s)

    def poll_progress(self) -> None:
        """Show each running pod's progress file (ARGO_PROGRESS_FILE) and its TrainJob's trainerStatus in its node."""
        changed = False
        for key, node in list(self.book.nodes.items()):
            if node.phase is not Phase.RUNNING or key not in self.threads:
                continue
            changed = self._take_trainer_status(key) or changed
            with contextlib.suppress(OSError):
                value = (self.folder.task_dir(key) / "progress").read_text(encoding="utf-8", errors="replace")
                value = value.strip()[:40]
                if value and value != node.progress:
                    node.progress = value
                    changed = True
        if changed:
            self.book.touch()

    def _take_trainer_status(self, key: str) -> bool:
        """Put the latest trainerStatus of node `key`'s TrainJob in the node; whether it changed."""
        reported = read_status(self.folder.task_dir(key))
        with self.book.lock:
            node = self.book[key]
            if reported is None or reported == node.trainer_status:
                return False
            node.trainer_status = reported
        return True

    def start(self, unit: Unit) -> None:
        """Create the pod: Pending until the node has room for it (the pass's `node.schedule` decides)."""
        ticket = self._ask_node(unit, 0)
        self.book.set(
            unit.key, Phase.PENDING, "", retries=0, exit_code=None, outputs={}, progress=None, finished_at=None,
            started_at=now(),
        )  # fmt: skip
        thread = threading.Thread(target=self._pod_thread, args=(unit, ticket), name=f"task-{unit.key}", daemon=True)
        self.threads[unit.key] = thread
        thread.start()

    def _ask_node(self, unit: Unit, attempt: int) -> Ticket:
        asked, lasting = template_requests(unit.template, Scope(unit.values, unit.inputs, retries=attempt))
        return self.node.request(unit.key, asked, lasting=lasting)

    def _placed(self, key: str, ticket: Ticket) -> bool:
        """Wait until the node has room for `ticket`'s pod, shown Pending with the reason; False if the run stops."""
        if not self.node.wait(ticket, self.stop_reason, lambda reason: self.book.set(key, Phase.PENDING, reason)):
            return False
        self.book.set(key, Phase.RUNNING, ticket.reason)
        return True

    def _pod_thread(self, unit: Unit, ticket: Ticket) -> None:
        try:
            result = self._attempts(unit, ticket)
        except StateWriteError as exc:  # its log or folder: the run cannot keep its state, so it stops
            self.state_failed(exc)
            result = Attempt(Phase.ERROR, None, str(exc), 0.0)
        except Exception as exc:  # a bug here must end the node, or the scheduler would wait for it forever
            result = Attempt(Phase.ERROR, None, f"local executor error: {exc!r}", 0.0)
        self._take_trainer_status(unit.key)  # the last report, sent as the pods ended
        self.book.set(unit.key, result.phase, result.message, exit_code=result.exit_code, outputs=result.outputs)
        if result.phase is Phase.SUCCEEDED:
            try:
                self.save_memo(unit)
            except StateWriteError as exc:
                self.state_failed(exc)

    def _attempts(self, unit: Unit, ticket: Ticket) -> Attempt:
        """Every attempt of a pod, each placed on the node first, retried per its retryStrategy."""
        template = unit.template
        handler = handler_for(template)
        task_dir = self.folder.task_dir(unit.key)
        with writing(task_dir):
            task_dir.mkdir(parents=True, exist_ok=True)
        first_start = time.monotonic()
        attempt = 0
        while True:
            scope = Scope(unit.values, unit.inputs, retries=attempt)
            ctx = TaskContext(
                key=unit.key,
                attempt=attempt,
                scope=scope,
                task_dir=task_dir,
                host_folder=self._host_folder,
                env=self.base_env,
                execute=functools.partial(self._execute, unit.key, attempt),
                services=self.services,
                stop_reason=self.stop_reason,
                nodes=self._nodes_context(unit.key),
                spawn=self._spawner(unit.key),
                reap=lambda proc: process.end(proc, self.tracker),
            )
            with writing(task_dir):
                (task_dir / "progress").unlink(missing_ok=True)
            if attempt:
                ticket = self._ask_node(unit, attempt)
                self.book.wake()
            if not self._placed(unit.key, ticket):
                return Attempt(Phase.FAILED, None, f"not started: {self.stop_reason()}", 0.0)
            if self.cluster is not None and isinstance(template, ContainerTemplate):
                with self.book.lock:  # beside the simulated nodes, a container task runs on this machine itself
                    self.book[unit.key].host_node = socket.gethostname()
            result = handler.run(template, ctx)
            if not (ticket.lasting and result.phase is Phase.SUCCEEDED):
                self.node.release(ticket)  # a Deployment's pod that runs keeps its share until the run ends
            if result.phase is Phase.SUCCEEDED or self.stop_reason():
                return result
            delay, why_not = next_delay(template.retry, attempt, result, first_start, scope)
            if delay is None:
                result.message += why_not
                return result
            attempt += 1
            limit = template.retry.limit if template.retry else 0
            message = f"{result.message}; retry {attempt}/{limit} in {format_duration(delay)}"
            self.book.set(unit.key, Phase.RUNNING, message, retries=attempt, exit_code=result.exit_code)
            if self.wait_stop(delay):
                result.message += f"; not retried: {self.stop_reason()}"
                return result

    def _spawner(self, key: str) -> Callable[[list[str], Mapping[str, str], IO[bytes]], subprocess.Popen[bytes]]:
        """How a task starts a process of its own beside its main one, supervised like it (process.start)."""
        cwd = self.cwd

        def spawn(argv: list[str], env: Mapping[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
            return process.start(argv, key=key, cwd=cwd, env=env, log=log, tracker=self.tracker)

        return spawn

    def _nodes_context(self, key: str) -> NodesContext | None:
        """How a task's object starts pods on the simulated nodes; None without them."""
        if self.cluster is None:
            return None

        def pending(reason: str) -> None:
            self.book.set(key, Phase.PENDING if reason else Phase.RUNNING, reason)

        def pods_changed(pods: list[dict[str, str]]) -> None:
            with self.book.lock:
                node = self.book[key]
                node.pods = pods or node.pods  # the last pods stay listed once the job has ended
                # the pod running the job's own process: a RayJob's head, an MPIJob's launcher, a TrainJob's node 0
                main = (p["hostNodeName"] for p in node.pods if p["role"] in ("head", "launcher", "node"))
                node.host_node = next(main, node.host_node)
            self.book.touch()

        return NodesContext(
            self.cluster, self._spawner(key), lambda proc: process.end(proc, self.tracker), pods_changed, pending
        )

    def _host_folder(self, mount: Mount) -> str:
        host = mount.host_folder(self.state_dir, self.folder.volumes)
        with writing(host):
            host.mkdir(parents=True, exist_ok=True)
        return str(host)

    def _execute(self, key: str, attempt: int, argv: list[str], env: dict[str, str], deadline: float | None) -> Attempt:
        log_path = self.folder.log(key)
        with self.book.lock:
            self.book[key].log = log_path
        full_env = {
            **self.base_env,
            **env,
            "ARGO_PROGRESS_FILE": str(self.folder.task_dir(key) / "progress"),
            "PYTHONUNBUFFERED": "1",
            RUN_DIR_ENV: str(self.folder.path),  # manifest.yaml and status.json: what a report task reads
        }
        with self.folder.open_log(key, f"===== {key}: attempt {attempt + 1}, {now()} =====\n") as log:
            try:
                ended = process.run(
                    argv,
                    key=key,
                    cwd=self.cwd,
                    env=full_env,
                    log=log,
                    tracker=self.tracker,
                    stop_reason=self.stop_reason,
                    deadline_s=deadline,
                )
            except OSError as exc:
                return Attempt(Phase.ERROR, None, f"cannot start {argv[0]!r}: {exc}", 0.0)
        if ended.stopped_for:
            return Attempt(Phase.FAILED, ended.exit_code, ended.stopped_for, ended.duration_s)
        if ended.exit_code == 0:
            return Attempt(Phase.SUCCEEDED, 0, "", ended.duration_s)
        last = next((line.strip() for line in reversed(log_tail(log_path, 5)) if line.strip()), "")
        last = "" if last.startswith("=====") else last
        message = f"exit code {ended.exit_code}" + (f": {short(last)}" if last else "")
        return Attempt(Phase.FAILED, ended.exit_code, message, ended.duration_s)
