"""`plan`: the preflight checks and estimates printed before anything is submitted.

For every distributed task of the pipeline (eksflow.launchers.distributed) it checks the layout the accelerator
profile implies (workers vs devices or vCPUs, EFA in one zone, the retry budget), asks the step itself
(`preflight` in its contract module, see eksflow.runtime.preflight) about memory and anything else only the step
knows, and prices the run. Every problem is a `field: what is wrong; fix: ...` line; `check` raises ConfigError
with all of them at once (exit 2), otherwise returns the rows of the plan table.

The pods that keep running, the Deployments and StatefulSets the pipeline's resource tasks apply (a serving fleet),
are read from those tasks' manifests: replicas, each container's requests and devices, and the instance type their
node selector or node affinity pins (eksflow.profiles.placement). They are priced per hour, as they serve after the
workflow ends; where nothing pins the instance type the plan gives the requests and says the cost is unknown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hera.workflows import Resource
from rich.console import Console
from rich.table import Table

from eksflow import profiles
from eksflow.cluster import cluster_of
from eksflow.config import PipelineConfig
from eksflow.errors import ConfigError
from eksflow.launchers import Job
from eksflow.launchers.base import refusal, worker_layout
from eksflow.local.node import QuantityError, Requests, container_requests, cpu_text, quantity
from eksflow.pipeline import Pipeline
from eksflow.refs import Ref
from eksflow.runtime.preflight import Layout, Preflight

PRICES = Path(__file__).with_name("prices.yaml")
SERVICE_KINDS = ("Deployment", "StatefulSet")  # pods that keep running once applied: priced per hour
DEVICES = {profiles.GPU_RESOURCE: "GPU", profiles.NEURON_RESOURCE: "Neuron device"}
# An expression tag, a whole YAML value of a resource template's manifest (eksflow.manifests): known at run time.
_EXPRESSION_TAG = re.compile(r"(?<= )\{\{=.*\}\}$", re.MULTILINE)


@dataclass(frozen=True)
class Plan:
    """The preflight table: (what, value) rows."""

    rows: list[tuple[str, str]]


def layout_of(job: Job, cfg: PipelineConfig) -> Layout:
    """The Layout a job's step sees in its preflight."""
    cluster = cluster_of(cfg)
    profile = job.profile
    workers = worker_layout(job.settings)[0]
    if profile.kind == "cpu":
        per_worker = profile.memory_gib / workers_per_node(job, cluster.nodes)
    else:
        per_worker = profile.device_memory_gib / profile.cores_per_device
    return Layout(
        kind=profile.kind,
        instance_type=profile.instance_type,
        nodes=cluster.nodes,
        workers=workers,
        memory_per_worker_gib=per_worker,
        spot=cluster.spot,
        model_params_b=cluster.model_params_b,
    )


def workers_per_node(job: Job, nodes: int) -> int:
    """A CPU job's workers on one node: all in one pod on one node, or spread one per node over several."""
    return max(math.ceil(worker_layout(job.settings)[0] / nodes), 1)


def layout_problems(job: Job, cfg: PipelineConfig) -> list[str]:
    """Workers must match the nodes' devices (GPU, Neuron) or fit the node's vCPUs (CPU); EFA stays in one zone."""
    cluster = cluster_of(cfg)
    profile, settings, section = job.profile, job.settings, job.section
    problems = []
    threads = worker_layout(settings)[1]
    if refused := refusal(cluster, profile):
        problems.append(refused)
    if profile.kind == "cpu":
        on_a_node = workers_per_node(job, cluster.nodes)
        if on_a_node * threads > profile.vcpus:
            problems.append(
                f"{section}.num_workers: {on_a_node} workers x {threads} CPUs on a node exceed the {profile.vcpus} "
                f"vCPUs of {profile.instance_type}; fix: lower {section}.num_workers or {section}.cpus_per_worker"
            )
    else:
        world = cluster.nodes * profile.workers
        if "num_workers" in job.configured and job.configured["num_workers"] != world:
            problems.append(
                f"{section}.num_workers: {job.configured['num_workers']} does not match {cluster.nodes} node(s) x "
                f"{profile.workers} devices of {profile.instance_type} = {world}; fix: --set "
                f"{section}.num_workers={world} or leave it unset (the profile sets it)"
            )
        if "use_gpu" in job.configured and job.configured["use_gpu"] != (profile.kind == "gpu"):
            problems.append(
                f"{section}.use_gpu: {job.configured['use_gpu']} on {profile.kind} nodes; fix: leave it unset "
                "(the profile sets it)"
            )
    if profile.efa and cluster.nodes > 1 and not cluster.zone:
        problems.append(
            f"cluster.zone: {cluster.nodes} {profile.instance_type} nodes talk over EFA, which does not cross "
            "availability zones; fix: --set cluster.zone=<az>, e.g. us-west-2a"
        )
    attempts = job.attempts(cfg)
    if attempts > cluster.retry_budget:
        problems.append(
            f"cluster.retry_budget: Argo x {job.launcher.name} x in-job retries allow {attempts} attempts of "
            f"{job.task}, more than the budget of {cluster.retry_budget}; fix: lower cluster.backoff_limit or "
            "raise cluster.retry_budget"
        )
    return problems


