"""The argo CLI's verbs against an Argo Server: list, get, logs (--follow), retry (-p), resubmit.

Each function takes an `ArgoServer` (eksflow.argo_client: ARGO_SERVER, ARGO_TOKEN, ARGO_NAMESPACE, ...) and returns
plain dataclasses for the CLI to print; every failure is one ArgoServerError line. Request and answer shapes are
the Argo Server REST API's (api/openapi-spec/swagger.json: WorkflowService_ListWorkflows, _GetWorkflow,
_WorkflowLogs, _RetryWorkflow, _ResubmitWorkflow).

    server = ArgoServer.from_env()
    for run in list_workflows(server, pipeline="llama-lora"):
        print(run.name, run.phase, run.duration_s)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import requests

from eksflow.argo_client import ArgoServer, ArgoServerError, ArgoSettingError, StreamIdleError, workflow_object
from eksflow.errors import EXIT_BAD_INPUT, EksflowError
from eksflow.names import PIPELINE_LABEL, workflow_name_problem

DONE = ("Succeeded", "Failed", "Error")
POD_NAME_FORMAT = "workflows.argoproj.io/pod-name-format"  # "v1": pods are named by node id
MAX_POD_PREFIX = 253 - 10 - 1  # Argo's ensurePodNamePrefixLength: a name's 253 characters less hash and dash
# only what `list` shows: a namespace of finished runs with all their node statuses is megabytes
LIST_FIELDS = ",".join(
    [
        "metadata",
        "items.metadata.name",
        "items.metadata.namespace",
        "items.metadata.creationTimestamp",
        "items.metadata.labels",
        "items.status.phase",
        "items.status.message",
        "items.status.startedAt",
        "items.status.finishedAt",
    ]
)
_PARAMETER = re.compile(r"[A-Za-z0-9_-]+\Z")  # Argo parameter names (validate.go's paramRegex, without the dots)
_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d) ")


class ParameterError(EksflowError, ValueError):
    """A `-p name=value` override that is not of that form: bad input, exit 2."""

    label = "parameter error"
    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class WorkflowSummary:
    """One run as `argo list` shows it."""

    name: str
    namespace: str
    phase: str  # Pending, Running, Succeeded, Failed, Error; "" before the controller has seen it
    started: datetime | None
    finished: datetime | None
    duration_s: float | None  # finished - started, or up to now while it runs
    message: str = ""
    pipeline: str = ""  # the eksflow.dev/pipeline label


@dataclass(frozen=True)
class TaskStatus:
    """One node of a run as `argo get` shows it."""

    name: str  # the display name: the DAG task, or `train(1)` for a retry attempt
    type: str  # Pod, Retry, Skipped, Suspend, ...
    phase: str
    started: datetime | None
    finished: datetime | None
    message: str = ""
    outputs: dict[str, str] = field(default_factory=dict)  # output parameters
    pod_name: str = ""  # for Pod nodes: what `logs` reads
    attempt_of: str = ""  # for a retry attempt: the task it retries


@dataclass(frozen=True)
class WorkflowDetail:
    """A run, its arguments and its tasks in start order."""

    summary: WorkflowSummary
    parameters: dict[str, str]
    tasks: list[TaskStatus]


@dataclass(frozen=True)
class LogLine:
    """One line of a task's log."""

    task: str  # display name of the task (the pod name if the workflow does not know it)
    pod: str
    content: str


def list_workflows(
    server: ArgoServer,
    *,
    pipeline: str | None = None,
    limit: int | None = None,
    session: requests.Session | None = None,
) -> list[WorkflowSummary]:
    """The namespace's runs, newest first; with `pipeline`, only that pipeline's (label eksflow.dev/pipeline)."""
    params = {"fields": LIST_FIELDS}
    if pipeline:
        params["listOptions.labelSelector"] = f"{PIPELINE_LABEL}={pipeline}"
    if limit:
        params["listOptions.limit"] = str(limit)
    runs: list[WorkflowSummary] = []
    while True:
        answer = server.call("GET", f"workflows/{_segment(server.namespace)}", params=params, session=session)
        items = answer.get("items", ()) if isinstance(answer, dict) else None
        if not isinstance(answer, dict) or not isinstance(answer.get("metadata"), dict) or not _is_list(items):
            raise ArgoServerError(f"the server at {server.url} answered the list with {_short(answer)}, not a list")
        runs.extend(summary(workflow_object(item, server.url, "the list")) for item in items or ())
        cont = answer["metadata"].get("continue")
        if not cont or (limit and len(runs) >= limit):
            break
        params["listOptions.continue"] = cont  # the API pages at listOptions.limit
    never = datetime.min.replace(tzinfo=timezone.utc)
    return sorted(runs, key=lambda run: run.started or never, reverse=True)[: limit or None]


def get_workflow(server: ArgoServer, name: str, *, session: requests.Session | None = None) -> WorkflowDetail:
    """One run with its arguments and every task's phase, times, message and output parameters."""
    workflow = workflow_manifest(server, name, session)
    spec = workflow.get("spec") or {}
    arguments = (spec.get("arguments") or {}).get("parameters") or []
    parameters = {str(p.get("name")): str(p.get("value", "")) for p in arguments if isinstance(p, dict)}
    return WorkflowDetail(summary(workflow), parameters, tasks(workflow))


