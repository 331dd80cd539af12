"""The runs in a state directory, for the verbs users know from `argo`: list, get, logs, resume, retry, resubmit.

    list_runs(state_dir)                           argo list: name, phase, start, duration, pipeline
    load_run(state_dir, name)                      argo get: tasks, phases, outputs (host paths for printing)
    task_log(state_dir, name, task), follow_log    argo logs [--follow]
    resume_workflow(run_dir, ...)                  re-run what did not succeed, with the run's own inputs
    retry_run(state_dir, name, parameters)         argo retry -p: the same, with workflow parameters overridden
    resubmit_run(state_dir, name, parameters)      argo resubmit: a new run of the same manifest

Readers never write: a run whose executor is gone reads as Failed "executor stopped" without its status.json
being touched (rundir.py), so they work on a read-only or full state folder. A run (or task) a caller names that
is not there raises RunNotFoundError (label "not found", exit 2).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NotRequired, TypedDict, Unpack

from rich.console import Console

from eksflow.local import process
from eksflow.local.errors import LocalExecutorError, RunNotFoundError
from eksflow.local.executor import RunSettings, execute_run, run_workflow
from eksflow.local.manifest import effective_parameters, parse_manifest, plain_manifest
from eksflow.local.model import ContainerTemplate, ResourceTemplate
from eksflow.local.paths import PathMap
from eksflow.local.phase import Phase
from eksflow.local.rundir import RunFolder
from eksflow.local.services import restarted
from eksflow.local.status import NodeStatus, RunResult, now, parse_time, read_nodes, read_parameters
from eksflow.names import PIPELINE_LABEL, workflow_name_problem
from eksflow.runtime.shown import shown

RESUBMITTED_FROM = "workflows.argoproj.io/resubmitted-from-workflow"  # the label `argo resubmit` sets


class HowToRun(TypedDict):
    """How retry_run and resubmit_run run the tasks again, as keywords (the two verbs share them)."""

    cwd: Path  # where task processes start
    env: NotRequired[Mapping[str, str] | None]  # their environment
    console: NotRequired[Console | None]  # where progress is shown; None: nowhere
    memoize: NotRequired[bool]  # reuse memoized results (default True)


@dataclass(frozen=True)
class RunSummary:
    """One line of `list`."""

    name: str
    phase: Phase
    started_at: str | None
    finished_at: str | None
    duration_s: float | None  # until now for a run still running
    pipeline: str
    message: str
    run_dir: Path


@dataclass
class RunView:
    """One run as `get` shows it."""

    name: str
    phase: Phase
    message: str
    started_at: str | None
    finished_at: str | None
    parameters: dict[str, str]
    labels: dict[str, str]
    nodes: dict[str, NodeStatus]
    run_dir: Path
    running: bool  # an executor is running it now
    orphans: dict[int, str] = field(default_factory=dict)  # task PIDs a dead executor left running -> node key
    overrides: list[dict[str, Any]] = field(default_factory=list)  # each retry's parameter overrides
    _paths: dict[str, PathMap] = field(default_factory=dict, repr=False)

    def host(self, node: str, value: str) -> str:
        """`value` as this machine sees it: a container path of node `node`'s volumes becomes its host folder."""
        paths = self._paths.get(self.nodes[node].template) or self._paths.get("")
        return value if paths is None else paths.to_host(value)

    def host_outputs(self, node: str) -> dict[str, str]:
        """Node `node`'s outputs with container paths shown as host paths (for printing; status keeps Argo's)."""
        return {name: self.host(node, value) for name, value in self.nodes[node].outputs.items()}


def runs_dir(state_dir: Path) -> Path:
    """Where the runs of a state directory live."""
    return state_dir.resolve() / "runs"


def run_folder(state_dir: Path, name: str) -> RunFolder:
    """The folder of run `name`; LocalExecutorError if `name` is no run name, RunNotFoundError if there is none."""
    if problem := workflow_name_problem(name):  # a name, never a path: `../x` or `/abs` would leave runs_dir
        raise LocalExecutorError(problem)
    folder = RunFolder(runs_dir(state_dir) / name)
    if not (folder.status.exists() and folder.manifest.exists()):
        known = sorted(p.name for p in runs_dir(state_dir).glob("*") if (p / "status.json").exists())
        listed = ", ".join(known[-10:]) or "none"
        raise RunNotFoundError(f"no run {name!r} in {runs_dir(state_dir)} (runs there: {listed})")
    return folder