def step_preflight(job: Job, pipeline: Pipeline, layout: Layout) -> Preflight:
    """The step's own answer, from `preflight` in its contract module; none when it declares none."""
    declared = getattr(job.step, "preflight", None)
    if declared is None:
        return Preflight()
    known = {k: _resolved(v, pipeline) for k, v in job.values.items()}
    args = {**job.settings.model_dump(), **{k: v for k, v in known.items() if v is not _UNKNOWN}}
    answer = declared(args, layout)
    assert isinstance(answer, Preflight), f"{job.step.__name__}.preflight must return a Preflight"
    return answer


def prices() -> dict[str, object]:
    """The dated on-demand price table (prices.yaml)."""
    loaded: dict[str, object] = yaml.safe_load(PRICES.read_text(encoding="utf-8"))
    return loaded


def check(pipeline: Pipeline) -> Plan:
    """Run every check of every distributed task; raise ConfigError listing all problems, or return the rows."""
    cfg = pipeline.cfg
    table = prices()
    usd: Mapping[str, float] = table["usd_per_hour"]  # type: ignore[assignment]
    problems: list[str] = []
    rows: list[tuple[str, str]] = [("workflow", f"{cfg.name} in namespace {cfg.namespace}")]
    for job in pipeline.jobs:
        cluster = cluster_of(cfg)
        layout = layout_of(job, cfg)
        answer = step_preflight(job, pipeline, layout)
        problems += layout_problems(job, cfg) + answer.problems
        profile, nodes = job.profile, cluster.nodes
        hourly = usd[profile.instance_type] * nodes
        rows += [
            (
                f"{job.task}: instance",
                f"{profile.instance_type} x {nodes} ({profile.kind}, {'Spot' if cluster.spot else 'on-demand'})",
            ),
            (f"{job.task}: pods", job.launcher.pods(cfg, job)),
            (
                f"{job.task}: devices",
                f"{profile.devices * nodes} ({profile.devices} per node), {profile.efa} EFA per node",
            ),
            (f"{job.task}: world size", f"{layout.workers} workers"),
            *((f"{job.task}: {name}", value) for name, value in answer.rows),
            (f"{job.task}: gang admission", job.launcher.admission(cfg)),
            (f"{job.task}: attempts", f"{job.attempts(cfg)} at most (budget {cluster.retry_budget})"),
            (
                f"{job.task}: cost per hour",
                f"${hourly:,.2f} (on-demand, {table['region']}, prices as of {table['as_of']})",
            ),
            (
                f"{job.task}: cost per run",
                f"${hourly * cluster.expected_hours:,.2f} for {cluster.expected_hours:g} h",
            ),
        ]
    fleet_rows, fleet_problems = services_plan(pipeline, table)
    if problems + fleet_problems:
        raise ConfigError("\n".join(problems + fleet_problems))
    return Plan(rows + fleet_rows)


