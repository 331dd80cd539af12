"""Run services: objects a run applies whose processes live as long as the run, not as long as the task.

One small interface, like the task handlers' (handlers.py): a project registers the kinds a service takes and a
factory, and the executor does the rest for every run.

    register_run_service({("apps/v1", "Deployment"), ("v1", "Service")}, factory, check=None, prepare=None)
    factory(state_dir, run_dir, cwd, tracker) -> RunService   # one per run, made when the run starts
    service.apply(manifest, where, stop_reason, nodes=...)      # nodes=: only in a run with simulated nodes
    service.delete(manifest, where)                             # a resource template's action: delete

The executor makes one service of each registered factory when a run starts (making one must be cheap: nothing
starts before an object is applied), hands it every object of its kinds that a resource template applies
(`apply`; the task's message is its note) and every one a resource template deletes (`delete`: what the object
runs ends, as on the cluster; one that is not there is no error, as Argo's `kubectl delete --ignore-not-found`),
maps each container's argv and env through it (`local_argv`, `local_value`: an address of something it runs
becomes the local one), gives every task its `task_env`, and calls
`stop` once when the run ends, after the exit handler: succeeded, failed or interrupted. A service tells the run's
ProcessTracker of each process it starts, so the watchdog stops them if the executor dies. `check` (optional) looks
at an object up front, with placeholders, so an object the service could never run fails before the run starts.
`prepare` (optional) is given, once before a run or a resume starts anything, every object of its kinds that the
workflow applies: it refuses the run in one line when what they need cannot be had on this machine, and may return a
Preparing that makes it beside the run's first tasks (an engine's install): the executor begins it as the run
starts, with a way to show lines on the run's display, and stops the run, in one line, once it says it failed.

A resumed run applies (and deletes) the objects of service kinds again, with every task after them (`restarted`):
the processes ended with the earlier try. An object of a kind nobody registered fails up front, as any unknown resource
kind does (resources.py). This project's serving fleet (vLLM and LiteLLM) is one: eksflow/llm/serving/local_fleet.py.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EksflowError
from eksflow.local.model import ResourceTemplate, Workflow
from eksflow.local.process import ProcessTracker
from eksflow.local.resources import LocalJob, ResourceError, register_kind
from eksflow.local.substitution import PLACEHOLDER
from eksflow.manifests import REFERENCE

if TYPE_CHECKING:
    from eksflow.local.handlers import NodesContext

Kind = tuple[str, str]  # (apiVersion, kind), e.g. ("apps/v1", "Deployment")


class RunServiceError(EksflowError):
    """An object a run service cannot run, or a process of it that failed; `retriable` False for manifest errors.

    `exit_code` follows `retriable`: a process that failed may work on a retry (1), a manifest never will (2).
    """

    label = "run service error"
    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.exit_code = EXIT_FAILED if retriable else EXIT_BAD_INPUT


class RunService(Protocol):
    """What a run's service does for the executor; every method may be called from any task's thread."""

    def apply(
        self,
        manifest: Mapping[str, Any],
        where: str,
        stop_reason: Callable[[], str],
        *,
        nodes: NodesContext | None = None,
    ) -> str:
        """Do what applying `manifest` does on a cluster; return the task's message. Raises RunServiceError.

        `nodes`: the run's simulated nodes (`run --nodes N`), where the object's pods go; passed only in such a run,
        so a service that runs everything on this machine may leave it out.
        """

    def delete(self, manifest: Mapping[str, Any], where: str) -> str:
        """Do what deleting the object `manifest` names does on a cluster; the task's message. Raises RunServiceError.

        An object this run's service does not hold is no error (Argo deletes with --ignore-not-found): say so.
        """

    def local_argv(self, argv: Sequence[str]) -> list[str]:
        """A container's argv with each address of something this service runs replaced by the local one."""

    def local_value(self, value: str) -> str:
        """An env value, replaced by the local address when it is, as a whole, an address this service runs."""

    def task_env(self) -> dict[str, str]:
        """Variables every task of the run gets from this service."""

    def stop(self) -> None:
        """Stop every process the service started (called once, when the run ends)."""