def list_runs(state_dir: Path) -> list[RunSummary]:
    """Every run of the state directory, the newest first."""
    summaries = []
    for path in runs_dir(state_dir).glob("*/status.json"):
        folder = RunFolder(path.parent)
        try:
            _, document, _ = folder.read_settled()
        except LocalExecutorError:
            continue  # a folder being created, or not a run's
        status = document.get("status", {})
        labels = document.get("metadata", {}).get("labels", {}) or {}
        started, finished = status.get("startedAt"), status.get("finishedAt")
        summaries.append(
            RunSummary(
                name=folder.name,
                phase=Phase(status.get("phase", Phase.PENDING)),
                started_at=started,
                finished_at=finished,
                duration_s=_duration(started, finished),
                pipeline=labels.get(PIPELINE_LABEL, ""),
                message=status.get("message", ""),
                run_dir=folder.path,
            )
        )
    return sorted(summaries, key=lambda s: s.started_at or "", reverse=True)


def _duration(started: str | None, finished: str | None) -> float | None:
    start = parse_time(started)
    if start is None:
        return None
    end = parse_time(finished) or datetime.now(timezone.utc)
    return max((end - start).total_seconds(), 0.0)


def load_run(state_dir: Path, name: str) -> RunView:
    """Run `name`: its phase, parameters and every node (as Failed if its executor is gone); nothing is written."""
    folder = run_folder(state_dir, name)
    manifest, document, orphans = folder.read_settled()
    status = document.get("status", {})
    return RunView(
        name=name,
        phase=Phase(status.get("phase", Phase.PENDING)),
        message=status.get("message", ""),
        started_at=status.get("startedAt"),
        finished_at=status.get("finishedAt"),
        parameters=read_parameters(document),
        labels=dict(document.get("metadata", {}).get("labels", {}) or {}),
        nodes=read_nodes(document, folder.path),
        run_dir=folder.path,
        running=folder.held(),
        orphans=orphans,
        overrides=list(status.get("overrides", [])),
        _paths=_host_paths(manifest, folder),
    )


def _host_paths(manifest: dict[str, Any], folder: RunFolder) -> dict[str, PathMap]:
    """Per template, its mounts as host folders ("" for all mounts of the run, for other nodes)."""
    try:
        workflow = parse_manifest(manifest)
    except LocalExecutorError:
        return {}
    state_dir = folder.path.parent.parent
    every: dict[str, str] = {}
    maps = {}
    for name, template in workflow.templates.items():
        if isinstance(template, ContainerTemplate):
            pairs = {}
            for mount in template.mounts:
                pairs[mount.mount_path] = str(mount.host_folder(state_dir, folder.volumes))
            maps[name] = PathMap(pairs.items())
            every.update(pairs)
    maps[""] = PathMap(every.items())
    for name, template in workflow.templates.items():
        if isinstance(template, ResourceTemplate):
            maps[name] = maps[""]
    return maps


def find_nodes(view: RunView, task: str) -> list[str]:
    """The node keys `task` names: a key, or a task's name (every iteration of a fanned-out task); at least one."""
    if task in view.nodes:
        return [task]
    matches = [k for k, n in view.nodes.items() if n.display_name == task]
    if matches:
        return matches
    known = ", ".join(dict.fromkeys(n.display_name for n in view.nodes.values())) or "none"
    asked = repr(task) if len(task) <= 60 else f"{task[:60]!r}... ({len(task)} characters)"
    raise RunNotFoundError(f"no node of run {view.name!r} is called {asked}; give one of: {known}")


def find_node(view: RunView, task: str) -> str:
    """The one node key `task` names; LocalExecutorError when it names none or several (a fanned-out task)."""
    keys = find_nodes(view, task)
    if len(keys) > 1:
        labels = ", ".join(node_label(view, k) for k in keys)
        raise LocalExecutorError(f"{task!r} names {len(keys)} nodes of run {view.name!r}: {labels}; give its key")
    return keys[0]


def node_label(view: RunView, key: str) -> str:
    """How a verb names a node: its task's name, with the iteration or DAG it is part of (`train [candidate(0:r8)]`)."""
    name = view.nodes[key].display_name
    scope = key.removesuffix(f".{name}") if key.endswith(f".{name}") else key if key != name else ""
    return f"{name} [{scope}]" if scope else name


def task_log(state_dir: Path, name: str, task: str) -> Path:
    """The log file of one task of run `name` (it may not exist yet if the task has not started)."""
    view = load_run(state_dir, name)
    return RunFolder(view.run_dir).log(find_node(view, task))


