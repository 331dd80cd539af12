"""Run a compiled Argo Workflow manifest on this machine, task by task, as local processes.

The manifest is exactly what `render` prints and `submit` sends. A supported subset is checked up front (DAG,
container and resource templates, depends/when, parameters, retryStrategy, activeDeadlineSeconds, onExit,
parallelism, volumes); anything else raises LocalExecutorError naming the field. What runs:

- a container template: its command and args, as a process in the project's environment (`python` is this
  interpreter), with its env;
- a resource template creating a RayJob: the job's entrypoint under `bash -c`, with the head container's env and
  mounts, where the train step starts a local Ray itself; the RayJob's activeDeadlineSeconds applies too. A job
  asking for GPUs or Neuron devices this machine lacks fails before it starts, saying so. An MPIJob: its launcher's
  mpirun (no shell) with every worker pod being this host (mpijob.py); when the process ends, whatever is left of
  its session goes too (mpirun's ranks sit in process groups of their own). A Volcano PodGroup
  (cluster admission) succeeds without a process; a workflow with a Volcano Job (torchrun across pods) is refused
  up front, before any task runs. See resources.py.

Each run keeps its state in `state_dir/runs/<workflow name>/`:

    manifest.yaml        the manifest as given, before substitution (what resume_workflow re-reads)
    status.json          Argo-like workflow status, rewritten atomically after every phase change
    logs/<task>.log      combined stdout+stderr of every attempt
    tasks/<task>/        outputs/ (the task's output parameter files), progress ($ARGO_PROGRESS_FILE),
                         bin/ (`python` for a RayJob's shell entrypoint: this interpreter), an MPIJob's hostfile
    volumes/<name>       emptyDir and other run-scoped volumes (PVCs live in state_dir/volumes/<claim>)

Container paths are mapped to these folders in command, args, env values and RayJob entrypoints, and mapped back
in output values, so status.json and downstream tasks see the paths Argo would show.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import secrets
import shlex
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from eksflow.local import resources
from eksflow.local.display import TaskDisplay, format_duration
from eksflow.local.expressions import (
    COMPLETED_PHASES,
    ExpressionError,
    dependencies_to_depends,
    depends_on_failure,
    depends_references,
    evaluate_depends,
    evaluate_retry_expression,
    evaluate_when,
)
from eksflow.local.fields import FieldReader

KILL_GRACE_S = 10.0  # SIGTERM -> SIGKILL, like a pod's terminationGracePeriodSeconds (Argo's default is 30)
NAMESPACE = "local"
EXIT_HANDLER = "onExit"
_POLL_S = 0.2
_TICK_S = 0.5
_MESSAGE_CHARS = 300

# Keys that only shape scheduling or security on a cluster; a local process has nothing to apply them to.
_CLUSTER_ONLY_SPEC = frozenset({
    "affinity", "archiveLogs", "artifactGC", "artifactRepositoryRef", "automountServiceAccountToken", "dnsConfig",
    "dnsPolicy", "executor", "hostAliases", "hostNetwork", "imagePullSecrets", "metrics", "nodeSelector",
    "podDisruptionBudget", "podGC", "podMetadata", "podPriorityClassName", "podSpecPatch", "priority",
    "schedulerName", "securityContext", "serviceAccountName", "synchronization", "tolerations", "ttlStrategy",
    "workflowMetadata",
})  # fmt: skip
_CLUSTER_ONLY_TEMPLATE = frozenset({
    "affinity", "archiveLocation", "automountServiceAccountToken", "executor", "hostAliases", "metadata", "metrics",
    "nodeSelector", "podSpecPatch", "priority", "priorityClassName", "schedulerName", "securityContext",
    "serviceAccountName", "synchronization", "tolerations",
})  # fmt: skip
_CLUSTER_ONLY_CONTAINER = frozenset({
    "image", "imagePullPolicy", "lifecycle", "livenessProbe", "ports", "readinessProbe", "resources",
    "securityContext", "startupProbe", "stdin", "stdinOnce", "terminationMessagePath", "terminationMessagePolicy",
    "tty",
})  # fmt: skip
_HINTS = {
    "script": "use a container template (parameters as argv items, never spliced into source)",
    "resource": "a template is one kind: dag, container or resource",
    "steps": "use a dag template",
    "withItems": "fan-out runs only on a cluster; list the tasks explicitly",
    "withParam": "fan-out runs only on a cluster; list the tasks explicitly",
    "templateRef": "inline the referenced template",
    "valueFrom": "give a literal value",
}
_RETRY_POLICIES = ("Always", "OnFailure", "OnError", "OnTransientError")
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_REFERENCE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_TASK_REFERENCE = re.compile(r"\{\{\s*tasks\.([\w\-]+)\.")
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_RESOURCE_ACTIONS = ("create", "apply")  # both make the job run; get/patch/delete act on an object that is not here
_PLACEHOLDER = "eksflow-placeholder"  # stands in for every {{...}} when a manifest is checked before the run
_SHELL_SAFE = re.compile(r"[\w@%+=:,./\-]+")  # what a shell word carries unquoted (shlex's safe set)


class LocalExecutorError(Exception):
    """A manifest or run folder the local executor cannot run; the message names the field and the fix."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped run `name`: its tasks were killed and status.json says Failed, "interrupted" (resumable)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


_fields = FieldReader(LocalExecutorError, _HINTS)


@dataclass
class NodeStatus:
    """One DAG task of a local run, as `argo get` would show it."""

    name: str
    template: str
    phase: str  # Pending | Running | Succeeded | Failed | Error | Skipped | Omitted
    message: str = ""
    exit_code: int | None = None
    started_at: str | None = None  # ISO 8601 UTC
    finished_at: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    progress: str | None = None  # last "N/M" from the task's ARGO_PROGRESS_FILE
    retries: int = 0
    log: Path | None = None


@dataclass
class RunResult:
    """The outcome of a local run."""

    name: str
    phase: str  # Succeeded | Failed | Error
    message: str
    run_dir: Path
    nodes: dict[str, NodeStatus]


# ---------------------------------------------------------------------------------------------------------------
# The manifest, checked and reduced to what a local run needs
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Input:
    name: str
    default: str | None


@dataclass(frozen=True)
class _Output:
    name: str
    path: str
    default: str | None


@dataclass(frozen=True)
class _Mount:
    mount_path: str
    scope: str  # "state" (a PVC: shared by all runs) | "run"
    folder: str  # claim name or volume name
    sub_path: str


@dataclass(frozen=True)
class _Retry:
    limit: int
    policy: str
    expression: str | None
    backoff_s: float
    factor: float
    max_duration_s: float | None
    cap_s: float | None


@dataclass(frozen=True)
class _Container:
    name: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    mounts: tuple[_Mount, ...]
    inputs: tuple[_Input, ...]
    outputs: tuple[_Output, ...]
    retry: _Retry | None
    deadline_s: float | None


@dataclass(frozen=True)
class _Resource:
    name: str
    manifest: str  # YAML text with its {{...}} references: substituted for each attempt, then parsed (as Argo does)
    inputs: tuple[_Input, ...]
    retry: _Retry | None
    deadline_s: float | None