def workflow_logs(
    server: ArgoServer,
    name: str,
    task: str | None = None,
    *,
    follow: bool = False,
    session: requests.Session | None = None,
) -> Iterator[LogLine]:
    """The log lines of every task of a run, or of one task (all its attempts); with `follow`, until it ends."""
    workflow = workflow_manifest(server, name, session)
    pods = {t.pod_name: t for t in tasks(workflow) if t.pod_name}
    chosen: list[str | None] = [None]  # None: every pod of the workflow, interleaved by the server
    if task is not None:
        chosen = [pod for pod, t in pods.items() if task in (t.name, t.attempt_of, pod)]
        if not chosen:
            known = sorted({t.attempt_of or t.name for t in pods.values()})
            raise ArgoServerError(
                f"workflow {name} has no task {task!r} that ran a pod; "
                f"tasks with logs: {', '.join(known) or 'none yet'}"
            )
    for i, pod in enumerate(chosen):
        params = {"logOptions.container": "main"}
        if pod is not None:
            params["podName"] = pod
        following = follow and i == len(chosen) - 1  # earlier attempts have ended
        yield from _log_stream(server, name, params, pods, following, session)


def retry_workflow(
    server: ArgoServer,
    name: str,
    parameters: Mapping[str, str] | None = None,
    *,
    restart_successful: bool = False,
    node_field_selector: str = "",
    session: requests.Session | None = None,
) -> WorkflowSummary:
    """Re-run the failed tasks of a finished run, like `argo retry NAME -p k=v`; the run keeps its name."""
    body: dict[str, Any] = {"name": name, "namespace": server.namespace, "restartSuccessful": restart_successful}
    if node_field_selector:
        body["nodeFieldSelector"] = node_field_selector
    if parameters:
        body["parameters"] = _parameter_list(parameters)
    answer = server.call("PUT", f"{_workflow_path(server, name)}/retry", body=body, session=session)
    return summary(workflow_object(answer, server.url, "the retry"))


def resubmit_workflow(
    server: ArgoServer,
    name: str,
    parameters: Mapping[str, str] | None = None,
    *,
    memoized: bool = False,
    session: requests.Session | None = None,
) -> WorkflowSummary:
    """Submit a new run with the spec of `name`, like `argo resubmit NAME -p k=v`; returns the new run."""
    body: dict[str, Any] = {"name": name, "namespace": server.namespace, "memoized": memoized}
    if parameters:
        body["parameters"] = _parameter_list(parameters)
    answer = server.call("PUT", f"{_workflow_path(server, name)}/resubmit", body=body, session=session)
    return summary(workflow_object(answer, server.url, "the resubmit"))


def parse_parameters(items: Sequence[str]) -> dict[str, str]:
    """`["lr=0.1", "note=a=b"]` (the argo CLI's `-p`) -> {"lr": "0.1", "note": "a=b"}; ParameterError otherwise."""
    parsed: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _PARAMETER.match(key):
            raise ParameterError(
                f"-p {item[:80]!r}: expected NAME=VALUE with a parameter name of letters, digits, '_' or '-'"
            )
        parsed[key] = value
    return parsed


def summary(workflow: Mapping[str, Any], now: datetime | None = None) -> WorkflowSummary:
    """The list row of a Workflow object; a running one's duration counts up to `now`."""
    metadata = workflow.get("metadata") or {}
    status = workflow.get("status") or {}
    started, finished = _time(status.get("startedAt")), _time(status.get("finishedAt"))
    end = finished or ((now or datetime.now(timezone.utc)) if started else None)
    return WorkflowSummary(
        name=str(metadata.get("name", "")),
        namespace=str(metadata.get("namespace", "")),
        phase=str(status.get("phase") or ""),
        started=started,
        finished=finished,
        duration_s=(end - started).total_seconds() if started and end else None,
        message=str(status.get("message") or ""),
        pipeline=str((metadata.get("labels") or {}).get(PIPELINE_LABEL, "")),
    )