def follow_log(path: Path, *, done: Callable[[], bool], poll_s: float = 0.5) -> Iterator[str]:
    """The lines of a log as they are written, until `done()` holds and the file is read to its end."""
    position = 0
    pending = b""
    while True:
        finished = done()  # asked before reading, so the last lines written before the end are not missed
        if path.exists():
            with open(path, "rb") as log:
                log.seek(position)
                chunk = log.read()
                position += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line.decode("utf-8", errors="replace")
        if finished:
            if pending:
                yield pending.decode("utf-8", errors="replace")
            return
        time.sleep(poll_s)


def follow_task_log(state_dir: Path, name: str, task: str, *, poll_s: float = 0.5) -> Iterator[str]:
    """`logs --follow`: a task's log lines until the task (or its run) has finished."""
    view = load_run(state_dir, name)
    key = find_node(view, task)
    folder = RunFolder(view.run_dir)

    def done() -> bool:
        current = load_run(state_dir, name)
        return current.nodes[key].phase.fulfilled or not current.running

    return follow_log(folder.log(key), done=done, poll_s=poll_s)


@dataclass(frozen=True)
class InputChanges:
    """How a freshly built manifest differs from the one a run started with."""

    parameters: dict[str, str]  # workflow parameters with a new value
    other: list[str]  # anything else that differs: templates by name, other spec fields

    def __bool__(self) -> bool:
        return bool(self.parameters or self.other)


def changed_inputs(
    saved: Mapping[str, Any],
    saved_parameters: Mapping[str, str],
    manifest: Mapping[str, Any] | None,
    parameters: Mapping[str, str] | None,
) -> InputChanges:
    """What a new manifest and parameters change against a saved run (both optional: None changes nothing)."""
    changed: dict[str, str] = {}
    other: list[str] = []
    if manifest is not None:
        plain = plain_manifest(manifest)
        new = parse_manifest(plain)
        for param, value in new.parameters.items():
            if value is not None and saved_parameters.get(param) != value:
                changed[param] = value
        old_spec, new_spec = saved.get("spec", {}), plain.get("spec", {})
        old_templates = {t.get("name"): t for t in old_spec.get("templates", [])}
        for template in new_spec.get("templates", []):
            if old_templates.get(template.get("name")) != template:
                other.append(f"template {template.get('name')!r}")
        for key in sorted(set(old_spec) | set(new_spec) - {"templates", "arguments"}):
            if key not in ("templates", "arguments") and old_spec.get(key) != new_spec.get(key):
                other.append(f"spec.{key}")
    for param, value in (parameters or {}).items():
        if saved_parameters.get(param) != value:
            changed[param] = value
    return InputChanges(changed, other)


def resume_workflow(
    run_dir: Path,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    console: Console | None = None,
    parameters: Mapping[str, str] | None = None,
    manifest: Mapping[str, Any] | None = None,
    memoize: bool = True,
    nodes: int = 1,
    config: Mapping[str, Any] | None = None,
    adopt: bool = False,
) -> RunResult:
    """Re-run a finished run like `argo retry`: Succeeded nodes keep their outputs, the rest run again.

    `manifest` and `parameters` are what the caller would run now (the CLI's --config/--set); if they differ from
    the run's own inputs, resuming is refused naming what changed (use retry_run to override parameters, or a new
    run). With `adopt`, the caller has checked that `manifest` (built from `config`) differs from the run's only in
    where the run reports (eksflow.run): both replace the run's own, and what did not succeed runs with them. A run
    whose executor died is settled first, and task processes it left running are stopped.
    """
    folder = RunFolder(run_dir.resolve())
    orphans = folder.settle()
    if orphans:
        stopped = process.stop_orphans(sorted(orphans))
        if console is not None and stopped:
            pids = ", ".join(f"{pid} ({orphans[pid]})" for pid in stopped)
            line = f"stopped task processes the previous executor left running: {pids}"
            console.print(shown(line), markup=False, highlight=False)
    saved, document = folder.read()
    saved_parameters = read_parameters(document)
    if adopt and manifest is not None:
        settings = RunSettings(cwd, dict(env or {}), console, memoize, nodes=nodes)
        return _rerun(folder, saved, document, {}, settings, adopted=(plain_manifest(manifest), config))
    changes = changed_inputs(saved, saved_parameters, manifest, parameters)
    if changes:
        what = [f"parameter {p}" for p in changes.parameters] + changes.other
        raise LocalExecutorError(
            f"run {folder.name!r} started with other inputs ({', '.join(what)} changed); resuming keeps the run's "
            "own inputs: resume without --set/--config changes, re-run its failed tasks with new parameter values "
            f"(retry {folder.name} -p NAME=VALUE), or start a new run"
        )
    return _rerun(folder, saved, document, {}, RunSettings(cwd, dict(env or {}), console, memoize, nodes=nodes))