@dataclass(frozen=True)
class _Task:
    name: str
    template: str
    arguments: tuple[tuple[str, str], ...]
    depends: str | None
    when: str | None

    def needs(self) -> list[str]:
        return list(dict.fromkeys(t for t, _ in depends_references(self.depends))) if self.depends else []


@dataclass(frozen=True)
class _Dag:
    name: str
    tasks: dict[str, _Task]
    inputs: tuple[_Input, ...]
    fail_fast: bool
    handled: frozenset[str]  # tasks whose failure some depends expects (`t.Failed`): no fail fast, no DAG failure


@dataclass(frozen=True)
class _Workflow:
    name: str | None
    generate_name: str | None
    parameters: dict[str, str | None]
    entrypoint: _Dag
    on_exit: _Dag | None
    parallelism: int | None
    deadline_s: float | None
    containers: dict[str, _Container]
    resources: dict[str, _Resource]

    def template(self, name: str) -> _Container | _Resource:
        return self.containers[name] if name in self.containers else self.resources[name]


def _duration_s(value: Any, where: str) -> float:
    """Argo durations: int seconds, "30", or Go style "5s", "1m30s", "500ms", "2h"."""
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    if not text or _GO_DURATION.sub("", text):
        raise LocalExecutorError(f"{where} must be a duration such as 30, '5s', '1m30s' or '2h', got {value!r}")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(amount) * scale[unit] for amount, unit in _GO_DURATION.findall(text))


def _parse_inputs(template: Mapping[str, Any], where: str) -> tuple[_Input, ...]:
    inputs = _fields.mapping(template.get("inputs"), f"{where}.inputs")
    _fields.check_keys(inputs, f"{where}.inputs", {"parameters"})
    parsed = []
    for i, param in enumerate(_fields.mappings(inputs.get("parameters"), f"{where}.inputs.parameters")):
        at = f"{where}.inputs.parameters[{i}]"
        _fields.check_keys(param, at, {"name", "default", "value", "description", "enum"})
        # A template input's `value` is a fixed value; locally it behaves like a default the task may override.
        default = _fields.optional_text(param, "default", at)
        parsed.append(
            _Input(_fields.text(param.get("name"), f"{at}.name"), _fields.optional_text(param, "value", at) or default)
        )
    return tuple(parsed)


def _parse_retry(raw: Any, where: str) -> _Retry | None:
    if raw is None:
        return None
    retry = _fields.mapping(raw, where)
    _fields.check_keys(retry, where, {"limit", "retryPolicy", "backoff", "expression"}, frozenset({"affinity"}))
    if retry.get("limit") is None:
        # Argo retries forever without a limit; locally that spins on a broken step, so the limit is required.
        raise LocalExecutorError(f"{where}.limit is required locally (retries are unbounded without it)")
    limit = int(_fields.number(retry["limit"], f"{where}.limit"))
    expression = _fields.optional_text(retry, "expression", where)
    # Argo >= 3.5: without a policy the expression alone decides (Always); otherwise OnFailure is the default.
    policy = _fields.optional_text(retry, "retryPolicy", where) or ("Always" if expression else "OnFailure")
    if policy not in _RETRY_POLICIES:
        raise LocalExecutorError(f"{where}.retryPolicy must be one of {', '.join(_RETRY_POLICIES)}, got {policy!r}")
    backoff = _fields.mapping(retry.get("backoff"), f"{where}.backoff")
    _fields.check_keys(backoff, f"{where}.backoff", {"duration", "factor", "maxDuration", "cap"})
    at = f"{where}.backoff"
    return _Retry(
        limit=limit,
        policy=policy,
        expression=expression,
        backoff_s=_duration_s(backoff.get("duration", 0), f"{at}.duration"),
        factor=_fields.number(backoff.get("factor", 1), f"{at}.factor"),
        max_duration_s=None if backoff.get("maxDuration") is None else _duration_s(backoff["maxDuration"], at),
        cap_s=None if backoff.get("cap") is None else _duration_s(backoff["cap"], f"{at}.cap"),
    )


def _parse_volumes(spec: Mapping[str, Any], where: str) -> dict[str, tuple[str, str]]:
    """Volume name -> (scope, folder): a PVC is shared by all runs, anything else belongs to this run."""
    volumes: dict[str, tuple[str, str]] = {}
    for i, volume in enumerate(_fields.mappings(spec.get("volumes"), f"{where}.volumes")):
        name = _fields.text(volume.get("name"), f"{where}.volumes[{i}].name")
        claim = _fields.mapping(volume.get("persistentVolumeClaim"), f"{where}.volumes[{i}].persistentVolumeClaim")
        if claim:
            volumes[name] = (
                "state",
                _fields.text(claim.get("claimName"), f"{where}.volumes[{i}].persistentVolumeClaim"),
            )
        else:
            volumes[name] = ("run", name)
    for i, claim_template in enumerate(
        _fields.mappings(spec.get("volumeClaimTemplates"), f"{where}.volumeClaimTemplates")
    ):
        metadata = _fields.mapping(claim_template.get("metadata"), f"{where}.volumeClaimTemplates[{i}].metadata")
        name = _fields.text(metadata.get("name"), f"{where}.volumeClaimTemplates[{i}].metadata.name")
        volumes[name] = ("run", name)  # Argo creates (and deletes) this claim per workflow
    return volumes


def _parse_container(template: Mapping[str, Any], where: str, spec_volumes: dict[str, tuple[str, str]]) -> _Container:
    name = _fields.text(template.get("name"), f"{where}.name")
    container = _fields.mapping(template["container"], f"{where}.container")
    at = f"{where}.container"
    _fields.check_keys(container, at, {"name", "command", "args", "env", "volumeMounts"}, _CLUSTER_ONLY_CONTAINER)
    command = tuple(_fields.text(c, f"{at}.command[{i}]") for i, c in enumerate(container.get("command") or []))
    if not command:
        raise LocalExecutorError(f"{at}.command is required locally: the image's entrypoint is unknown here")
    args = tuple(_fields.text(a, f"{at}.args[{i}]") for i, a in enumerate(container.get("args") or []))
    volumes = {**spec_volumes, **_parse_volumes(template, where)}
    mounts = []
    for i, mount in enumerate(_fields.mappings(container.get("volumeMounts"), f"{at}.volumeMounts")):
        m_at = f"{at}.volumeMounts[{i}]"
        _fields.check_keys(mount, m_at, {"name", "mountPath", "subPath", "readOnly"}, frozenset({"mountPropagation"}))
        volume = _fields.text(mount.get("name"), f"{m_at}.name")
        if volume not in volumes:
            raise LocalExecutorError(
                f"{m_at}.name {volume!r} matches no volume in the template's volumes, spec.volumes or "
                "spec.volumeClaimTemplates; declare the volume"
            )
        scope, folder = volumes[volume]
        mount_path = _fields.text(mount.get("mountPath"), f"{m_at}.mountPath").rstrip("/")
        if not mount_path.startswith("/"):
            raise LocalExecutorError(f"{m_at}.mountPath must be absolute, got {mount_path!r}")
        mounts.append(_Mount(mount_path, scope, folder, _fields.optional_text(mount, "subPath", m_at) or ""))
    outputs_spec = _fields.mapping(template.get("outputs"), f"{where}.outputs")
    _fields.check_keys(outputs_spec, f"{where}.outputs", {"parameters"})
    outputs = []
    for i, param in enumerate(_fields.mappings(outputs_spec.get("parameters"), f"{where}.outputs.parameters")):
        p_at = f"{where}.outputs.parameters[{i}]"
        _fields.check_keys(param, p_at, {"name", "valueFrom", "description"})
        value_from = _fields.mapping(param.get("valueFrom"), f"{p_at}.valueFrom")
        _fields.check_keys(value_from, f"{p_at}.valueFrom", {"path", "default"})
        path = _fields.text(value_from.get("path"), f"{p_at}.valueFrom.path")
        if not path.startswith("/"):
            raise LocalExecutorError(f"{p_at}.valueFrom.path must be absolute, got {path!r}")
        outputs.append(
            _Output(
                _fields.text(param.get("name"), f"{p_at}.name"),
                path,
                _fields.optional_text(value_from, "default", p_at),
            )
        )
    deadline = template.get("activeDeadlineSeconds")
    return _Container(
        name=name,
        command=command,
        args=args,
        env=_fields.env(container, at),
        mounts=tuple(mounts),
        inputs=_parse_inputs(template, where),
        outputs=tuple(outputs),
        retry=_parse_retry(template.get("retryStrategy"), f"{where}.retryStrategy"),
        deadline_s=None if deadline is None else _fields.number(deadline, f"{where}.activeDeadlineSeconds"),
    )


