"""Checking a Workflow manifest against the locally supported subset and reducing it to model objects.

Supported: DAG, container and resource templates; a DAG task may run another DAG template (nested DAGs) and fan
out with withItems or withParam; depends/dependencies, when, parameters, DAG outputs (valueFrom.parameter),
retryStrategy, activeDeadlineSeconds, memoize, onExit, parallelism (workflow and DAG template), volumes. Anything
else raises LocalExecutorError naming the field and what to do instead, before anything runs.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eksflow.local.errors import LocalExecutorError
from eksflow.local.expressions import ExpressionError, dependencies_to_depends, depends_on_failure
from eksflow.local.model import EXIT_HANDLER, DagTask, DagTemplate, Loop, Template, Workflow, bind_inputs
from eksflow.local.parse_templates import (
    CLUSTER_ONLY_TEMPLATE,
    fields,
    parse_container,
    parse_inputs,
    parse_memoize,
    parse_outputs,
    parse_resource,
    parse_volumes,
    template_annotations,
)
from eksflow.local.substitution import TASK_REFERENCE
from eksflow.names import generate_name_problem, workflow_name_problem
from eksflow.runtime.skip_reason import REASON, REASON_OUTPUT

SKIP_OUTPUT = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\.[A-Za-z_][\w-]*")  # <task>.<output>, as Argo names them
# Keys that only shape scheduling or security on a cluster; a local process has nothing to apply them to.
_CLUSTER_ONLY_SPEC = frozenset({
    "affinity", "archiveLogs", "artifactGC", "artifactRepositoryRef", "automountServiceAccountToken", "dnsConfig",
    "dnsPolicy", "executor", "hostAliases", "hostNetwork", "imagePullSecrets", "metrics", "nodeSelector",
    "podDisruptionBudget", "podGC", "podMetadata", "podPriorityClassName", "podSpecPatch", "priority",
    "schedulerName", "securityContext", "serviceAccountName", "synchronization", "tolerations", "ttlStrategy",
    "workflowMetadata",
})  # fmt: skip
_KINDS = ("dag", "container", "resource")
_TASK_KEYS = {"name", "template", "arguments", "depends", "dependencies", "when", "withItems", "withParam"}


def parse_manifest(manifest: Mapping[str, Any]) -> Workflow:
    """Check that the manifest is within the locally supported subset; raise LocalExecutorError otherwise."""
    if manifest.get("kind") != "Workflow":
        raise LocalExecutorError(f"kind must be 'Workflow', got {manifest.get('kind')!r}; compile with Workflow")
    metadata = fields.mapping(manifest.get("metadata"), "metadata")
    name = fields.optional_text(metadata, "name", "metadata")
    generate_name = fields.optional_text(metadata, "generateName", "metadata")
    if not name and not generate_name:
        raise LocalExecutorError("metadata.name or metadata.generateName is required")
    # the run's folder is named after it: only names the verbs accept (eksflow.names) are ever made
    if problem := workflow_name_problem(name) if name else generate_name_problem(generate_name or ""):
        raise LocalExecutorError(f"metadata: {problem}")
    labels = {str(k): str(v) for k, v in fields.mapping(metadata.get("labels"), "metadata.labels").items()}
    spec = fields.mapping(manifest.get("spec"), "spec")
    used = {"entrypoint", "arguments", "templates", "onExit", "parallelism", "activeDeadlineSeconds", "volumes"}
    fields.check_keys(spec, "spec", used | {"volumeClaimTemplates"}, _CLUSTER_ONLY_SPEC)
    spec_volumes = parse_volumes(spec, "spec")
    raw: dict[str, tuple[str, str, Mapping[str, Any]]] = {}
    for i, template in enumerate(fields.mappings(spec.get("templates"), "spec.templates")):
        where = f"spec.templates[{i}]"
        kind = next((k for k in _KINDS if k in template), "")
        used_keys = {"name", "inputs", "outputs", "memoize", "metadata", kind}
        if kind in ("container", "resource"):
            used_keys |= {"retryStrategy", "activeDeadlineSeconds"}
        if kind == "container":
            used_keys |= {"volumes"}
        if kind == "dag":
            used_keys |= {"parallelism"}
        fields.check_keys(template, where, used_keys, CLUSTER_ONLY_TEMPLATE)
        if not kind:
            raise LocalExecutorError(f"{where} has none of dag, container or resource; only those run locally")
        template_name = fields.text(template.get("name"), f"{where}.name")
        if template_name in raw:
            raise LocalExecutorError(f"{where}.name {template_name!r} is used by two templates")
        raw[template_name] = (kind, where, template)
    templates: dict[str, Template] = {}
    for template_name, (kind, where, template) in raw.items():
        if kind == "container":
            templates[template_name] = parse_container(template, where, spec_volumes)
        elif kind == "resource":
            templates[template_name] = parse_resource(template, where)
    for template_name, (kind, where, template) in raw.items():
        if kind == "dag":
            templates[template_name] = _parse_dag(template, where, raw)
    _refuse_recursion(templates)

    entrypoint = fields.text(spec.get("entrypoint"), "spec.entrypoint")
    if entrypoint not in templates:
        raise LocalExecutorError(f"spec.entrypoint {entrypoint!r} names no template in spec.templates")
    if not isinstance(templates[entrypoint], DagTemplate):
        raise LocalExecutorError(f"spec.entrypoint {entrypoint!r} must be a dag template locally")
    on_exit = _exit_handler(spec, templates)
    arguments = fields.mapping(spec.get("arguments"), "spec.arguments")
    fields.check_keys(arguments, "spec.arguments", {"parameters"})
    parameters: dict[str, str | None] = {}
    for i, param in enumerate(fields.mappings(arguments.get("parameters"), "spec.arguments.parameters")):
        at = f"spec.arguments.parameters[{i}]"
        fields.check_keys(param, at, {"name", "value", "description", "enum"})
        parameters[fields.text(param.get("name"), f"{at}.name")] = fields.optional_text(param, "value", at)
    parallelism = spec.get("parallelism")
    deadline = spec.get("activeDeadlineSeconds")
    return Workflow(
        name=name,
        generate_name=generate_name,
        labels=labels,
        parameters=parameters,
        entrypoint=entrypoint,
        on_exit=on_exit,
        parallelism=None if parallelism is None else max(int(fields.number(parallelism, "spec.parallelism")), 1),
        deadline_s=None if deadline is None else fields.number(deadline, "spec.activeDeadlineSeconds"),
        templates=templates,
        skip_reasons={
            name: reason
            for name, (_, where, template) in raw.items()
            if (reason := skip_annotations(template_annotations(template, where), f"{where}.metadata.annotations"))
        },
    )


def skip_annotations(annotations: Mapping[str, Any], where: str) -> dict[str, str]:
    """The annotations saying why a template's task is skipped, checked: text, an output named `<task>.<output>`."""
    found = {
        key: fields.text(annotations[key], f"{where}[{key!r}]") for key in (REASON, REASON_OUTPUT) if key in annotations
    }
    named = found.get(REASON_OUTPUT)
    if named is not None and not SKIP_OUTPUT.fullmatch(named):
        raise LocalExecutorError(
            f"{where}[{REASON_OUTPUT!r}] must name a task's output as <task>.<output>, got {named!r}"
        )
    return found