@dataclass(frozen=True)
class Service:
    """A Deployment or StatefulSet a resource task applies: how many pods, what each asks for, where they may run."""

    task: str
    kind: str
    replicas: int | None  # None: set at run time (a parameter or a task output)
    requests: Requests  # per pod: CPU and memory
    devices: dict[str, int]  # per pod, by resource name: GPUs, Neuron devices
    placement: profiles.Placement
    outlives: bool  # applied with no owner reference: it keeps running (and costing) after the workflow

    @property
    def requests_text(self) -> str:
        """Each pod's CPU and memory requests, memory in Gi whatever its size (`cpu 44, memory 172Gi`)."""
        return f"cpu {cpu_text(self.requests.cpu_m)}, memory {self.requests.memory / 2**30:g}Gi"

    @property
    def devices_text(self) -> str:
        """Each pod's devices, e.g. `4 GPUs`, or `none`."""
        return ", ".join(_many(n, DEVICES[name]) for name, n in self.devices.items() if n) or "none"

    def per_node(self) -> dict[str, int]:
        """The pinned instance types eksflow knows, each with how many pods one node holds (0: not one)."""
        known = [t for t in self.placement.instance_types if t in profiles.NODES]
        return {t: _pods_per_node(self, profiles.NODES[t]) for t in known}


def services(pipeline: Pipeline) -> tuple[list[Service], list[str]]:
    """Every Deployment and StatefulSet the pipeline's resource tasks apply, as the manifests Argo gets say."""
    found, problems = [], []
    for task, template in pipeline.templates.items():
        if not isinstance(template, Resource) or not isinstance(template.manifest, str) or template.action == "delete":
            continue
        obj = yaml.safe_load(_EXPRESSION_TAG.sub("'(set at run time)'", template.manifest))
        if not isinstance(obj, dict) or obj.get("kind") not in SERVICE_KINDS:
            continue
        spec = obj.get("spec") or {}
        pod = (spec.get("template") or {}).get("spec") or {}
        resources = [c.get("resources") or {} for c in pod.get("containers") or []]
        replicas = spec.get("replicas", 1)  # Kubernetes' default
        try:
            requests = sum((container_requests(r) for r in resources), Requests())
            devices = {name: sum(_device_count(r, name) for r in resources) for name in DEVICES}
        except QuantityError as err:
            problems.append(f"{task}: {err}; fix the {obj['kind']}'s container resources")
            continue
        found.append(
            Service(
                task=task,
                kind=obj["kind"],
                replicas=replicas if isinstance(replicas, int) else None,
                requests=requests,
                devices=devices,
                placement=profiles.placement(pod),
                outlives=not template.set_owner_reference,
            )
        )
    return found, problems


def retiring(pipeline: Pipeline) -> list[str]:
    """The resource tasks that delete a Deployment or StatefulSet (a fleet retired at run time)."""
    return [
        task
        for task, template in pipeline.templates.items()
        if isinstance(template, Resource)
        and template.action == "delete"
        and isinstance(template.manifest, str)
        and (yaml.safe_load(_EXPRESSION_TAG.sub("'(set at run time)'", template.manifest)) or {}).get("kind")
        in SERVICE_KINDS
    ]