def _parse_resource(template: Mapping[str, Any], where: str) -> _Resource:
    name = _fields.text(template.get("name"), f"{where}.name")
    if template.get("outputs") is not None:
        raise LocalExecutorError(
            f"{where}.outputs is not supported locally on a resource template (jsonPath/jqFilter read the live "
            "object); have the job write files to a volume and publish them with a container task"
        )
    resource = _fields.mapping(template["resource"], f"{where}.resource")
    at = f"{where}.resource"
    # Locally the job's process decides the phase (exit 0: Succeeded), so the conditions are read but not evaluated.
    _fields.check_keys(
        resource, at, {"action", "manifest", "successCondition", "failureCondition", "setOwnerReference"}
    )
    for key in ("successCondition", "failureCondition"):
        _fields.optional_text(resource, key, at)
    action = _fields.text(resource.get("action"), f"{at}.action")
    if action not in _RESOURCE_ACTIONS:
        raise LocalExecutorError(
            f"{at}.action {action!r} is not supported locally; only {' and '.join(_RESOURCE_ACTIONS)} run a job here"
        )
    manifest = _fields.text(resource.get("manifest"), f"{at}.manifest")
    try:
        job = resources.describe(_REFERENCE.sub(_PLACEHOLDER, manifest), f"{at}.manifest")
    except resources.ResourceError as exc:
        raise LocalExecutorError(str(exc)) from None
    if job.refusal:  # its kind is never templated, so a cluster-only job is known now, before any task runs
        raise LocalExecutorError(f"template {name!r}: {job.refusal}")
    deadline = template.get("activeDeadlineSeconds")
    return _Resource(
        name=name,
        manifest=manifest,
        inputs=_parse_inputs(template, where),
        retry=_parse_retry(template.get("retryStrategy"), f"{where}.retryStrategy"),
        deadline_s=None if deadline is None else _fields.number(deadline, f"{where}.activeDeadlineSeconds"),
    )


def _parse_dag(template: Mapping[str, Any], where: str, runnable: Mapping[str, Any]) -> _Dag:
    dag = _fields.mapping(template["dag"], f"{where}.dag")
    _fields.check_keys(dag, f"{where}.dag", {"tasks", "failFast"})
    tasks: dict[str, _Task] = {}
    for i, raw in enumerate(_fields.mappings(dag.get("tasks"), f"{where}.dag.tasks")):
        at = f"{where}.dag.tasks[{i}]"
        _fields.check_keys(raw, at, {"name", "template", "arguments", "depends", "dependencies", "when"})
        name = _fields.text(raw.get("name"), f"{at}.name")
        if name in tasks:
            raise LocalExecutorError(f"{at}.name {name!r} is used twice in DAG {template.get('name')!r}")
        target = _fields.text(raw.get("template"), f"{at}.template")
        if target not in runnable:
            raise LocalExecutorError(
                f"{at}.template {target!r} is not a container or resource template of this workflow "
                "(nested DAGs and missing templates are not supported locally)"
            )
        arguments = _fields.mapping(raw.get("arguments"), f"{at}.arguments")
        _fields.check_keys(arguments, f"{at}.arguments", {"parameters"})
        params = []
        for j, param in enumerate(_fields.mappings(arguments.get("parameters"), f"{at}.arguments.parameters")):
            p_at = f"{at}.arguments.parameters[{j}]"
            _fields.check_keys(param, p_at, {"name", "value", "description"})
            if param.get("value") is None:
                raise LocalExecutorError(f"{p_at}.value is required")
            params.append(
                (_fields.text(param.get("name"), f"{p_at}.name"), _fields.text(param["value"], f"{p_at}.value"))
            )
        depends = _fields.optional_text(raw, "depends", at)
        if raw.get("dependencies") is not None:
            if depends is not None:
                raise LocalExecutorError(f"{at} sets both depends and dependencies; use depends only")
            deps = [_fields.text(d, f"{at}.dependencies[{j}]") for j, d in enumerate(raw["dependencies"])]
            depends = dependencies_to_depends(deps) or None
        tasks[name] = _Task(name, target, tuple(params), depends, _fields.optional_text(raw, "when", at))
    if not tasks:
        raise LocalExecutorError(f"{where}.dag.tasks is empty")
    handled: set[str] = set()
    for name, task in tasks.items():
        try:
            needs = task.needs()
            handled |= depends_on_failure(task.depends or "")
        except ExpressionError as exc:
            raise LocalExecutorError(f"task {name!r}: {exc}") from None
        for need in needs:
            if need not in tasks:
                raise LocalExecutorError(f"task {name!r} depends on {need!r}, which is not a task of this DAG")
    ancestors = _ancestors(tasks)
    for name, task in tasks.items():
        texts = [value for _, value in task.arguments] + ([task.when] if task.when else [])
        for ref in sorted({m for text in texts for m in _TASK_REFERENCE.findall(text)}):
            if ref in tasks and ref not in ancestors[name]:
                raise LocalExecutorError(
                    f"task {name!r} reads tasks.{ref} but does not depend on {ref!r}; add it to depends "
                    "(Hera: `a >> b`), or the value may not exist yet"
                )
    fail_fast = dag.get("failFast", True)
    return _Dag(
        str(template["name"]), tasks, _parse_inputs(template, where), fail_fast is not False, frozenset(handled)
    )


def _ancestors(tasks: Mapping[str, _Task]) -> dict[str, set[str]]:
    """Every task's transitive dependencies; raises on a cycle."""
    result: dict[str, set[str]] = {}
    visiting: list[str] = []

    def visit(name: str) -> set[str]:
        if name in result:
            return result[name]
        if name in visiting:
            cycle = " -> ".join([*visiting[visiting.index(name) :], name])
            raise LocalExecutorError(f"the DAG has a dependency cycle: {cycle}")
        visiting.append(name)
        found: set[str] = set()
        for need in tasks[name].needs():
            found |= {need, *visit(need)}
        visiting.pop()
        result[name] = found
        return found

    for name in tasks:
        visit(name)
    return result