def retry_run(
    state_dir: Path,
    name: str,
    parameters: Mapping[str, str] | None = None,
    **how: Unpack[HowToRun],
) -> RunResult:
    """`argo retry NAME -p name=value`: Failed/Error and never-run nodes run again, with parameters overridden.

    Succeeded nodes are kept with their outputs (even where an override would have changed them, as in Argo); the
    overrides are recorded in status.json (`status.overrides`).
    """
    folder = run_folder(state_dir, name)
    folder.settle()
    saved, document = folder.read()
    settings = RunSettings(how["cwd"], dict(how.get("env") or {}), how.get("console"), how.get("memoize", True))
    return _rerun(folder, saved, document, dict(parameters or {}), settings)


def _rerun(
    folder: RunFolder,
    saved: dict[str, Any],
    document: dict[str, Any],
    overrides: dict[str, str],
    settings: RunSettings,
    adopted: tuple[dict[str, Any], Mapping[str, Any] | None] | None = None,
) -> RunResult:
    """Run again what did not succeed; `adopted`: a manifest (and its config) that replaces the run's own first."""
    workflow = parse_manifest(adopted[0] if adopted else saved)
    status = document.get("status", {})
    if status.get("phase") == Phase.SUCCEEDED:
        raise LocalExecutorError(f"run {folder.name!r} already Succeeded; there is nothing to resume or retry")
    if folder.held():
        raise LocalExecutorError(folder.busy_message())
    if adopted is not None:  # checked above to be resumable: only now is the run's own manifest replaced
        folder.write_manifest(adopted[0])
        if adopted[1] is not None:
            folder.write_config(adopted[1])
    parameters = effective_parameters(workflow, {**read_parameters(document), **overrides})
    history = list(status.get("overrides", []))
    if overrides:
        history.append({"at": now(), "parameters": overrides})
    # A run service's processes lived only as long as the earlier try: its objects, and what used them, run again.
    # So does the exit handler, as Argo runs onExit again on every retry: its nodes of the earlier try are not kept,
    # nor any node under them (a DAG handler's tasks), so its work (a report, an alert) sees this try's outcome.
    again = restarted(workflow) | set(workflow.on_exit.tasks if workflow.on_exit else ())
    kept = _without(read_nodes(document, folder.path), again)
    return execute_run(
        workflow,
        folder,
        name=document.get("metadata", {}).get("name", folder.name),
        uid=document.get("metadata", {}).get("uid"),
        parameters=parameters,
        kept=kept,  # the book reuses what Succeeded, with everything under it
        settings=settings,
        started_at=status.get("startedAt"),
        overrides=history,
    )


def _without(nodes: dict[str, NodeStatus], dropped: set[str]) -> dict[str, NodeStatus]:
    """`nodes` less the `dropped` ones and every node under them (their children, and theirs)."""
    gone = set()
    stack = [key for key in dropped if key in nodes]
    while stack:
        key = stack.pop()
        if key not in gone:
            gone.add(key)
            stack += [child for child in nodes[key].children if child in nodes]
    return {key: node for key, node in nodes.items() if key not in gone}


def resubmit_run(
    state_dir: Path,
    name: str,
    parameters: Mapping[str, str] | None = None,
    **how: Unpack[HowToRun],
) -> RunResult:
    """`argo resubmit NAME`: a new run of the same manifest, labelled with the run it came from.

    It is named from the manifest's generateName (NAME- for a fixed name); `parameters` override the original run's
    parameter values.
    """
    folder = run_folder(state_dir, name)
    saved, document = folder.read()
    manifest = plain_manifest(saved)
    metadata = manifest.setdefault("metadata", {})
    metadata["generateName"] = metadata.get("generateName") or f"{metadata.get('name', name)}-"
    metadata.pop("name", None)
    metadata["labels"] = {**(metadata.get("labels") or {}), RESUBMITTED_FROM: name}
    values = {**read_parameters(document), **(parameters or {})}
    return run_workflow(manifest, state_dir, parameters=values, **how)