def _exit_handler(spec: Mapping[str, Any], templates: Mapping[str, Template]) -> DagTemplate | None:
    """spec.onExit as a one-task DAG: its node is `onExit`, and a DAG handler's tasks are `onExit.<task>`."""
    if spec.get("onExit") is None:
        return None
    name = fields.text(spec["onExit"], "spec.onExit")
    if name not in templates:
        raise LocalExecutorError(f"spec.onExit {name!r} names no template in spec.templates")
    return DagTemplate(
        name=name,
        inputs=(),
        outputs=(),
        retry=None,
        deadline_s=None,
        memoize=None,
        tasks={EXIT_HANDLER: DagTask(EXIT_HANDLER, name, (), None, None, None)},
        fail_fast=True,
        handled=frozenset(),
        parallelism=None,
        leaves=(EXIT_HANDLER,),
    )


def _parse_loop(raw: Mapping[str, Any], at: str) -> Loop | None:
    if raw.get("withItems") is not None and raw.get("withParam") is not None:
        raise LocalExecutorError(f"{at} sets both withItems and withParam; use one")
    if raw.get("withItems") is not None:
        items = raw["withItems"]
        if not isinstance(items, list):
            raise LocalExecutorError(f"{at}.withItems must be a list, got {type(items).__name__}")
        for j, item in enumerate(items):
            if item is None:
                raise LocalExecutorError(f"{at}.withItems[{j}] is empty; give a string, number, list or mapping")
        return Loop(tuple(items), None)
    if raw.get("withParam") is not None:
        return Loop(None, fields.text(raw["withParam"], f"{at}.withParam"))
    return None