def parse_manifest(manifest: Mapping[str, Any]) -> _Workflow:
    """Check that the manifest is within the locally supported subset; raise LocalExecutorError otherwise."""
    if manifest.get("kind") != "Workflow":
        raise LocalExecutorError(f"kind must be 'Workflow', got {manifest.get('kind')!r}; compile with Workflow")
    metadata = _fields.mapping(manifest.get("metadata"), "metadata")
    name = _fields.optional_text(metadata, "name", "metadata")
    generate_name = _fields.optional_text(metadata, "generateName", "metadata")
    if not name and not generate_name:
        raise LocalExecutorError("metadata.name or metadata.generateName is required")
    spec = _fields.mapping(manifest.get("spec"), "spec")
    used = {"entrypoint", "arguments", "templates", "onExit", "parallelism", "activeDeadlineSeconds", "volumes"}
    _fields.check_keys(spec, "spec", used | {"volumeClaimTemplates"}, _CLUSTER_ONLY_SPEC)
    spec_volumes = _parse_volumes(spec, "spec")
    raw_templates = _fields.mappings(spec.get("templates"), "spec.templates")
    kinds: dict[str, tuple[str, str, Mapping[str, Any]]] = {}
    for i, template in enumerate(raw_templates):
        where = f"spec.templates[{i}]"
        kind = next((k for k in ("dag", "container", "resource") if k in template), "")
        used_keys = {"name", "inputs", "outputs", kind}
        if kind in ("container", "resource"):
            used_keys |= {"retryStrategy", "activeDeadlineSeconds"}
        if kind == "container":
            used_keys |= {"volumes"}
        _fields.check_keys(template, where, used_keys, _CLUSTER_ONLY_TEMPLATE)
        if not kind:
            raise LocalExecutorError(f"{where} has none of dag, container or resource; only those run locally")
        tname = _fields.text(template.get("name"), f"{where}.name")
        if tname in kinds:
            raise LocalExecutorError(f"{where}.name {tname!r} is used by two templates")
        kinds[tname] = (kind, where, template)
    containers = {
        n: _parse_container(t, where, spec_volumes) for n, (kind, where, t) in kinds.items() if kind == "container"
    }
    resource_templates = {n: _parse_resource(t, where) for n, (kind, where, t) in kinds.items() if kind == "resource"}

    def dag_named(field_name: str, template_name: str) -> _Dag:
        if template_name not in kinds:
            raise LocalExecutorError(f"{field_name} {template_name!r} names no template in spec.templates")
        kind, where, template = kinds[template_name]
        if kind == "dag":
            return _parse_dag(template, where, {**containers, **resource_templates})
        if field_name == "spec.entrypoint":
            raise LocalExecutorError(f"spec.entrypoint {template_name!r} must be a dag template locally")
        # A container exit handler runs as a one-task DAG whose task is named after the handler node.
        return _Dag(
            template_name, {EXIT_HANDLER: _Task(EXIT_HANDLER, template_name, (), None, None)}, (), True, frozenset()
        )

    entrypoint = dag_named("spec.entrypoint", _fields.text(spec.get("entrypoint"), "spec.entrypoint"))
    on_exit = (
        None if spec.get("onExit") is None else dag_named("spec.onExit", _fields.text(spec["onExit"], "spec.onExit"))
    )
    arguments = _fields.mapping(spec.get("arguments"), "spec.arguments")
    _fields.check_keys(arguments, "spec.arguments", {"parameters"})
    parameters: dict[str, str | None] = {}
    for i, param in enumerate(_fields.mappings(arguments.get("parameters"), "spec.arguments.parameters")):
        at = f"spec.arguments.parameters[{i}]"
        _fields.check_keys(param, at, {"name", "value", "description", "enum"})
        parameters[_fields.text(param.get("name"), f"{at}.name")] = _fields.optional_text(param, "value", at)
    parallelism = spec.get("parallelism")
    deadline = spec.get("activeDeadlineSeconds")
    return _Workflow(
        name=name,
        generate_name=generate_name,
        parameters=parameters,
        entrypoint=entrypoint,
        on_exit=on_exit,
        parallelism=None if parallelism is None else max(int(_fields.number(parallelism, "spec.parallelism")), 1),
        deadline_s=None if deadline is None else _fields.number(deadline, "spec.activeDeadlineSeconds"),
        containers=containers,
        resources=resource_templates,
    )


# ---------------------------------------------------------------------------------------------------------------
# Substitution and path mapping
# ---------------------------------------------------------------------------------------------------------------


class _UnresolvedError(Exception):
    """A `{{...}}` reference with no value; the message names it."""


def substitute(text: str, lookup: Callable[[str], str]) -> str:
    """Replace every `{{ ref }}` in ONE pass: a substituted value is never scanned again."""
    return _REFERENCE.sub(lambda m: lookup(m.group(1)), text)


class PathMap:
    """Maps container path prefixes to host folders (and back) wherever a path starts inside a string."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._forward = dict(pairs)
        self._backward: dict[str, str] = {}
        for container, host in pairs:
            self._backward.setdefault(host, container)
        self._forward_re = self._pattern(self._forward)
        self._backward_re = self._pattern(self._backward)

    @staticmethod
    def _pattern(prefixes: Mapping[str, str]) -> re.Pattern[str] | None:
        if not prefixes:
            return None
        # Longest first so /tmp/outputs/sub wins over /tmp/outputs; one alternation so nothing maps twice. The
        # lookarounds keep /data/fsx/x and /fsx-old untouched while --dir=/fsx/a and sqlite:////fsx/db map.
        alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
        return re.compile(rf"(?<![\w.\-])({alternatives})(?=/|$|[^\w.\-])")

    def to_host(self, text: str) -> str:
        """Container paths in `text` -> host paths."""
        pattern = self._forward_re
        return text if pattern is None else pattern.sub(lambda m: self._forward[m.group(1)], text)

    def to_container(self, text: str) -> str:
        """Host paths in `text` -> container paths."""
        pattern = self._backward_re
        return text if pattern is None else pattern.sub(lambda m: self._backward[m.group(1)], text)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _short(text: str) -> str:
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL whatever is left after `grace_s` (a pod's termination, locally)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _kill_session(sid: int) -> None:
    """SIGKILL what is left of the session `sid` in other process groups.

    mpirun gives each rank a process group of its own, so the ranks would outlive an mpirun killed by SIGKILL.
    """
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            session = int(stat.read_text(encoding="utf-8").rpartition(")")[2].split()[3])  # after state ppid pgrp
        except (OSError, ValueError, IndexError):
            continue
        if session == sid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(stat.parent.name), signal.SIGKILL)


def _shell_unsafe(command: str, pairs: list[tuple[str, str]]) -> str:
    """A host folder that mapping would splice into the shell text `command` but is no plain shell word ("" if none)."""
    for mount_path, host in pairs:
        if not _SHELL_SAFE.fullmatch(host) and PathMap([(mount_path, host)]).to_host(command) != command:
            return host
    return ""


def _python_shims(folder: Path) -> Path:
    """`python` and `python3` that exec this interpreter, so a shell entrypoint's `python` is the project's."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        shim = folder / name
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n', encoding="utf-8")
        shim.chmod(0o755)
    return folder