ServiceFactory = Callable[[Path, Path, Path, ProcessTracker | None], RunService]  # (state_dir, run_dir, cwd, tracker)
Check = Callable[[Mapping[str, Any], str], None]  # (manifest, where); raises RunServiceError for what cannot run


class Preparing(Protocol):
    """What a service's `prepare` makes beside the run's first tasks (the objects that need it wait for it)."""

    def begin(self, say: Callable[[str], None]) -> None:
        """The run has started: start making it (in the background); `say` shows a line on the run's display."""

    def failure(self) -> str:
        """Why the run must stop, once making it failed, as one line ("" while it has not)."""


Prepare = Callable[[Sequence[Mapping[str, Any]]], Preparing | None]  # the workflow's objects of its kinds

_REGISTERED: list[tuple[frozenset[Kind], ServiceFactory]] = []
_PREPARE: dict[frozenset[Kind], Prepare] = {}


def register_run_service(
    kinds: Iterable[Kind], factory: ServiceFactory, check: Check | None = None, prepare: Prepare | None = None
) -> None:
    """Hand every applied object of `kinds` ((apiVersion, kind) pairs) to a service `factory` makes for each run."""
    wanted = frozenset(kinds)
    for known, made in _REGISTERED:
        if made is factory and known == wanted:
            return  # its module imported again: registered already
        if taken := sorted(known & wanted):
            raise RunServiceError(
                f"{taken} already go to the run service {made!r}; register each kind once", retriable=False
            )
    _REGISTERED.append((wanted, factory))
    if prepare is not None:
        _PREPARE[wanted] = prepare
    for api_version, kind in sorted(wanted):
        register_kind(kind, api_version, functools.partial(_describe, check))


def service_kinds() -> frozenset[Kind]:
    """Every kind a registered run service takes."""
    return frozenset().union(*(kinds for kinds, _ in _REGISTERED))


def _describe(check: Check | None, manifest: Mapping[str, Any], where: str) -> LocalJob:
    """The resource describer of a service kind: the object itself, for the run's service that takes it."""
    if check is not None:
        try:
            check(manifest, where)
        except RunServiceError as exc:
            raise ResourceError(str(exc)) from None
    return LocalJob(str(manifest.get("kind")), "", service_object=manifest)