def _parse_dag(template: Mapping[str, Any], where: str, kinds: Mapping[str, tuple[str, str, Any]]) -> DagTemplate:
    template_name = str(template["name"])
    dag = fields.mapping(template["dag"], f"{where}.dag")
    fields.check_keys(dag, f"{where}.dag", {"tasks", "failFast"})
    tasks: dict[str, DagTask] = {}
    for i, raw in enumerate(fields.mappings(dag.get("tasks"), f"{where}.dag.tasks")):
        at = f"{where}.dag.tasks[{i}]"
        fields.check_keys(raw, at, _TASK_KEYS)
        name = fields.text(raw.get("name"), f"{at}.name")
        if name in tasks:
            raise LocalExecutorError(f"{at}.name {name!r} is used twice in DAG {template_name!r}")
        target = fields.text(raw.get("template"), f"{at}.template")
        if target not in kinds:
            raise LocalExecutorError(f"{at}.template {target!r} names no template in spec.templates")
        arguments = fields.mapping(raw.get("arguments"), f"{at}.arguments")
        fields.check_keys(arguments, f"{at}.arguments", {"parameters"})
        params = []
        for j, param in enumerate(fields.mappings(arguments.get("parameters"), f"{at}.arguments.parameters")):
            p_at = f"{at}.arguments.parameters[{j}]"
            fields.check_keys(param, p_at, {"name", "value", "description"})
            if param.get("value") is None:
                raise LocalExecutorError(f"{p_at}.value is required")
            params.append(
                (fields.text(param.get("name"), f"{p_at}.name"), fields.text(param["value"], f"{p_at}.value"))
            )
        depends = fields.optional_text(raw, "depends", at)
        if raw.get("dependencies") is not None:
            if depends is not None:
                raise LocalExecutorError(f"{at} sets both depends and dependencies; use depends only")
            deps = [fields.text(d, f"{at}.dependencies[{j}]") for j, d in enumerate(raw["dependencies"])]
            depends = dependencies_to_depends(deps) or None
        when = fields.optional_text(raw, "when", at)
        tasks[name] = DagTask(name, target, tuple(params), depends, when, _parse_loop(raw, at))
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
        texts = [value for _, value in task.arguments] + [t for t in (task.when, task.loop and task.loop.param) if t]
        for ref in sorted({m for text in texts for m in TASK_REFERENCE.findall(text)}):
            if ref in tasks and ref not in ancestors[name]:
                raise LocalExecutorError(
                    f"task {name!r} reads tasks.{ref} but does not depend on {ref!r}; add it to depends "
                    "(Hera: `a >> b`), or the value may not exist yet"
                )
    depended_on = {need for task in tasks.values() for need in task.needs()}
    parallelism = template.get("parallelism")
    return DagTemplate(
        name=template_name,
        inputs=parse_inputs(template, where),
        outputs=parse_outputs(template, where, "parameter"),
        retry=None,
        deadline_s=None,
        memoize=parse_memoize(template.get("memoize"), f"{where}.memoize"),
        tasks=tasks,
        fail_fast=dag.get("failFast", True) is not False,
        handled=frozenset(handled),
        parallelism=None if parallelism is None else max(int(fields.number(parallelism, f"{where}.parallelism")), 1),
        leaves=tuple(name for name in tasks if name not in depended_on),
    )


def _ancestors(tasks: Mapping[str, DagTask]) -> dict[str, set[str]]:
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


def _refuse_recursion(templates: Mapping[str, Template]) -> None:
    """A DAG that runs itself (directly or through others) would need its `when` to stop; refused locally."""
    path: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        template = templates[name]
        if name in done or not isinstance(template, DagTemplate):
            return
        if name in path:
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise LocalExecutorError(
                f"DAG templates run each other in a loop ({cycle}); recursion runs only on a cluster"
            )
        path.append(name)
        for task in template.tasks.values():
            visit(task.template)
        path.pop()
        done.add(name)

    for name in templates:
        visit(name)


def plain_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A private deep copy of the manifest, and proof it is plain data."""
    try:
        copied = json.loads(json.dumps(dict(manifest)))
    except (TypeError, ValueError) as exc:
        raise LocalExecutorError(f"the manifest must be plain data (Workflow.to_dict()): {exc}") from None
    assert isinstance(copied, dict)
    return copied


def dag_inputs(dag: DagTemplate, parameters: Mapping[str, str]) -> dict[str, str]:
    """The entrypoint DAG's inputs: the workflow parameters of the same name (as Argo does), else the defaults."""
    return bind_inputs(
        dag.inputs,
        parameters,
        lambda name: LocalExecutorError(
            f"input parameter {name!r} of template {dag.name!r} has no value; add a workflow parameter of that name "
            "or a default"
        ),
    )


def effective_parameters(workflow: Workflow, overrides: Mapping[str, str] | None) -> dict[str, str]:
    """The workflow parameters with `overrides` applied; every one must be known and end with a value."""
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
    for dag in (workflow.dag(workflow.entrypoint), workflow.on_exit):
        if dag is not None:
            dag_inputs(dag, effective)  # fail before anything runs
    return effective


def new_run_name(workflow: Workflow, runs: Path) -> str:
    """metadata.name, or generateName plus five random characters (as the API server does) not used yet."""
    if workflow.name:
        return workflow.name
    alphabet = string.ascii_lowercase + string.digits
    while True:
        name = f"{workflow.generate_name}{''.join(secrets.choice(alphabet) for _ in range(5))}"
        if not (runs / name).exists():
            return name