@dataclass
class _Attempt:
    phase: str
    exit_code: int | None
    message: str
    duration_s: float
    retriable: bool = True  # False: the same inputs would fail the same way (an unresolved reference, a refusal)


# ---------------------------------------------------------------------------------------------------------------
# A run
# ---------------------------------------------------------------------------------------------------------------


class _Run:
    def __init__(
        self,
        workflow: _Workflow,
        *,
        name: str,
        uid: str,
        parameters: dict[str, str],
        state_dir: Path,
        run_dir: Path,
        cwd: Path,
        env: Mapping[str, str] | None,
        console: Console | None,
        nodes: dict[str, NodeStatus],
        started_at: str,
    ) -> None:
        self.wf = workflow
        self.name = name
        self.uid = uid
        self.parameters = parameters
        self.state_dir = state_dir
        self.run_dir = run_dir
        self.cwd = cwd
        self.env = dict(env or {})
        self.nodes = nodes
        self.started_at = started_at
        self.phase = "Running"
        self.message = ""
        self.finished_at: str | None = None
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.abort = threading.Event()
        self.abort_reason = ""
        self.running: dict[str, threading.Thread] = {}
        self.display = TaskDisplay(console, lambda: list(self.nodes.values()))

    # -- status ----------------------------------------------------------------------------------------------

    def write_status(self) -> None:
        with self.lock:
            nodes = {
                key: {
                    "displayName": node.name,
                    "templateName": node.template,
                    "phase": node.phase,
                    "message": node.message,
                    "exitCode": node.exit_code,
                    "startedAt": node.started_at,
                    "finishedAt": node.finished_at,
                    "progress": node.progress,
                    "retries": node.retries,
                    "outputs": {"parameters": [{"name": k, "value": v} for k, v in node.outputs.items()]},
                }
                for key, node in self.nodes.items()
            }
            status = {
                "metadata": {"name": self.name, "uid": self.uid, "namespace": NAMESPACE},
                "spec": {"arguments": {"parameters": [{"name": k, "value": v} for k, v in self.parameters.items()]}},
                "status": {
                    "phase": self.phase,
                    "startedAt": self.started_at,
                    "finishedAt": self.finished_at,
                    "message": self.message,
                    "nodes": nodes,
                },
            }
            _atomic_write(self.run_dir / "status.json", json.dumps(status, indent=2, ensure_ascii=False))

    def _set(self, key: str, phase: str, message: str = "", **fields: Any) -> None:
        with self.changed:
            node = self.nodes[key]
            node.phase = phase
            node.message = _short(message)
            for name, value in fields.items():
                setattr(node, name, value)
            if phase == "Running" and node.started_at is None:
                node.started_at = _now()
            if phase in COMPLETED_PHASES:
                node.finished_at = _now()
                self.running.pop(key, None)
            self.write_status()
            self.display.phase_changed(node)
            self.changed.notify_all()

    def _poll_progress(self) -> None:
        changed = False
        with self.lock:
            for key in list(self.running):
                progress_file = self.run_dir / "tasks" / key / "progress"
                with contextlib.suppress(OSError):
                    value = progress_file.read_text(encoding="utf-8", errors="replace").strip()[:40]
                    if value and value != self.nodes[key].progress:
                        self.nodes[key].progress = value
                        changed = True
            if changed:
                self.write_status()

    # -- references ------------------------------------------------------------------------------------------

    def _lookup(
        self,
        ref: str,
        *,
        inputs: Mapping[str, str],
        prefix: str | None = None,
        retries: int | None = None,
        workflow_status: str | None = None,
    ) -> str:
        parts = ref.split(".")
        head, rest = parts[0], ".".join(parts[1:])
        if head == "workflow":
            if rest in ("name", "uid", "namespace"):
                return {"name": self.name, "uid": self.uid, "namespace": NAMESPACE}[rest]
            if rest.startswith("parameters.") and rest.removeprefix("parameters.") in self.parameters:
                return self.parameters[rest.removeprefix("parameters.")]
            if rest == "status" and workflow_status is not None:
                return workflow_status
        elif head == "inputs" and rest.startswith("parameters.") and rest.removeprefix("parameters.") in inputs:
            return inputs[rest.removeprefix("parameters.")]
        elif head == "retries" and not rest and retries is not None:
            return str(retries)
        elif head == "tasks" and prefix is not None and len(parts) >= 3:
            node = self.nodes.get(prefix + parts[1])
            if node is None:
                raise _UnresolvedError(f"{{{{{ref}}}}}: there is no task {parts[1]!r} in this DAG")
            if parts[2:] == ["status"]:
                return node.phase
            if parts[2:4] == ["outputs", "parameters"] and len(parts) == 5:
                if parts[4] in node.outputs:
                    return node.outputs[parts[4]]
                have = ", ".join(node.outputs) or "none"
                raise _UnresolvedError(
                    f"{{{{{ref}}}}}: task {parts[1]!r} ({node.phase}) has no output parameter {parts[4]!r} "
                    f"(it has: {have})"
                )
        raise _UnresolvedError(f"unresolved reference {{{{{ref}}}}}: no such value here")

    # -- scheduling ------------------------------------------------------------------------------------------

    def _failures(self, dag: _Dag, prefix: str) -> list[str]:
        return [
            name
            for name in dag.tasks
            if self.nodes[prefix + name].phase in ("Failed", "Error") and name not in dag.handled
        ]

    def _limit_reached(self) -> bool:
        return self.wf.parallelism is not None and len(self.running) >= self.wf.parallelism

    def run_dag(self, dag: _Dag, prefix: str, workflow_status: str | None, deadline_s: float | None) -> None:
        """Run every task of `dag` whose node is not already Succeeded, until none can start."""
        inputs = _dag_inputs(dag, self.parameters)
        pending = [name for name in dag.tasks if self.nodes[prefix + name].phase != "Succeeded"]
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        while True:
            with self.changed:
                stopped = self.abort.is_set() or (dag.fail_fast and bool(self._failures(dag, prefix)))
                for name in list(pending):
                    if stopped or self._limit_reached():
                        break
                    task = dag.tasks[name]
                    if any(self.nodes[prefix + need].phase not in COMPLETED_PHASES for need in task.needs()):
                        continue
                    pending.remove(name)
                    self._start(dag, prefix, task, inputs, workflow_status)
                    stopped = self.abort.is_set() or (dag.fail_fast and bool(self._failures(dag, prefix)))
                if not self.running:
                    # Nothing runs, so nothing can complete and make another task ready: this DAG is done.
                    break
                self.changed.wait(_TICK_S)
            self._poll_progress()
            if deadline is not None and time.monotonic() > deadline and not self.abort.is_set():
                self.stop(f"workflow exceeded spec.activeDeadlineSeconds={deadline_s:g}")
        failures = self._failures(dag, prefix)
        for name in pending:
            if self.abort.is_set():
                reason = f"not run: {self.abort_reason}"
            elif failures:
                reason = f"not run: fail fast after {', '.join(failures)} failed"
            else:
                reason = "not run"
            self._set(prefix + name, "Omitted", reason)

    def _start(
        self, dag: _Dag, prefix: str, task: _Task, dag_inputs: dict[str, str], workflow_status: str | None
    ) -> None:
        key = prefix + task.name
        try:
            if task.depends:
                phases = {need: self.nodes[prefix + need].phase for need in task.needs()}
                if not evaluate_depends(task.depends, phases):
                    self._set(key, "Omitted", f"depends {task.depends!r} is false")
                    return

            def lookup(ref: str) -> str:
                return self._lookup(ref, inputs=dag_inputs, prefix=prefix, workflow_status=workflow_status)

            if task.when:
                condition = substitute(task.when, lookup)
                if not evaluate_when(condition):
                    self._set(key, "Skipped", f"when {condition!r} evaluated to false")
                    return
            arguments = {name: substitute(value, lookup) for name, value in task.arguments}
            template = self.wf.template(task.template)
            inputs = {}
            for param in template.inputs:
                value = arguments.get(param.name, param.default)
                if value is None:
                    raise _UnresolvedError(
                        f"input parameter {param.name!r} of template {template.name!r} has no value; pass it in "
                        "the task's arguments.parameters or give it a default"
                    )
                inputs[param.name] = value
        except (_UnresolvedError, ExpressionError) as exc:
            self._set(key, "Error", str(exc))
            return
        thread = threading.Thread(
            target=self._task_thread, args=(key, template, inputs, workflow_status), name=f"task-{key}", daemon=True
        )
        self.running[key] = thread
        self._set(key, "Running", "", retries=0, exit_code=None, outputs={}, progress=None, finished_at=None)
        thread.start()

    def stop(self, reason: str) -> None:
        """Stop the run: running tasks are killed (they end Failed with `reason`) and nothing new starts."""
        with self.lock:
            if not self.abort.is_set():
                self.abort_reason = reason
                self.abort.set()

    def wait_for_tasks(self) -> None:
        """Join the task threads (each kills its own process group when the run is stopped)."""
        for thread in list(self.running.values()):
            thread.join(KILL_GRACE_S + 5)

    # -- one task --------------------------------------------------------------------------------------------

    def _task_thread(
        self, key: str, template: _Container | _Resource, inputs: dict[str, str], status: str | None
    ) -> None:
        try:
            phase, message, exit_code, outputs = self._run_task(key, template, inputs, status)
        except Exception as exc:  # a bug here must end the node, or the scheduler would wait for it forever
            phase, message, exit_code, outputs = "Error", f"local executor error: {exc!r}", None, {}
        self._set(key, phase, message, exit_code=exit_code, outputs=outputs)

    def _mount_pairs(self, mounts: tuple[_Mount, ...]) -> list[tuple[str, str]]:
        """(mount path, host folder) of each mount; the folders are created."""
        pairs = []
        for mount in mounts:
            root = self.state_dir / "volumes" if mount.scope == "state" else self.run_dir / "volumes"
            host = root / mount.folder / mount.sub_path if mount.sub_path else root / mount.folder
            host.mkdir(parents=True, exist_ok=True)
            pairs.append((mount.mount_path, str(host)))
        return pairs

    def _run_task(
        self, key: str, template: _Container | _Resource, inputs: dict[str, str], workflow_status: str | None
    ) -> tuple[str, str, int | None, dict[str, str]]:
        task_dir = self.run_dir / "tasks" / key
        task_dir.mkdir(parents=True, exist_ok=True)
        retry = template.retry
        first_start = time.monotonic()
        attempt = 0
        while True:

            def lookup(ref: str, retries: int = attempt) -> str:
                return self._lookup(ref, inputs=inputs, retries=retries, workflow_status=workflow_status)

            (task_dir / "progress").unlink(missing_ok=True)
            if isinstance(template, _Container):
                result, outputs = self._container_attempt(key, attempt, template, lookup, task_dir)
            else:
                result, outputs = self._resource_attempt(key, attempt, template, lookup, task_dir), {}
            if result.phase == "Succeeded" or self.abort.is_set() or not result.retriable:
                return result.phase, result.message, result.exit_code, outputs
            retry_in, why_not = self._retry_delay(retry, attempt, result, first_start, lookup)
            if retry_in is None:
                return result.phase, result.message + why_not, result.exit_code, outputs
            assert retry is not None  # _retry_delay returns a delay only with a retryStrategy
            attempt += 1
            self._set(
                key,
                "Running",
                f"{result.message}; retry {attempt}/{retry.limit} in {format_duration(retry_in)}",
                retries=attempt,
                exit_code=result.exit_code,
            )
            if self.abort.wait(retry_in):
                return result.phase, f"{result.message}; not retried: {self.abort_reason}", result.exit_code, outputs

    def _container_attempt(
        self, key: str, attempt: int, container: _Container, lookup: Callable[[str], str], task_dir: Path
    ) -> tuple[_Attempt, dict[str, str]]:
        try:
            output_paths = {output.name: substitute(output.path, lookup) for output in container.outputs}
            pairs = self._mount_pairs(container.mounts)
            mounted = [m.mount_path for m in container.mounts]
            for path in output_paths.values():
                folder = posixpath.dirname(path)
                # An output written into a mounted volume is read from that volume, as Argo does.
                if not any(folder == m or folder.startswith(m + "/") for m in mounted):
                    pairs.append((folder, str(task_dir / "outputs")))
            paths = PathMap(pairs)
            argv = [paths.to_host(substitute(a, lookup)) for a in (*container.command, *container.args)]
            env = {n: paths.to_host(substitute(v, lookup)) for n, v in container.env}
        except _UnresolvedError as exc:
            return _Attempt("Error", None, str(exc), 0.0, retriable=False), {}
        if _PYTHON.fullmatch(os.path.basename(argv[0])):
            argv[0] = sys.executable  # the project's environment, not whatever `python` is on PATH
        shutil.rmtree(task_dir / "outputs", ignore_errors=True)  # a fresh pod: no stale outputs
        (task_dir / "outputs").mkdir(parents=True, exist_ok=True)
        result = self._attempt(key, attempt, argv, env=env, task_dir=task_dir, deadline_s=container.deadline_s)
        outputs, missing = self._read_outputs(container.outputs, output_paths, paths)
        if result.phase == "Succeeded" and missing:
            result.phase, result.message = "Failed", missing
        return result, outputs

    def _resource_attempt(
        self, key: str, attempt: int, template: _Resource, lookup: Callable[[str], str], task_dir: Path
    ) -> _Attempt:
        where = f"template {template.name!r}: resource.manifest"
        try:
            job = resources.describe(substitute(template.manifest, lookup), where)
        except (_UnresolvedError, resources.ResourceError) as exc:
            return _Attempt("Error", None, str(exc), 0.0, retriable=False)
        if job.note:  # nothing to do here (a PodGroup)
            return _Attempt("Succeeded", None, job.note, 0.0)
        refusal = resources.refusal(job)
        if refusal:  # no retry can add a GPU: fail once, before anything starts
            return _Attempt("Failed", None, refusal, 0.0, retriable=False)
        mounts = tuple(
            _Mount(m.mount_path, "run" if m.claim is None else "state", m.claim or m.volume, m.sub_path)
            for m in job.mounts
        )
        pairs = self._mount_pairs(mounts)
        unsafe = "" if job.argv else _shell_unsafe(job.entrypoint, pairs)
        if unsafe:
            return _Attempt(
                "Error",
                None,
                f"{where}: the entrypoint would get the folder {unsafe!r}, which a shell command line cannot carry "
                "unquoted; use a --state-dir whose path has only letters, digits and @%+=:,./-",
                0.0,
                retriable=False,
            )
        paths = PathMap(pairs)
        env = {name: paths.to_host(value) for name, value in job.env}
        env["PATH"] = os.pathsep.join(
            [
                str(_python_shims(task_dir / "bin")),
                os.path.dirname(sys.executable),  # this environment's tools (ray, torchrun, mpirun) first
                env.get("PATH") or self.env.get("PATH") or os.environ.get("PATH", ""),
            ]
        )
        if job.prepare:
            env.update(job.prepare(task_dir))
        argv = [paths.to_host(item) for item in job.argv] or ["bash", "-c", paths.to_host(job.entrypoint)]
        deadlines = [d for d in (template.deadline_s, job.deadline_s) if d is not None]
        return self._attempt(
            key,
            attempt,
            argv,
            env=env,
            task_dir=task_dir,
            deadline_s=min(deadlines) if deadlines else None,
        )

    def _attempt(
        self, key: str, attempt: int, argv: list[str], *, env: dict[str, str], task_dir: Path, deadline_s: float | None
    ) -> _Attempt:
        log_path = self.run_dir / "logs" / f"{key}.log"
        with self.lock:
            self.nodes[key].log = log_path
        full_env = {
            **os.environ,
            **self.env,
            **env,
            "ARGO_PROGRESS_FILE": str(task_dir / "progress"),
            "PYTHONUNBUFFERED": "1",
        }
        started = time.monotonic()
        with open(log_path, "ab") as log:
            log.write(f"===== {key}: attempt {attempt + 1}, {_now()} =====\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=self.cwd,
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: killed as a whole, spared our Ctrl-C
                )
            except OSError as exc:
                return _Attempt("Error", None, f"cannot start {argv[0]!r}: {exc}", 0.0)
            killed_for = ""
            while True:
                try:
                    proc.wait(_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if self.abort.is_set():
                    killed_for = self.abort_reason
                elif deadline_s is not None and time.monotonic() - started > deadline_s:
                    killed_for = f"exceeded activeDeadlineSeconds={deadline_s:g}"
                if killed_for:
                    _kill_group(proc, KILL_GRACE_S)
                    break
            # Like a pod ending, the step's leftover children (daemons it did not stop) go with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            _kill_session(proc.pid)
        code = proc.returncode
        exit_code = 128 - code if code < 0 else code  # killed by signal N -> 128+N, as a container reports it
        duration = time.monotonic() - started
        if killed_for:
            return _Attempt("Failed", exit_code, killed_for, duration)
        if exit_code == 0:
            return _Attempt("Succeeded", 0, "", duration)
        return _Attempt("Failed", exit_code, self._exit_message(exit_code, log_path), duration)

    @staticmethod
    def _exit_message(exit_code: int, log_path: Path) -> str:
        last = ""
        with contextlib.suppress(OSError):
            lines = [line for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if line]
            last = lines[-1].strip() if lines and not lines[-1].startswith("=====") else ""
        return f"exit code {exit_code}" + (f": {_short(last)}" if last else "")

    @staticmethod
    def _read_outputs(
        declared: tuple[_Output, ...], output_paths: Mapping[str, str], paths: PathMap
    ) -> tuple[dict[str, str], str]:
        """Output values (host paths mapped back to container paths) and a message naming any missing file."""
        outputs: dict[str, str] = {}
        missing: list[str] = []
        for output in declared:
            host = Path(paths.to_host(output_paths[output.name]))
            if host.is_file():
                value = host.read_text(encoding="utf-8", errors="replace")
                # Argo trims one trailing newline "for user convenience"; `echo x > file` gives "x".
                outputs[output.name] = paths.to_container(value.removesuffix("\n"))
            elif output.default is not None:
                outputs[output.name] = output.default
            else:
                missing.append(
                    f"output parameter {output.name!r}: {output_paths[output.name]} was not written (host: {host})"
                )
        return outputs, "; ".join(missing)

    def _retry_delay(
        self, retry: _Retry | None, done: int, result: _Attempt, first_start: float, lookup: Callable[[str], str]
    ) -> tuple[float | None, str]:
        """Seconds to wait before the next attempt, or None and why no retry is made."""
        if retry is None or done >= retry.limit:
            return None, ""
        # Locally a non-zero exit is Failed; Error means the process could not even start (an infra error).
        retried_phases = {"Always": {"Failed", "Error"}, "OnFailure": {"Failed"}}.get(retry.policy, {"Error"})
        if result.phase not in retried_phases:
            return None, ""
        if retry.expression:
            variables = {
                "lastRetry.exitCode": "-1" if result.exit_code is None else str(result.exit_code),
                "lastRetry.status": result.phase,
                "lastRetry.duration": str(int(result.duration_s)),
                "lastRetry.message": result.message,
            }
            try:
                if not evaluate_retry_expression(substitute(retry.expression, lookup), variables):
                    return None, f"; not retried: {retry.expression!r} is false"
            except (ExpressionError, _UnresolvedError) as exc:
                return None, f"; not retried: {exc}"
        delay = retry.backoff_s * retry.factor**done
        if retry.cap_s is not None:
            delay = min(delay, retry.cap_s)
        if retry.max_duration_s is not None and time.monotonic() - first_start + delay > retry.max_duration_s:
            return None, f"; not retried: backoff.maxDuration={retry.max_duration_s:g}s reached"
        return delay, ""

    # -- the whole workflow ----------------------------------------------------------------------------------

    def execute(self) -> RunResult:
        with self.display:
            self.display.note(f"workflow {self.name}: {self.run_dir}")
            self.write_status()
            try:
                self.run_dag(self.wf.entrypoint, "", None, self.wf.deadline_s)
                failures = self._failures(self.wf.entrypoint, "")
                if self.abort.is_set():
                    self.phase, self.message = "Failed", self.abort_reason
                elif failures:
                    node = self.nodes[failures[0]]
                    self.phase, self.message = node.phase, f"child {node.name!r} failed: {node.message}"
                else:
                    self.phase = "Succeeded"
                if self.wf.on_exit is not None:
                    self._run_exit_handler(self.wf.on_exit)
            except KeyboardInterrupt:
                self.stop("interrupted")
                self.display.note(f"interrupted: stopping tasks (up to {KILL_GRACE_S:.0f} s)")
                # A second Ctrl-C here would leave tasks running and status.json stale; stopping is bounded.
                main = threading.current_thread() is threading.main_thread()
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
                try:
                    self.wait_for_tasks()
                finally:
                    if main:
                        signal.signal(signal.SIGINT, previous)
                with self.lock:
                    for key, node in self.nodes.items():
                        if node.phase == "Running":
                            self._set(key, "Failed", "interrupted")
                    self.phase, self.message = "Failed", "interrupted"
                    self.finished_at = _now()
                    self.write_status()
                raise RunInterrupted(self.name) from None
            self.finished_at = _now()
            self.write_status()
            self.display.note(f"workflow {self.name} {self.phase}{f': {self.message}' if self.message else ''}")
        return RunResult(
            self.name, self.phase, self.message, self.run_dir, {k: replace(n) for k, n in self.nodes.items()}
        )

    def _run_exit_handler(self, on_exit: _Dag) -> None:
        # The handler runs after a deadline too, so it gets a fresh stop signal (Ctrl-C still stops it).
        self.abort = threading.Event()
        prefix = "" if EXIT_HANDLER in on_exit.tasks else f"{EXIT_HANDLER}."
        self.run_dag(on_exit, prefix, self.phase, None)
        failures = self._failures(on_exit, prefix)
        if failures:
            node = self.nodes[prefix + failures[0]]
            self.phase = "Failed"
            self.message = "; ".join(m for m in (self.message, f"onExit {node.name!r} failed: {node.message}") if m)


def _node_keys(workflow: _Workflow) -> dict[str, tuple[str, str]]:
    """Node key -> (task name, template) for every node a run of `workflow` can have, in display order."""
    keys = {name: (name, task.template) for name, task in workflow.entrypoint.tasks.items()}
    if workflow.on_exit is not None:
        prefix = "" if EXIT_HANDLER in workflow.on_exit.tasks else f"{EXIT_HANDLER}."
        keys |= {prefix + name: (prefix + name, task.template) for name, task in workflow.on_exit.tasks.items()}
    return keys


def _fresh_nodes(workflow: _Workflow) -> dict[str, NodeStatus]:
    return {
        key: NodeStatus(name=name, template=template, phase="Pending")
        for key, (name, template) in _node_keys(workflow).items()
    }


def _dag_inputs(dag: _Dag, parameters: Mapping[str, str]) -> dict[str, str]:
    """A DAG template's inputs: the workflow parameters of the same name (as Argo does), else the defaults."""
    values: dict[str, str] = {}
    for param in dag.inputs:
        value = parameters.get(param.name, param.default)
        if value is None:
            raise LocalExecutorError(
                f"input parameter {param.name!r} of template {dag.name!r} has no value; add a workflow parameter "
                "of that name or a default"
            )
        values[param.name] = value
    return values


def _effective_parameters(workflow: _Workflow, overrides: Mapping[str, str] | None) -> dict[str, str]:
    values = dict(workflow.parameters)
    for name, value in (overrides or {}).items():
        if name not in values:
            known = ", ".join(values) or "none"
            raise LocalExecutorError(f"unknown workflow parameter {name!r}; known: {known}")
        values[name] = value
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise LocalExecutorError(f"workflow parameter(s) {', '.join(missing)} have no value; pass them in parameters=")
    effective = {name: str(value) for name, value in values.items()}
    for dag in (workflow.entrypoint, workflow.on_exit):
        if dag is not None:
            _dag_inputs(dag, effective)  # fail before anything runs
    return effective


def _new_name(workflow: _Workflow, runs: Path) -> str:
    if workflow.name:
        return workflow.name
    alphabet = string.ascii_lowercase + string.digits
    while True:
        name = f"{workflow.generate_name}{''.join(secrets.choice(alphabet) for _ in range(5))}"
        if not (runs / name).exists():
            return name


def _make_run_folders(run_dir: Path) -> None:
    for sub in ("logs", "tasks", "volumes"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)


def run_workflow(
    manifest: Mapping[str, Any],
    state_dir: Path,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    console: Console | None = None,
    parameters: Mapping[str, str] | None = None,
) -> RunResult:
    """Run a compiled Workflow manifest here; its folder is `state_dir/runs/<workflow name>/`.

    Ctrl-C stops the running tasks, records the run as Failed "interrupted" and raises RunInterrupted (as does
    resume_workflow); the run can then be resumed.
    """
    try:
        plain = json.loads(json.dumps(dict(manifest)))  # a private deep copy, and proof it is plain data
    except (TypeError, ValueError) as exc:
        raise LocalExecutorError(f"the manifest must be plain data (Workflow.to_dict()): {exc}") from None
    workflow = parse_manifest(plain)
    values = _effective_parameters(workflow, parameters)
    state_dir = state_dir.resolve()
    runs = state_dir / "runs"
    name = _new_name(workflow, runs)
    run_dir = runs / name
    if run_dir.exists():
        raise LocalExecutorError(
            f"run folder {run_dir} already exists (metadata.name {name!r} is fixed); resume it with "
            "resume_workflow, delete it, or use metadata.generateName"
        )
    _make_run_folders(run_dir)
    (run_dir / "manifest.yaml").write_text(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True), encoding="utf-8")
    run = _Run(
        workflow,
        name=name,
        uid=str(uuid.uuid4()),
        parameters=values,
        state_dir=state_dir,
        run_dir=run_dir,
        cwd=cwd,
        env=env,
        console=console,
        nodes=_fresh_nodes(workflow),
        started_at=_now(),
    )
    return run.execute()