def services_plan(pipeline: Pipeline, table: Mapping[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """The rows of every Deployment and StatefulSet and their total cost per hour; the problems found."""
    found, problems = services(pipeline)
    rows: list[tuple[str, str]] = []
    priced: list[tuple[float, float]] = []
    unknown = []
    for service in found:
        service_rows, cost = service_plan(service, table)
        rows += service_rows
        per_node = service.per_node()
        if per_node and len(per_node) == len(service.placement.instance_types) and not any(per_node.values()):
            problems.append(
                f"{service.task}: a pod requests {service.requests_text} and devices: {service.devices_text}, more "
                f"than one {' or '.join(per_node)} node has; fix: lower its requests or pin a larger instance type"
            )
        if cost is None:
            unknown.append(f"{service.task}: unknown")
        else:
            priced.append(cost)
    if found:
        parts = [_dollars(sum(c[0] for c in priced), sum(c[1] for c in priced))] if priced else []
        known = " plus ".join(parts + ([", ".join(unknown)] if unknown else []))
        # A fleet the workflow leaves running costs for as long as it serves, which no run length bounds.
        when = "after the workflow ends" if any(s.outlives for s in found) else "while the workflow runs"
        rows.append(("serving: cost per hour", f"{known}; it serves {when}: a cost per hour, not per run"))
        if deleting := retiring(pipeline):
            # A full fine-tune's rollout: the champion's fleet and the candidate's both serve during the canary,
            # and the loser's is deleted once it ends (promote retires the former champion's, a rollback the
            # candidate's); which one is known only then.
            rows.append(
                (
                    "serving: during a rollout",
                    f"every Deployment above; once it ends, one fewer for each Deployment {', '.join(deleting)} "
                    "deletes (named at run time)",
                )
            )
    return rows, problems


def service_plan(
    service: Service, table: Mapping[str, Any]
) -> tuple[list[tuple[str, str]], tuple[float, float] | None]:
    """One service's rows and its cost per hour: a range where several instance types may hold it; None: unknown."""
    usd: Mapping[str, float] = table["usd_per_hour"]
    name, replicas, types = service.task, service.replicas, service.placement.instance_types
    life = "left running after the workflow" if service.outlives else "deleted with the workflow"
    rows = [
        (f"{name}: pods", f"{'set at run time' if replicas is None else replicas} ({service.kind}, {life})"),
        (f"{name}: requests per pod", service.requests_text),
        (f"{name}: devices per pod", service.devices_text),
    ]
    capacity = "/".join(service.placement.capacity_types) or "any capacity type"
    unpriced = [t for t in types if t not in profiles.NODES or t not in usd]
    per_node = {t: n for t, n in service.per_node().items() if n} if types and not unpriced else {}
    if not types:
        instance = (
            f"not pinned (no {profiles.INSTANCE_TYPE_LABEL}, nor Karpenter's instance-family and instance-size, in "
            "its node selector or node affinity): the cluster picks"
        )
        why = "no instance type to price"
    elif unpriced:
        instance, why = f"{' or '.join(types)}, {capacity}", f"eksflow has no shape or price for {', '.join(unpriced)}"
    elif not per_node:
        instance, why = f"{' or '.join(types)}, {capacity}", "a pod fits no node of it"
    elif replicas is None:
        instance = " or ".join(f"{t} ({_many(n, 'pod')} per node)" for t, n in per_node.items()) + f", {capacity}"
        why = "the replicas are set at run time"
    else:
        nodes = {t: math.ceil(replicas / n) for t, n in per_node.items()}
        costs = [usd[t] * count for t, count in nodes.items()]
        instance = " or ".join(f"{t} x {nodes[t]} ({_many(n, 'pod')} per node)" for t, n in per_node.items())
        dated = f"(on-demand, {table['region']}, prices as of {table['as_of']})"
        rows += [
            (f"{name}: instance", f"{instance}, {capacity}"),
            (f"{name}: cost per hour", f"{_dollars(min(costs), max(costs))} {dated}"),
        ]
        return rows, (min(costs), max(costs))
    return [*rows, (f"{name}: instance", instance), (f"{name}: cost per hour", f"unknown: {why}")], None


def _pods_per_node(service: Service, node: profiles.Profile) -> int:
    """How many of the service's pods one node holds by their requests (0: not one), at most its replicas."""
    fits = [service.replicas or 1]
    if service.requests.cpu_m:
        fits.append(node.vcpus * 1000 // service.requests.cpu_m)
    if service.requests.memory:
        fits.append(node.memory_gib * 2**30 // service.requests.memory)
    offered = {profiles.NEURON_RESOURCE if node.kind == "trainium" else profiles.GPU_RESOURCE: node.devices}
    fits += [offered.get(name, 0) // n for name, n in service.devices.items() if n]
    return min(fits)


def _device_count(resources: Mapping[str, Any], name: str) -> int:
    """A container's devices of one kind: its limits (an extended resource's requests must equal them), or requests."""
    value = (resources.get("limits") or {}).get(name, (resources.get("requests") or {}).get(name))
    return 0 if value is None else quantity(value, name)


def _many(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _dollars(low: float, high: float) -> str:
    return f"${low:,.2f}" if low == high else f"${low:,.2f} to ${high:,.2f}"


def print_plan(plan: Plan, console: Console) -> None:
    """Print the plan as a two-column table."""
    table = Table(title="plan", show_header=False)
    for name, value in plan.rows:
        table.add_row(name, value)
    console.print(table)


_UNKNOWN = object()  # a value only the run knows (a task output, a fan-out item): the settings' own stands in


def _resolved(value: object, pipeline: Pipeline) -> object:
    """A value as configured: a workflow parameter's default in place of its reference; _UNKNOWN for the rest."""
    if isinstance(value, Ref):
        prefix = "{{workflow.parameters."
        if value.argo.startswith(prefix) and value.argo.endswith("}}") and value.argo.count("{{") == 1:
            return pipeline.parameter_values.get(value.argo[len(prefix) : -2], "")
        return value.argo if value.producer is None and value.dag is None else _UNKNOWN
    return value
