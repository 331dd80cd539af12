"""Run a compiled Argo Workflow manifest on this machine, task by task, as local processes.

The manifest is exactly what `render` prints and `submit` sends; manifest.py checks it against the supported subset
before anything runs. This module drives a run: it claims the run folder (rundir.py), starts the watchdog that
cleans up if this process dies (watchdog.py), lets the scheduler (scheduler.py) walk the DAGs, runs each pod's
attempts on a thread (attempts.py: the handler of its template kind, retries, supervised processes), keeps
status.json current (book.py, status.py) and shows the live table (display.py). A run's services (services.py:
what objects of a registered kind run as, e.g. a model server's Deployment) keep their processes until the run
ends: stopped after the exit handler, or when the run is stopped or fails.

Ctrl-C, SIGTERM and SIGHUP all stop a run the same way: running tasks get SIGTERM (SIGKILL after the grace),
status.json records Failed "interrupted", and RunInterrupted is raised carrying the signal (exit 128 + signal).

A state folder that cannot be written (read-only, full, no permission) refuses a run before anything starts
(StateWriteError; a new run's folder is removed). One that fails during the run (status.json, owner.json, a log, a
task's folder, a memoization entry) stops it the same way, in one line: its tasks are stopped, its exit handler is
not started (its work would need the same folder; a resume runs it), and it ends Failed with that line. What is on
disk stays whole: every file is the last version written in full, and no temporary file is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from eksflow.local import services
from eksflow.local.ahead import tasks_ahead
from eksflow.local.attempts import PodRunner
from eksflow.local.book import NodeBook
from eksflow.local.display import TaskDisplay
from eksflow.local.errors import LocalExecutorError, RunInterrupted, StateWriteError
from eksflow.local.manifest import dag_inputs, effective_parameters, new_run_name, parse_manifest, plain_manifest
from eksflow.local.memo import MemoCache
from eksflow.local.model import DagTemplate, Workflow
from eksflow.local.node import Node, Requests, machine
from eksflow.local.phase import Phase
from eksflow.local.process import KILL_GRACE_S, ProcessTracker, Watchdog
from eksflow.local.rundir import LatestWriter, RunFolder, owner_document
from eksflow.local.scheduler import DagRun, Scheduler, Unit
from eksflow.local.services import RunServices
from eksflow.local.sim_nodes import SimulatedCluster
from eksflow.local.status import NAMESPACE, NodeStatus, RunResult, now, run_document, short
from eksflow.local.substitution import Scope

__all__ = ["KILL_GRACE_S", "RunSettings", "execute_run", "parse_manifest", "run_workflow"]


INTERRUPTED = "interrupted"
_TICK_S = 0.5  # how often the scheduler looks around when nothing told it to (progress files, deadlines)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class RunSettings:
    """How to run: where task processes start, with what environment, shown where, memoization on or off."""

    cwd: Path
    env: Mapping[str, str]
    console: Console | None
    memoize: bool = True
    node: Requests | None = None  # the size of the node pods are placed on; None: this machine (node.py)
    nodes: int = 1  # simulated nodes for distributed jobs' pods (sim_nodes.py); 1: this machine alone


class _Run:
    """One execution of a workflow in its folder (a first run, a resume or a retry)."""

    def __init__(
        self,
        workflow: Workflow,
        folder: RunFolder,
        state_dir: Path,
        *,
        name: str,
        uid: str,
        parameters: dict[str, str],
        kept: dict[str, NodeStatus],
        settings: RunSettings,
        started_at: str,
        overrides: list[dict[str, Any]],
        preparing: list[services.Preparing],
    ) -> None:
        self.wf = workflow
        self.folder = folder
        self.state_dir = state_dir
        self.name = name
        self.uid = uid
        self.parameters = parameters
        self.settings = settings
        self.started_at = started_at
        self.overrides = overrides
        self.preparing = preparing  # what services make beside the first tasks (engines): a failure stops the run
        self.phase = Phase.RUNNING
        self.message = ""
        self.outcome: tuple[Phase, str] = (Phase.RUNNING, "")  # the workflow's phase and message once it has ended
        self.finished_at: str | None = None
        self.abort = threading.Event()
        self.abort_reason = ""
        self.signalled: int | None = None
        self.state_error: str | None = None  # why the state folder could not be written, once it could not
        self.base_env = {**os.environ, **settings.env}
        self.values = {"name": name, "uid": uid, "namespace": NAMESPACE}
        self.values |= {f"parameters.{k}": v for k, v in parameters.items()}
        self.display = TaskDisplay(settings.console, lambda: list(self.book.nodes.values()))
        self.book = NodeBook(kept, on_change=self._changed)
        self.node = Node(
            settings.node or machine(),
            on_release=self.book.wake,
            ahead=lambda key: tasks_ahead(self.scheduler.runs(), key, workflow.templates),
        )
        self.owner = folder.claim(None)
        folder.write_status(self.status_document())  # before anything starts: a folder it cannot write refuses it
        # status.json and owner.json, off the tasks' path
        self.writer = LatestWriter(folder.write_document, self._state_failed)
        self.watchdog = Watchdog()
        self.tracker = ProcessTracker(self._process_started, self.watchdog.tell)
        self.services = RunServices(state_dir, folder.path, settings.cwd, self.tracker)  # nothing starts yet
        self.cluster = (
            SimulatedCluster(settings.nodes, machine(), folder.path / "spot-notices") if settings.nodes > 1 else None
        )
        self.pods = PodRunner(
            self.book, self.node, folder, state_dir, settings.cwd, self.base_env, self.tracker, self.services,
            self.cluster, self.stop_reason, self._wait_stop, self._state_failed, self._save_memo,
        )  # fmt: skip
        self.scheduler = Scheduler(
            workflow,
            self.book,
            values=self.values,
            memo=MemoCache(state_dir / "memoize", read=settings.memoize),
            start_pod=self.pods.start,
            stop_reason=self.stop_reason,
        )

    # -- status ----------------------------------------------------------------------------------------------

    def _changed(self, node: NodeStatus | None) -> None:
        """Called under the book's lock after every change: status.json and the display follow."""
        self.write_status()
        if node is not None and (node.phase is not Phase.PENDING or node.message):  # a Pending one's reason
            self.display.phase_changed(node)

    def status_document(self) -> dict[str, Any]:
        """status.json's content now."""
        return run_document(
            name=self.name,
            uid=self.uid,
            labels=self.wf.labels,
            parameters=self.parameters,
            phase=self.phase,
            started_at=self.started_at,
            finished_at=self.finished_at,
            message=self.message,
            nodes=self.book.nodes.values(),
            overrides=self.overrides,
        )

    def write_status(self) -> None:
        self.writer.submit(self.folder.status, self.status_document())

    def _process_started(self, note: str) -> None:
        """Record a new task process in owner.json too (while it starts up, off the scheduler's path).

        Ended processes are not written out at once: a stale entry is harmless (readers check that a recorded PID
        still runs, with its start time), and the next start or the run's end rewrites the list.
        """
        self.watchdog.tell(note)
        self.owner.processes = dict(self.tracker.live)
        self.writer.submit(self.folder.owner, owner_document(self.owner))

    # -- stopping --------------------------------------------------------------------------------------------

    def stop_reason(self) -> str:
        """Why the run is stopping ("" while it is not)."""
        return self.abort_reason if self.abort.is_set() else ""

    def _wait_stop(self, delay_s: float) -> bool:
        """Wait up to `delay_s` for the run to stop (the exit handler gets a fresh stop event); whether it did."""
        return self.abort.wait(delay_s)

    def _save_memo(self, unit: Unit) -> None:
        self.scheduler.save_memo(unit)  # the scheduler is made after the pods' runner, which it starts pods with

    def stop(self, reason: str) -> None:
        """Stop the run: running tasks are killed (they end Failed with `reason`) and nothing new starts."""
        if not self.abort.is_set():
            self.abort_reason = reason
            self.abort.set()

    def _preparing_failed(self) -> str:
        """Why what services make beside the entrypoint's tasks failed ("" while it has not, or no longer matters)."""
        if self.outcome[0] is not Phase.RUNNING or self.abort.is_set():  # the exit handler, or stopping already
            return ""
        return next(filter(None, (preparing.failure() for preparing in self.preparing)), "")

    def _state_failed(self, error: StateWriteError) -> None:
        """The state folder could not be written: the run stops, and ends Failed with the first such line."""
        if self.state_error is None:
            self.state_error = str(error)
        self.stop(self.state_error)

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only a flag: raising here could cut the scheduler's bookkeeping in half. The loop sees it within a tick.
        if self.signalled is None:
            self.signalled = signum
        self.stop(INTERRUPTED)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only; a run driven from another thread is stopped by it
            return
        previous = {s: signal.signal(s, self._on_signal) for s in _STOP_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    # -- the watchdog ----------------------------------------------------------------------------------------

    def _start_watchdog(self) -> None:
        try:
            self.owner.watchdog = self.watchdog.start(self.folder.path)
        except OSError as exc:
            self.display.note(f"warning: no watchdog ({exc}); if this process is killed, stop its tasks by hand")
            return
        if self.cluster is not None:  # if this process is killed, the watchdog removes the pod network too
            self.watchdog.tell(f"net {self.cluster.network.folder}\n")
        self.writer.submit(self.folder.owner, owner_document(self.owner))

    # -- the whole workflow ----------------------------------------------------------------------------------

    def _drive(self, run: DagRun, deadline_s: float | None) -> None:
        """Advance `run` until it is done, checking progress files and the deadline every tick."""
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        while True:
            with self.book.changed:
                version = self.book.version
                self.scheduler.advance(run)
                self.node.schedule()  # after every task this pass could start has asked for its place
                if run.done:
                    return
                if version == self.book.version:
                    self.book.changed.wait(_TICK_S)
            self.pods.poll_progress()
            if failed := self._preparing_failed():
                self.stop(failed)
            if deadline is not None and time.monotonic() > deadline and not self.abort.is_set():
                self.stop(f"workflow exceeded spec.activeDeadlineSeconds={deadline_s:g}")

    def execute(self) -> RunResult:
        with self.display, self._signals():
            try:
                self._start_watchdog()
                self.display.note(f"workflow {self.name}: {self.folder.path}")
                for preparing in self.preparing:
                    preparing.begin(self.display.note)
                self.write_status()
                self._guarded(self._run_entrypoint)
                if self.signalled is None and self.state_error is None and self.wf.on_exit is not None:
                    on_exit = self.wf.on_exit
                    self._guarded(lambda: self._run_exit_handler(on_exit))
                with self.book.lock:  # like Argo, the workflow stays Running until its exit handler has ended
                    self.phase, self.message = self.outcome
                    self.finished_at = now()
                    self.write_status()
                self.writer.flush()
                if self.state_error is not None:  # the last status.json may be among what could not be written
                    self.phase, self.message = Phase.FAILED, self.state_error
            except BaseException as exc:
                # A bug in the executor (or a KeyboardInterrupt outside the signal handler): stop every task and
                # say so in status.json, rather than leave processes running and a run that claims Running.
                self.stop(f"local executor error: {exc!r}")
                self.pods.join(KILL_GRACE_S + 5)
                with self.book.lock:
                    self.phase, self.message, self.finished_at = Phase.ERROR, self.abort_reason, now()
                    self.write_status()
                raise
            finally:
                self.pods.join(KILL_GRACE_S + 5)
                self.services.stop()  # run services live as long as the run: after the exit handler
                if self.cluster is not None:
                    self.cluster.close()  # no node, pod or address outlives the run
                self.owner.processes = dict(self.tracker.live)
                self.writer.submit(self.folder.owner, owner_document(self.owner))
                self.writer.close()  # status.json is final on disk before the run is released
                if self.state_error is not None:  # through the room kept for it: what the run printed, not "stopped"
                    with self.book.lock:
                        self.folder.write_last_status(self.status_document())
                self.watchdog.end()
                self.folder.release()
            if self.signalled is not None:
                self.display.note(f"workflow {self.name} {INTERRUPTED}: its tasks were stopped")
                raise RunInterrupted(self.name, self.signalled)
            self.display.note(f"workflow {self.name} {self.phase}{f': {self.message}' if self.message else ''}")
        return RunResult(
            self.name, self.phase, self.message, self.folder.path, self.book.snapshot(), dict(self.parameters)
        )

    def _guarded(self, part: Callable[[], None]) -> None:
        """Run one part of the workflow (the entrypoint, the exit handler); an executor bug fails the run, in one line.

        Its tasks are stopped, every node left unfinished is settled (Error, or Omitted if it never started), and
        the run goes on to its exit handler, so status.json never claims Running for a run that has ended.
        """
        try:
            part()
        except Exception as exc:
            if isinstance(exc, StateWriteError):  # a memoization entry the scheduler could not record
                self._state_failed(exc)
                reason = str(exc)
            else:
                reason = f"local executor error: {type(exc).__name__}: {exc}"
                self.stop(reason)
            self.pods.join(KILL_GRACE_S + 5)
            with self.book.lock:
                for key, node in list(self.book.nodes.items()):
                    if node.phase is Phase.PENDING:
                        self.book.set(key, Phase.OMITTED, f"not run: {reason}")
                    elif not node.phase.fulfilled:
                        self.book.set(key, Phase.ERROR, reason)
                self.outcome = (Phase.FAILED, short(reason))

    def _run_entrypoint(self) -> None:
        entry = self.wf.dag(self.wf.entrypoint)
        inputs = dag_inputs(entry, self.parameters)
        with self.book.lock:
            root = self.scheduler.begin(entry, "", None, Scope(self.values, inputs))
        self._drive(root, self.wf.deadline_s)
        with self.book.lock:
            phase, origin = self.scheduler.outcome(root)
            if self.abort.is_set():
                self.outcome = (Phase.FAILED, self.abort_reason)
            elif phase.failed_or_error and origin is not None:
                node = self.book[origin]
                self.outcome = (phase, f"child {node.name!r} failed: {node.message}")
            else:
                self.outcome = (Phase.SUCCEEDED, "")
            self.write_status()

    def _run_exit_handler(self, on_exit: DagTemplate) -> None:
        # The handler runs after a deadline too, so it gets a fresh stop signal (Ctrl-C still stops it).
        self.abort = threading.Event()
        scope = Scope({**self.values, "status": str(self.outcome[0])})
        with self.book.lock:
            handler = self.scheduler.begin(on_exit, "", None, scope)
        self._drive(handler, None)
        with self.book.lock:
            phase, origin = self.scheduler.outcome(handler)
            if phase.failed_or_error and origin is not None and self.signalled is None:
                node = self.book[origin]
                failed = f"onExit {node.name!r} failed: {node.message}"
                self.outcome = (Phase.FAILED, "; ".join(m for m in (self.outcome[1], failed) if m))


def execute_run(
    workflow: Workflow,
    folder: RunFolder,
    *,
    name: str,
    uid: str | None,
    parameters: dict[str, str],
    kept: dict[str, NodeStatus],
    settings: RunSettings,
    started_at: str | None = None,
    overrides: list[dict[str, Any]] | None = None,
    manifest: dict[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> RunResult:
    """Run `workflow` in `folder` (claimed for the run's duration), keeping the `kept` nodes of an earlier try.

    A new run gives its `manifest` (and `config`) to keep in the folder. StateWriteError, before anything starts,
    if the folder cannot be written: a new run's folder is removed then, an earlier run's is left as it was.
    """
    # Before any task, and before a new run's folder: what cannot be had is one line now; the rest is made beside
    # the first tasks (an engine's install), and a failure there stops the run in one line.
    preparing = services.prepare(workflow)
    try:
        folder.make()
        if manifest is not None:
            folder.write_manifest(manifest)
        if config is not None:
            folder.write_config(config)
        run = _Run(
            workflow,
            folder,
            folder.path.parent.parent,
            name=name,
            uid=uid or str(uuid.uuid4()),
            parameters=parameters,
            kept={k: replace(n) for k, n in kept.items()},
            settings=settings,
            started_at=started_at or now(),
            overrides=list(overrides or []),
            preparing=preparing,
        )
    except StateWriteError:
        folder.release()
        if manifest is not None:  # a run that could not start leaves no folder behind
            shutil.rmtree(folder.path, ignore_errors=True)
        raise
    try:
        return run.execute()
    except BaseException:
        run.folder.release()
        raise


def run_workflow(
    manifest: Mapping[str, Any],
    state_dir: Path,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    console: Console | None = None,
    parameters: Mapping[str, str] | None = None,
    memoize: bool = True,
    config: Mapping[str, Any] | None = None,
    nodes: int = 1,
) -> RunResult:
    """Run a compiled Workflow manifest here; its folder is `state_dir/runs/<workflow name>/`.

    `config` is the pipeline config the manifest was built from (kept beside it: a resume names the settings
    that differ from it).

    Ctrl-C, SIGTERM or SIGHUP stops the running tasks, records the run as Failed "interrupted" and raises
    RunInterrupted (as does resume_workflow); the run can then be resumed. `memoize=False` runs every task even
    where a memoized template's cache has its outputs (fresh outputs are still saved). `nodes` > 1 places the
    pods of distributed jobs on that many simulated nodes (sim_nodes.py; root only).
    """
    plain = plain_manifest(manifest)
    workflow = parse_manifest(plain)
    values = effective_parameters(workflow, parameters)
    runs = state_dir.resolve() / "runs"
    name = new_run_name(workflow, runs)
    folder = RunFolder(runs / name)
    if folder.path.exists():
        raise LocalExecutorError(
            f"run folder {folder.path} already exists (metadata.name {name!r} is fixed); resume it with "
            "resume_workflow, delete it, or use metadata.generateName"
        )
    settings = RunSettings(cwd, dict(env or {}), console, memoize, nodes=nodes)
    return execute_run(
        workflow, folder, name=name, uid=None, parameters=values, kept={}, settings=settings, manifest=plain,
        config=config,
    )  # fmt: skip
