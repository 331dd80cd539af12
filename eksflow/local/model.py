"""The manifest reduced to what a local run needs: frozen, checked objects (manifest.py builds them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from eksflow.local.errors import LocalExecutorError
from eksflow.local.expressions import depends_references

EXIT_HANDLER = "onExit"  # the node name Argo gives the workflow's exit handler


@dataclass(frozen=True)
class Input:
    """An input parameter of a template."""

    name: str
    default: str | None


def bind_inputs(
    inputs: tuple[Input, ...], given: Mapping[str, str], missing: Callable[[str], Exception]
) -> dict[str, str]:
    """Each input's value: the one `given` by its name, else its default; `missing(name)` is raised for neither."""
    values = {}
    for param in inputs:
        value = given.get(param.name, param.default)
        if value is None:
            raise missing(param.name)
        values[param.name] = value
    return values


@dataclass(frozen=True)
class Output:
    """An output parameter: read from a file (`path`, container templates) or from a task (`parameter`, DAGs)."""

    name: str
    path: str | None  # valueFrom.path
    parameter: str | None  # valueFrom.parameter, e.g. "{{tasks.train.outputs.parameters.loss}}"
    default: str | None


@dataclass(frozen=True)
class Mount:
    """A volume mounted into a task's process: `mount_path` maps to a host folder."""

    mount_path: str
    scope: str  # "state" (a PVC: shared by all runs) | "secret" (a Secret: see `host_folder`) | "run"
    folder: str  # claim name, Secret name or volume name
    sub_path: str

    def host_folder(self, state_dir: Path, run_volumes: Path) -> Path:
        """The host folder this mount maps to (not created); LocalExecutorError if a name would lead out of it.

        A PVC's is shared by every run (<state>/volumes/<claim>). A Secret's is <state>/secrets/<Secret name> when
        that folder exists (this machine's own Secrets: `make slurm-up` writes eksflow-slurm/token there), else a
        folder of the run (where the local fleet writes the keys it makes for the run). Anything else belongs to
        the run. The manifest's names are checked when it is read (parse_templates); whatever they hold, the folder
        stays inside its base here (a Secret's even with links resolved).
        """
        relative = PurePosixPath(self.folder, self.sub_path)
        if len(PurePosixPath(self.folder).parts) != 1 or relative.is_absolute() or ".." in relative.parts:
            raise LocalExecutorError(
                f"volume {self.folder!r} (subPath {self.sub_path!r}) at {self.mount_path} would name a folder "
                "outside the state folder; give names without '/' or '..'"
            )
        if self.scope == "state":
            base = state_dir / "volumes"
        elif self.scope == "secret" and (state_dir / "secrets" / self.folder).is_dir():
            base = state_dir / "secrets"
        else:
            base = run_volumes
        folder = base / relative
        if self.scope == "secret" and not folder.resolve().is_relative_to(base.resolve()):
            raise LocalExecutorError(
                f"Secret {self.folder!r} at {self.mount_path}: its folder {folder} leads outside {base}"
            )
        return folder


@dataclass(frozen=True)
class Retry:
    """A template's retryStrategy."""

    limit: int
    policy: str  # Always | OnFailure | OnError | OnTransientError
    expression: str | None
    backoff_s: float
    factor: float
    max_duration_s: float | None  # counted from the first attempt's start, as Argo does
    cap_s: float | None


@dataclass(frozen=True)
class Memoize:
    """A template's memoize: reuse the outputs saved under `key` in cache `cache` if younger than `max_age_s`."""

    key: str  # may hold {{inputs.parameters.x}} references, substituted per task
    max_age_s: float | None  # None: no age limit (Argo's maxAge "")
    cache: str  # cache.configMap.name


@dataclass(frozen=True)
class PathRules:
    """Which argv flags and env vars carry container paths (the eksflow.dev/path-args and path-env annotations).

    None means the manifest does not say: then only values that are whole container paths or URIs are mapped.
    """

    args: frozenset[str] | None
    env: frozenset[str] | None


@dataclass(frozen=True)
class Template:
    """What every template has."""

    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    retry: Retry | None
    deadline_s: float | None
    memoize: Memoize | None


@dataclass(frozen=True)
class ContainerTemplate(Template):
    """A container template: its command and args run as a local process."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    paths: PathRules
    # cpu and memory the pod requests (its limits where it gives no request), as written: a {{...}} reference is
    # substituted for each attempt; what the local node admits it by (node.py)
    requests: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ResourceTemplate(Template):
    """A resource template: the object it creates is run by the handler of its kind (resources.py)."""

    manifest: str  # YAML text with its {{...}} references: substituted for each attempt, then parsed (as Argo does)
    paths: PathRules
    action: str = "create"  # Argo's kubectl verb: create and apply run the object, delete ends a run service's


@dataclass(frozen=True)
class Loop:
    """A task's fan-out: a literal list (withItems) or a JSON list read from a parameter or output (withParam)."""

    items: tuple[Any, ...] | None  # withItems, as parsed (scalars, mappings, lists)
    param: str | None  # withParam, with its {{...}} reference


@dataclass(frozen=True)
class DagTask:
    """One task of a DAG template."""

    name: str
    template: str
    arguments: tuple[tuple[str, str], ...]
    depends: str | None
    when: str | None
    loop: Loop | None

    def needs(self) -> list[str]:
        """The tasks this one depends on, in the order its depends names them."""
        return list(dict.fromkeys(t for t, _ in depends_references(self.depends))) if self.depends else []


@dataclass(frozen=True)
class DagTemplate(Template):
    """A DAG template."""

    tasks: Mapping[str, DagTask]
    fail_fast: bool
    handled: frozenset[str]  # tasks whose failure some depends expects (`t.Failed`): they do not stop the DAG
    parallelism: int | None  # at most this many of its tasks (each iteration counts) run at once
    leaves: tuple[str, ...]  # tasks no other task depends on: their outcome decides the DAG's phase


@dataclass(frozen=True)
class Workflow:
    """A checked Workflow manifest."""

    name: str | None
    generate_name: str | None
    labels: Mapping[str, str]
    parameters: Mapping[str, str | None]
    entrypoint: str
    on_exit: DagTemplate | None  # the exit handler as a one-task DAG whose task (and node) is named onExit
    parallelism: int | None
    deadline_s: float | None
    templates: Mapping[str, Template]
    # template -> the annotations saying why its task is skipped (eksflow.runtime.skip_reason), where a when= gave one
    skip_reasons: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def dag(self, name: str) -> DagTemplate:
        """The DAG template `name` (the entrypoint and every template a task runs exist: parsing checked them)."""
        template = self.templates[name]
        assert isinstance(template, DagTemplate)
        return template
