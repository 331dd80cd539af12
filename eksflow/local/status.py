"""Node and run status: the Phase enum, NodeStatus, RunResult, and status.json in Argo's shape.

status.json is what `argo get -o json` would show for the run, reduced to what a local run has: metadata (name, uid,
namespace, labels), spec.arguments.parameters, and status (phase, startedAt, finishedAt, message, nodes). Nodes are
keyed by their name inside the workflow (`train`, `candidates(0:lr:0.0001,rank:8)`,
`candidates(0:lr:0.0001,rank:8).train`, `onExit`), where Argo keys them by a hash of `<workflow>.<name>`; each keeps
Argo's fields (name, displayName, type, templateName, phase, children, outputs, memoizationStatus, ...). Local-only
fields: `status.overrides` records the parameter overrides of each retry (`argo retry -p`), and a
node's `progress` is the last line of its $ARGO_PROGRESS_FILE; with simulated nodes (`run --nodes N`) a node also
has Argo's `hostNodeName`, and a distributed job's node the `pods` its object made (name, role, hostNodeName,
podIP), which Argo leaves to the job's own status. A TrainJob's node has its `trainerStatus` (progress, ETA and
metrics, as the Trainer keeps them in the TrainJob's status: eksflow.local.trainer_status_server).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

from eksflow.errors import EXIT_BAD_INPUT
from eksflow.local.phase import Phase

NAMESPACE = "local"
_MESSAGE_CHARS = 300


class NodeType(str, Enum):
    """What a node is, as Argo types it."""

    POD = "Pod"  # a container or resource template: a process ran (or a resource was admitted)
    DAG = "DAG"  # a task whose template is a DAG
    TASK_GROUP = "TaskGroup"  # a task fanned out by withItems/withParam; its iterations are its children
    SKIPPED = "Skipped"  # a task that never ran (when false, depends unmet, a reference that does not resolve)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Memoization:
    """Argo's memoizationStatus: whether the outputs came from the cache, and from which entry."""

    hit: bool
    key: str
    cache_name: str


@dataclass
class NodeStatus:
    """One node of a local run (a task, a fan-out iteration, a nested DAG's task), as `argo get` would show it."""

    name: str  # the node's key: its path inside the workflow, e.g. `candidates(1:rank:16).train`
    template: str
    phase: Phase
    message: str = ""
    exit_code: int | None = None
    started_at: str | None = None  # ISO 8601 UTC
    finished_at: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    progress: str | None = None  # last "N/M" from the task's ARGO_PROGRESS_FILE
    retries: int = 0
    log: Path | None = None
    type: NodeType = NodeType.POD
    display_name: str = ""  # Argo's displayName: the last part of the name, e.g. `candidates(1:rank:16)`
    parent: str | None = None  # the enclosing DAG or fan-out node's key; None for an entrypoint task
    children: list[str] = field(default_factory=list)
    memoization: Memoization | None = None
    host_node: str = ""  # Argo's hostNodeName: the node its pod ran on (set with simulated nodes, `run --nodes`)
    pods: list[dict[str, str]] = field(default_factory=list)  # an object's pods: name, role, hostNodeName, podIP
    trainer_status: dict[str, Any] | None = None  # a TrainJob's status.trainerStatus, as its pods last reported it

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)
        if not self.display_name:
            self.display_name = self.name

    @property
    def cached(self) -> bool:
        """Its outputs came from the memoization cache; nothing ran."""
        return self.memoization is not None and self.memoization.hit


@dataclass
class RunResult:
    """The outcome of a local run."""

    name: str
    phase: Phase
    message: str
    run_dir: Path
    nodes: dict[str, NodeStatus]
    parameters: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)

    @property
    def bad_input(self) -> list[str]:
        """Nodes that failed with exit code 2 (bad input or config): they would fail the same way again."""
        return [k for k, n in self.nodes.items() if n.phase.failed_or_error and n.exit_code == EXIT_BAD_INPUT]

    @property
    def resumable(self) -> bool:
        """Worth resuming as it is: it did not succeed, and no task failed on bad input (exit 2)."""
        return self.phase is not Phase.SUCCEEDED and not self.bad_input


def now() -> str:
    """The current UTC time as Argo writes it."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(stamp: str | None) -> datetime | None:
    """An Argo timestamp as an aware datetime (None for None)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