def resume_workflow(
    run_dir: Path,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    console: Console | None = None,
) -> RunResult:
    """Re-run a finished run like `argo retry`: Succeeded tasks keep their outputs, the rest run again."""
    run_dir = run_dir.resolve()
    try:
        manifest = yaml.safe_load((run_dir / "manifest.yaml").read_text(encoding="utf-8"))
        saved = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise LocalExecutorError(
            f"{run_dir} is not a readable run folder (manifest.yaml, status.json): {exc}"
        ) from None
    workflow = parse_manifest(manifest)
    status = saved.get("status", {})
    if status.get("phase") == "Succeeded":
        raise LocalExecutorError(f"run {run_dir.name!r} already Succeeded; there is nothing to resume")
    saved_params = {p["name"]: p["value"] for p in saved.get("spec", {}).get("arguments", {}).get("parameters", [])}
    nodes = _fresh_nodes(workflow)
    for key, node in nodes.items():
        old = status.get("nodes", {}).get(key)
        if key in workflow.entrypoint.tasks and old and old.get("phase") == "Succeeded":
            node.phase = "Succeeded"
            node.message = old.get("message", "")
            node.exit_code = old.get("exitCode")
            node.started_at, node.finished_at = old.get("startedAt"), old.get("finishedAt")
            node.outputs = {p["name"]: p["value"] for p in old.get("outputs", {}).get("parameters", [])}
            node.progress, node.retries = old.get("progress"), old.get("retries", 0)
            log = run_dir / "logs" / f"{key}.log"
            node.log = log if log.exists() else None
    _make_run_folders(run_dir)
    run = _Run(
        workflow,
        name=saved.get("metadata", {}).get("name", run_dir.name),
        uid=saved.get("metadata", {}).get("uid") or str(uuid.uuid4()),
        parameters=_effective_parameters(workflow, saved_params),
        state_dir=run_dir.parent.parent,
        run_dir=run_dir,
        cwd=cwd,
        env=env,
        console=console,
        nodes=nodes,
        started_at=status.get("startedAt") or _now(),
    )
    return run.execute()