class RunServices:
    """The services of one run, one of each registered factory, used by the executor as one RunService."""

    def __init__(self, state_dir: Path, run_dir: Path, cwd: Path, tracker: ProcessTracker | None) -> None:
        self._services = [(kinds, factory(state_dir, run_dir, cwd, tracker)) for kinds, factory in _REGISTERED]

    def apply(
        self, manifest: Mapping[str, Any], where: str, stop_reason: Callable[[], str], nodes: NodesContext | None
    ) -> str:
        """Apply `manifest` with the service that takes its kind. Raises RunServiceError."""
        service = self._taking(manifest, where)
        if nodes is None:
            return service.apply(manifest, where, stop_reason)
        return service.apply(manifest, where, stop_reason, nodes=nodes)

    def _taking(self, manifest: Mapping[str, Any], where: str) -> RunService:
        """The service of this run that takes the object's kind; RunServiceError if none does."""
        kind = (str(manifest.get("apiVersion")), str(manifest.get("kind")))
        for kinds, service in self._services:
            if kind in kinds:
                return service
        raise RunServiceError(
            f"{where}: no run service of this run takes {kind[1]} ({kind[0]}); it was registered after the run "
            "started: register it (register_run_service) before running the workflow",
            retriable=False,
        )

    def delete(self, manifest: Mapping[str, Any], where: str) -> str:
        """Delete the object `manifest` names with the service that takes its kind. Raises RunServiceError."""
        return self._taking(manifest, where).delete(manifest, where)

    def local_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` mapped by every service in turn."""
        mapped = list(argv)
        for _, service in self._services:
            mapped = service.local_argv(mapped)
        return mapped

    def local_value(self, value: str) -> str:
        """`value` mapped by every service in turn."""
        for _, service in self._services:
            value = service.local_value(value)
        return value

    def task_env(self) -> dict[str, str]:
        """Every service's variables for the tasks."""
        env: dict[str, str] = {}
        for _, service in self._services:
            env.update(service.task_env())
        return env

    def stop(self) -> None:
        """Stop every service, the last made first; one that fails to stop does not keep the others running."""
        with contextlib.ExitStack() as stack:
            for _, service in self._services:
                stack.callback(service.stop)


def prepare(workflow: Workflow) -> list[Preparing]:
    """Give each service's `prepare` the objects of its kinds that `workflow` applies; what they make beside the run.

    Raises what they raise.
    """
    applied = [manifest for name, manifest in _service_objects(workflow) if not _deletes(workflow, name)]
    preparing = []
    for kinds, made in _PREPARE.items():
        if (mine := [m for m in applied if (m.get("apiVersion"), m.get("kind")) in kinds]) and (started := made(mine)):
            preparing.append(started)
    return preparing


def deleted(text: str, where: str) -> dict[str, Any]:
    """The object a delete's substituted manifest names: of a run service's kind, with its name; RunServiceError else.

    Only a run service's objects are deleted here: the jobs' kinds (a RayJob, an MPIJob, a TrainJob) run as a task's
    process, which ends with its task, so no later task has one to delete.
    """
    try:
        manifest = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RunServiceError(f"{where} is not valid YAML after substitution: {exc}", retriable=False) from None
    manifest = manifest if isinstance(manifest, dict) else {}
    kind = (str(manifest.get("apiVersion", "")), str(manifest.get("kind", "")))
    if kind not in service_kinds():
        known = ", ".join(f"{k} ({v})" for v, k in sorted(service_kinds())) or "none registered"
        raise RunServiceError(
            f"{where}: deleting {kind[1] or 'an object without a kind'} ({kind[0]}) is not supported locally; a delete "
            f"runs here for the kinds a run service runs: {known}; submit this workflow to a cluster",
            retriable=False,
        )
    metadata = manifest.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name"):
        raise RunServiceError(f"{where}.metadata.name is required: it names the object deleted", retriable=False)
    return manifest


def _deletes(workflow: Workflow, name: str) -> bool:
    template = workflow.templates[name]
    return isinstance(template, ResourceTemplate) and template.action == "delete"


def _service_objects(workflow: Workflow) -> Iterator[tuple[str, dict[str, Any]]]:
    """(template name, object with placeholders) of each resource template applying or deleting a service kind."""
    kinds = service_kinds()
    for name, template in workflow.templates.items():
        if isinstance(template, ResourceTemplate):
            manifest = yaml.safe_load(REFERENCE.sub(PLACEHOLDER, template.manifest)) or {}
            if (manifest.get("apiVersion"), manifest.get("kind")) in kinds:
                yield name, manifest


def restarted(workflow: Workflow) -> set[str]:
    """Main tasks a resumed run runs again: those applying or deleting a run service's object, and every task after.

    A service's processes ended with the earlier try; its objects must be applied again, and the tasks that used
    them (loaded state into them, talked to them) ran against processes that are gone; a delete after an apply
    again deletes what that apply started.
    """
    tasks = workflow.dag(workflow.entrypoint).tasks
    applying = {name for name, _ in _service_objects(workflow)}
    found = {name for name, task in tasks.items() if task.template in applying}
    grown = True
    while grown:  # every task that needs one of them, directly or not
        after = {name for name, task in tasks.items() if set(task.needs()) & found} - found
        found |= after
        grown = bool(after)
    return found
