"""From a Workflow (spec + status) to what the page shows: tasks with phases, durations, dependencies and outputs.

Pure: no I/O. Reads both status shapes: Argo's (nodes keyed by id, each with `boundaryID` naming its DAG) and
the local executor's (nodes keyed by task name, exit-handler tasks as `onExit.<task>`). What the ML sections need
is found by what tasks produce, so any pipeline works: a task with outputs `mlflow_run_id` is a training run's,
`passed` + `report` an evaluation's, `train_rows` + `report` a validation's, `model_version` a registration's;
a canary analysis by the step it runs (its outputs are a subset of an evaluation's).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from eksflow.runtime.skip_reason import skip_reason

MAIN, EXIT = "main", "exit"
LOCAL_EXIT_PREFIX = "onExit."
TITLE_ANNOTATION = "workflows.argoproj.io/title"
DESCRIPTION_ANNOTATION = "workflows.argoproj.io/description"
DONE_PHASES = frozenset({"Succeeded", "Failed", "Error", "Skipped", "Omitted"})
_DEPENDS_NAME = re.compile(r"([A-Za-z0-9][\w\-]*)(?:\.\w+)?")
_MODULE = re.compile(r"-m\s+([A-Za-z_][\w.]*)")
ROLLOUT_WORDS = re.compile(r"deploy|canary|rollout|rollback|promot|serve|candidate|shift|fleet")


@dataclass(frozen=True)
class Task:
    """One task of the main DAG or of the exit handler, with its node's status (Pending when it has none)."""

    name: str
    dag: str  # MAIN or EXIT
    template: str
    needs: tuple[str, ...]  # tasks of the same DAG named in its `depends`
    step: str  # the module it runs (`eksflow.llm.steps.train`), or ""
    args: tuple[str, ...]  # its container's argv, {{...}} unresolved
    phase: str = "Pending"
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outputs: Mapping[str, str] = field(default_factory=dict)
    items: int = 0  # fan-out: how many item nodes ran under it

    def duration_s(self, now: datetime) -> float | None:
        """Seconds it ran (until `now` while it runs); None when it never started."""
        if self.started_at is None:
            return None
        end = self.finished_at or now
        return max((end - self.started_at).total_seconds(), 0.0)

    def arg(self, name: str) -> str | None:
        """The value of `--name=...` in its argv, or None."""
        prefix = f"--{name}="
        return next((a[len(prefix) :] for a in self.args if a.startswith(prefix)), None)


@dataclass(frozen=True)
class RunFacts:
    """The workflow as the page shows it."""

    name: str
    phase: str  # the workflow's outcome (its status in the exit handler), else status.phase
    title: str
    description: str
    message: str
    started_at: datetime | None
    finished_at: datetime | None
    parameters: Mapping[str, str]
    tasks: tuple[Task, ...]
    node_outputs: tuple[tuple[str, Mapping[str, str]], ...]  # (display name, outputs) of every node, fan-out included
    nodes_missing: str = ""  # why the status has no nodes (offloaded to the Argo Server's database), else ""

    def in_dag(self, dag: str) -> list[Task]:
        """The tasks of one DAG, in spec order."""
        return [t for t in self.tasks if t.dag == dag]