def tasks(workflow: Mapping[str, Any]) -> list[TaskStatus]:
    """Every node below the workflow's DAG (tasks, their retry attempts, skipped tasks), in start order."""
    metadata = workflow.get("metadata") or {}
    wf_name = str(metadata.get("name", ""))
    v1_names = (metadata.get("annotations") or {}).get(POD_NAME_FORMAT) == "v1"
    nodes: Mapping[str, Any] = (workflow.get("status") or {}).get("nodes") or {}
    retry_parent = {
        child: node.get("displayName", "")
        for node in nodes.values()
        if node.get("type") == "Retry"
        for child in node.get("children") or ()
    }
    found = []
    for node_id, node in nodes.items():
        if node.get("type") in ("DAG", "Steps", "StepGroup", "TaskGroup") or not isinstance(node, dict):
            continue
        outputs = (node.get("outputs") or {}).get("parameters") or []
        pod = ""
        if node.get("type") == "Pod":
            pod = str(node_id) if v1_names else pod_name(wf_name, str(node.get("name", "")), _template(node))
        found.append(
            TaskStatus(
                name=str(node.get("displayName") or node.get("name") or node_id),
                type=str(node.get("type", "")),
                phase=str(node.get("phase", "")),
                started=_time(node.get("startedAt")),
                finished=_time(node.get("finishedAt")),
                message=str(node.get("message") or ""),
                outputs={str(p.get("name")): str(p.get("value", "")) for p in outputs if isinstance(p, dict)},
                pod_name=pod,
                attempt_of=str(retry_parent.get(node_id, "")),
            )
        )
    never = datetime.max.replace(tzinfo=timezone.utc)  # not started yet: last
    return sorted(found, key=lambda t: (t.started or never, t.name))


def pod_name(workflow_name: str, node_name: str, template_name: str) -> str:
    """The pod Argo creates for a node (pod names v2, the default): `<workflow>-<template>-<fnv32a(node name)>`."""
    if workflow_name == node_name:
        return workflow_name
    prefix = f"{workflow_name}-{template_name}" if template_name else workflow_name
    return f"{prefix[:MAX_POD_PREFIX]}-{_fnv32a(node_name.encode())}"


def _fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def _log_stream(
    server: ArgoServer,
    name: str,
    params: dict[str, str],
    pods: Mapping[str, TaskStatus],
    follow: bool,
    session: requests.Session | None,
) -> Iterator[LogLine]:
    """One log request; when following, a stream that goes quiet for the read timeout is resumed, not an error.

    A resumed request asks for lines since the latest whole second seen (timestamps on), and drops the lines of
    that second it already yielded (counted, so a line repeated on purpose within the second still shows).
    """
    path = f"{_workflow_path(server, name)}/log"
    query = {**params, "logOptions.follow": "true", "logOptions.timestamps": "true"} if follow else params
    since: int | None = None  # the latest whole second seen
    current: Counter[tuple[str, str]] = Counter()  # (pod, line) yielded within second `since`
    replay: Counter[tuple[str, str]] = Counter()  # after a resume: lines of `since` the server sends again
    while True:
        try:
            for entry in server.stream(path, query, session=session):
                pod = str(entry.get("podName", ""))
                content = str(entry.get("content", ""))
                if follow:
                    second, content = _split_timestamp(content)
                    key = (pod, content)
                    if second is not None and second == since and replay[key] > 0:
                        replay[key] -= 1
                        continue
                    if second is not None and (since is None or second > since):
                        since, current, replay = second, Counter(), Counter()
                    if second is not None and second == since:
                        current[key] += 1
                task = pods[pod].name if pod in pods else pod
                yield LogLine(task=task, pod=pod, content=content)
            return  # the server closed the stream: the pods have ended
        except StreamIdleError:
            if not follow:
                raise
            if summary(workflow_manifest(server, name, session)).phase in DONE:
                return
            if since is not None:
                query = {**query, "logOptions.sinceTime.seconds": str(since)}
                replay = Counter(current)


def _split_timestamp(content: str) -> tuple[int | None, str]:
    """`2024-05-01T10:00:00.123Z text` -> (epoch second, "text"); (None, content) without a timestamp."""
    match = _TIMESTAMP.match(content)
    if not match:
        return None, content
    zone = "+00:00" if match.group(2) == "Z" else match.group(2)
    second = int(datetime.fromisoformat(match.group(1) + zone).timestamp())
    return second, content[match.end() :]


def workflow_manifest(server: ArgoServer, name: str, session: requests.Session | None = None) -> dict[str, Any]:
    """Workflow `name` as the server holds it (spec and status), checked to be a Workflow object."""
    answer = server.call("GET", _workflow_path(server, name), session=session)
    return workflow_object(answer, server.url, f"GET of workflow {name}")


def _workflow_path(server: ArgoServer, name: str) -> str:
    if problem := workflow_name_problem(name):
        raise ArgoSettingError(problem)
    return f"workflows/{_segment(server.namespace)}/{_segment(name)}"


def _segment(text: str) -> str:
    return quote(text, safe="")


def _template(node: Mapping[str, Any]) -> str:
    ref = node.get("templateRef")
    return str(ref.get("template", "")) if isinstance(ref, dict) else str(node.get("templateName") or "")


def _parameter_list(parameters: Mapping[str, str]) -> list[str]:
    for key in parameters:
        if not _PARAMETER.match(key):
            raise ParameterError(f"parameter name {key[:80]!r} must be letters, digits, '_' or '-'")
    return [f"{key}={value}" for key, value in parameters.items()]


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None  # a field the UI would show as blank; not worth failing the whole listing
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _is_list(items: Any) -> bool:
    return items is None or isinstance(items, list)  # the API sends "items": null for an empty namespace


def _short(answer: Any) -> str:
    text = repr(answer)
    return text if len(text) <= 120 else text[:117] + "..."
