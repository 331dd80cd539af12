"""`plan`: the preflight checks and estimates printed before anything is submitted.

For every distributed task of the pipeline (eksflow.launchers.distributed) it checks the layout the accelerator
profile implies (workers vs devices or vCPUs, EFA in one zone, the retry budget), asks the step itself
(`preflight` in its contract module, see eksflow.runtime.preflight) about memory and anything else only the step
knows, and prices the run. Every problem is a `field: what is wrong; fix: ...` line; `check` raises ConfigError
with all of them at once (exit 2), otherwise returns the rows of the plan table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from eksflow.config import ConfigError, PipelineConfig, cluster_of
from eksflow.launchers import Job
from eksflow.launchers.base import refusal, worker_layout
from eksflow.pipeline import Pipeline
from eksflow.refs import Ref
from eksflow.runtime.preflight import Layout, Preflight

PRICES = Path(__file__).with_name("prices.yaml")


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
        per_worker = profile.memory_gib / max(workers, 1)
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


def layout_problems(job: Job, cfg: PipelineConfig) -> list[str]:
    """Workers must match the nodes' devices (GPU, Neuron) or fit the node's vCPUs (CPU); EFA stays in one zone."""
    cluster = cluster_of(cfg)
    profile, settings, section = job.profile, job.settings, job.section
    problems = []
    workers, threads = worker_layout(settings)
    if refused := refusal(cluster, profile):
        problems.append(refused)
    if profile.kind == "cpu":
        if workers * threads > profile.vcpus:
            problems.append(
                f"{section}.num_workers: {workers} workers x {threads} CPUs exceed the {profile.vcpus} vCPUs of "
                f"{profile.instance_type}; fix: lower {section}.num_workers or {section}.cpus_per_worker"
            )
        if cluster.nodes > 1:
            problems.append("cluster.nodes: a CPU job runs in one pod; fix: --set cluster.nodes=1")
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
            f"{job.task}, more than the budget of {cluster.retry_budget}; fix: lower cluster.rayjob_backoff_limit or "
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
    if problems:
        raise ConfigError("\n".join(problems))
    return Plan(rows)


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