def parse_time(stamp: object) -> datetime | None:
    """An Argo timestamp (`2024-05-01T10:00:00Z`) as an aware datetime; None when absent or unreadable."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def collect(workflow: Mapping[str, Any], workflow_status: str = "") -> RunFacts:
    """The facts of one workflow; `workflow_status` (the exit handler's {{workflow.status}}) wins over the status."""
    metadata, spec, status = (workflow.get(k) or {} for k in ("metadata", "spec", "status"))
    name = str(metadata.get("name", ""))
    templates = {str(t.get("name")): t for t in spec.get("templates") or [] if isinstance(t, Mapping)}
    nodes = {str(k): v for k, v in (status.get("nodes") or {}).items() if isinstance(v, Mapping)}
    index = _node_index(nodes, name)
    tasks: list[Task] = []
    for dag, template_name in ((MAIN, spec.get("entrypoint")), (EXIT, spec.get("onExit"))):
        template = templates.get(str(template_name)) if template_name else None
        dag_tasks = (template or {}).get("dag", {}).get("tasks") or []
        names = {str(t.get("name")) for t in dag_tasks}
        for raw in dag_tasks:
            task_name = str(raw.get("name"))
            used = templates.get(str(raw.get("template")), {})
            node = index.get((dag, task_name), {})
            tasks.append(
                Task(
                    name=task_name,
                    dag=dag,
                    template=str(raw.get("template", "")),
                    needs=_needs(raw, names),
                    step=_module(used),
                    args=tuple(str(a) for a in (used.get("container") or {}).get("args") or []),
                    phase=str(node.get("phase") or "Pending"),
                    message=_message(node, used, {t: _outputs(n) for (d, t), n in index.items() if d == dag}),
                    started_at=parse_time(node.get("startedAt")),
                    finished_at=parse_time(node.get("finishedAt")),
                    outputs=_outputs(node),
                    items=_items(nodes, task_name),
                )
            )
    annotations = metadata.get("annotations") or {}
    parameters = {
        str(p.get("name")): str(p.get("value", "")) for p in (spec.get("arguments") or {}).get("parameters") or []
    }
    missing = ""
    if not nodes and status.get("offloadNodeStatusVersion"):
        missing = "the node status is offloaded to the Argo Server's database: phases are not in the Workflow object"
    return RunFacts(
        name=name,
        phase=workflow_status or str(status.get("phase") or "Unknown"),
        title=str(annotations.get(TITLE_ANNOTATION, "")),
        description=str(annotations.get(DESCRIPTION_ANNOTATION, "")),
        message=str(status.get("message") or ""),
        started_at=parse_time(status.get("startedAt")),
        finished_at=parse_time(status.get("finishedAt")),
        parameters=parameters,
        tasks=tuple(tasks),
        node_outputs=tuple((str(n.get("displayName", key)), _outputs(n)) for key, n in nodes.items() if _outputs(n)),
        nodes_missing=missing,
    )


def _message(node: Mapping[str, Any], template: Mapping[str, Any], outputs: Mapping[str, Mapping[str, str]]) -> str:
    """The node's message; for a skipped task, the reason its pipeline gives, where it gives one.

    Argo's message names the `when` expression only (the local executor's is already the reason).
    """
    message = str(node.get("message") or "")
    if node.get("phase") != "Skipped":
        return message
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    return skip_reason(annotations, lambda task, output: outputs.get(task, {}).get(output)) or message


def _node_index(nodes: Mapping[str, Mapping[str, Any]], workflow_name: str) -> dict[tuple[str, str], Mapping[str, Any]]:
    """(dag, task name) -> its node, for Argo's status (by boundaryID) and the local executor's (by key)."""
    index: dict[tuple[str, str], Mapping[str, Any]] = {}
    if any("boundaryID" in n for n in nodes.values()):
        exit_ids = {key for key, n in nodes.items() if n.get("displayName") == f"{workflow_name}.onExit"}
        for node in nodes.values():
            boundary = node.get("boundaryID")
            dag = MAIN if boundary == workflow_name else EXIT if boundary in exit_ids else None
            if dag is not None:
                # A retried task has a Retry node named like the task and pods named `task(0)`: the former counts.
                index.setdefault((dag, str(node.get("displayName"))), node)
        return index
    for key, node in nodes.items():
        if key.startswith(LOCAL_EXIT_PREFIX):
            index[(EXIT, key[len(LOCAL_EXIT_PREFIX) :])] = node
        else:
            index[(MAIN, key)] = node
    return index


def _items(nodes: Mapping[str, Mapping[str, Any]], task: str) -> int:
    """How many fan-out items ran under `task`: nodes named `task(0:a)` (a retry's pods are `task(0)`)."""
    item = re.compile(re.escape(task) + r"\(\d+:")
    return sum(1 for n in nodes.values() if item.match(str(n.get("displayName", ""))))


def _needs(task: Mapping[str, Any], names: set[str]) -> tuple[str, ...]:
    """The tasks of the same DAG that `depends` (or the older `dependencies`) names, in order, once each."""
    found = [m.group(1) for m in _DEPENDS_NAME.finditer(str(task.get("depends") or ""))]
    found += [str(d) for d in task.get("dependencies") or []]
    return tuple(dict.fromkeys(n for n in found if n in names))


def _module(template: Mapping[str, Any]) -> str:
    """The Python module a template runs: `python -m <module>` in a container, or in a resource's manifest."""
    command = [str(c) for c in (template.get("container") or {}).get("command") or []]
    if "-m" in command[:-1]:
        return command[command.index("-m") + 1]
    match = _MODULE.search(str((template.get("resource") or {}).get("manifest", "")))
    return match.group(1) if match else ""


def _outputs(node: Mapping[str, Any]) -> dict[str, str]:
    parameters = (node.get("outputs") or {}).get("parameters") or []
    return {str(p.get("name")): str(p.get("value", "")) for p in parameters if isinstance(p, Mapping)}


# -- what the ML sections look for ---------------------------------------------------------------------------------


def run_ids(facts: RunFacts) -> list[str]:
    """Every MLflow run id a node output names (a fan-out's aggregated output is a JSON list of them), in order."""
    found: list[str] = []
    for _, outputs in facts.node_outputs:
        value = outputs.get("mlflow_run_id", "")
        found += _texts(value)
    return list(dict.fromkeys(v for v in found if v))


def training_run_ids(facts: RunFacts) -> list[str]:
    """The run ids of training tasks (nodes with `mlflow_run_id` and `final_loss` outputs), in order."""
    found: list[str] = []
    for _, outputs in facts.node_outputs:
        if "final_loss" in outputs:
            found += _texts(outputs.get("mlflow_run_id", ""))
    return list(dict.fromkeys(v for v in found if v))


def _texts(value: str) -> list[str]:
    if value.startswith("["):
        try:
            items = json.loads(value)
        except ValueError:
            return [value]
        return [str(i) for i in items if isinstance(i, (str, int))] if isinstance(items, list) else [value]
    return [value]


def tasks_with(facts: RunFacts, outputs: Iterable[str] = (), steps: Sequence[str] = ()) -> list[Task]:
    """Tasks that produced all of `outputs`, or (outputs missing: the task failed or never ran) run one of `steps`."""
    wanted = tuple(outputs)
    return [
        t
        for t in facts.tasks
        if (wanted and all(o in t.outputs for o in wanted)) or (t.step and t.step.rsplit(".", 1)[-1] in steps)
    ]


def training_tasks(facts: RunFacts) -> list[Task]:
    """The main DAG's training tasks (by outputs, or by the train steps they run)."""
    return tasks_with(facts, ("mlflow_run_id", "final_loss"), ("train", "train_neuron"))


def evaluation_tasks(facts: RunFacts) -> list[Task]:
    """Tasks that score a model against a gate."""
    return tasks_with(facts, ("passed", "report", "metrics"), ("evaluate",))


def validation_tasks(facts: RunFacts) -> list[Task]:
    """Tasks that validate data."""
    return tasks_with(facts, ("train_rows", "report"), ("validate_data",))


def registration_tasks(facts: RunFacts) -> list[Task]:
    """Tasks that register a model version."""
    return tasks_with(facts, ("model_version", "model_uri"), ("register",))


def canary_tasks(facts: RunFacts) -> list[Task]:
    """Tasks that analyse a canary step (eksflow.llm.steps.canary: analyze-0, analyze-10, ...), ran or not."""
    return tasks_with(facts, steps=("canary",))


def rollout_tasks(facts: RunFacts) -> list[Task]:
    """Tasks that serve, promote or roll back a version (fleet, serve, candidate, shift, canary, promote, ...)."""
    return [t for t in facts.tasks if ROLLOUT_WORDS.search(t.name) or ROLLOUT_WORDS.search(t.step)]


def arg_path(task: Task, flag: str, workflow_name: str, file_name: str) -> str | None:
    """`--<flag>` of the task joined with `file_name`, `{{workflow.name}}` filled; None when it needs other values.

    How a failed task's report is found: its output parameter was never written, but the file may have been.
    """
    value = task.arg(flag)
    if value is None:
        return None
    value = re.sub(r"\{\{\s*workflow\.name\s*\}\}", workflow_name, value)
    return None if "{{" in value else f"{value.rstrip('/')}/{file_name}"