def short(text: str) -> str:
    """A message cut to a length status.json and the table can carry."""
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def node_document(workflow: str, node: NodeStatus) -> dict[str, Any]:
    """One entry of status.nodes."""
    document: dict[str, Any] = {
        "name": f"{workflow}.{node.name}",
        "displayName": node.display_name,
        "type": str(node.type),
        "templateName": node.template,
        "phase": str(node.phase),
        "message": node.message,
        "exitCode": node.exit_code,
        "startedAt": node.started_at,
        "finishedAt": node.finished_at,
        "progress": node.progress,
        "retries": node.retries,
        "children": list(node.children),
        "outputs": {"parameters": [{"name": k, "value": v} for k, v in node.outputs.items()]},
    }
    if node.host_node:
        document["hostNodeName"] = node.host_node
    if node.pods:
        document["pods"] = [dict(pod) for pod in node.pods]
    if node.trainer_status is not None:
        document["trainerStatus"] = node.trainer_status
    if node.memoization is not None:
        memo = node.memoization
        document["memoizationStatus"] = {"hit": memo.hit, "key": memo.key, "cacheName": memo.cache_name}
    return document


def run_document(
    *,
    name: str,
    uid: str,
    labels: Mapping[str, str],
    parameters: Mapping[str, str],
    phase: Phase,
    started_at: str,
    finished_at: str | None,
    message: str,
    nodes: Iterable[NodeStatus],
    overrides: list[dict[str, Any]],
) -> dict[str, Any]:
    """The whole status.json document."""
    status: dict[str, Any] = {
        "phase": str(phase),
        "startedAt": started_at,
        "finishedAt": finished_at,
        "message": message,
        "nodes": {node.name: node_document(name, node) for node in nodes},
    }
    if overrides:
        status["overrides"] = overrides
    return {
        "metadata": {"name": name, "uid": uid, "namespace": NAMESPACE, "labels": dict(labels)},
        "spec": {"arguments": {"parameters": [{"name": k, "value": v} for k, v in parameters.items()]}},
        "status": status,
    }


def read_nodes(document: Mapping[str, Any], run_dir: Path) -> dict[str, NodeStatus]:
    """The nodes of a status.json document, parents and log paths filled in."""
    raw_nodes = document.get("status", {}).get("nodes", {}) or {}
    nodes: dict[str, NodeStatus] = {}
    for key, raw in raw_nodes.items():
        memo = raw.get("memoizationStatus")
        log = run_dir / "logs" / f"{file_name(key)}.log"
        nodes[key] = NodeStatus(
            name=key,
            template=raw.get("templateName", ""),
            phase=Phase(raw.get("phase", Phase.PENDING)),
            message=raw.get("message", ""),
            exit_code=raw.get("exitCode"),
            started_at=raw.get("startedAt"),
            finished_at=raw.get("finishedAt"),
            outputs={p["name"]: p["value"] for p in raw.get("outputs", {}).get("parameters", [])},
            progress=raw.get("progress"),
            retries=raw.get("retries", 0),
            log=log if log.exists() else None,
            type=NodeType(raw.get("type", NodeType.POD)),
            display_name=raw.get("displayName", key),
            children=list(raw.get("children", [])),
            memoization=None if memo is None else Memoization(memo["hit"], memo["key"], memo["cacheName"]),
            host_node=raw.get("hostNodeName", ""),
            pods=[dict(pod) for pod in raw.get("pods", [])],
            trainer_status=raw.get("trainerStatus"),
        )
    for key, node in nodes.items():
        for child in node.children:
            if child in nodes:
                nodes[child].parent = key
    return nodes


def read_parameters(document: Mapping[str, Any]) -> dict[str, str]:
    """spec.arguments.parameters of a status.json document."""
    raw = document.get("spec", {}).get("arguments", {}).get("parameters", [])
    return {p["name"]: p["value"] for p in raw}


def load_document(path: Path) -> dict[str, Any]:
    """A JSON document (status.json, owner.json); raises OSError or ValueError."""
    loaded = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return loaded


def file_name(key: str) -> str:
    """A node key as one file name: `/` and control characters replaced, long keys cut and made unique."""
    safe = "".join(c if c.isprintable() and c not in "/\\" else "_" for c in key)
    if len(safe.encode()) <= 200:
        return safe
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{safe.encode()[:180].decode(errors='ignore')}-{digest}"
