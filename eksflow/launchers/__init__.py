"""Distributed steps: `distributed(step, settings, ...)` runs any step module across workers, per accelerator profile.

- cpu: the plain container task (what `run` executes locally), one pod, one CPU per worker thread.
- gpu: an Argo `resource` template creating a KubeRay RayJob (ray.io/v1) that runs `python -m <step> ...` on a head
  pod plus one worker pod per node, gang-admitted by Kueue (or Volcano, with a PodGroup task first).
- trainium: a resource template creating a Volcano Job running torchrun of `neuron_step` on every node.
- `cluster.launcher: mpijob` (GPU or CPU): an MPIJob (kubeflow.org/v2beta1) whose launcher runs
  `mpirun ... python -m <step> --launcher=mpi` over sshd worker pods (eksflow.launchers.mpijob).

The step's settings must carry the worker layout (`num_workers`, `cpus_per_worker`, `use_gpu`): the profile sets
`num_workers` to one per device on every node. A resource template has no container whose files Argo could read,
so the step writes its outputs to FSx and a small `<task>-outputs` container task publishes them as output
parameters (Argo reads output parameters from a mounted volume): downstream tasks read that task, so the DAG is
the same for every profile. Each job is recorded on the pipeline for `plan`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hera.workflows import Container, Parameter, Resource, Resources, RetryStrategy
from hera.workflows import models as m

from eksflow import profiles
from eksflow.config import PipelineConfig, cluster_of
from eksflow.errors import PipelineError
from eksflow.launchers import jobs, mpijob
from eksflow.manifests import manifest_text
from eksflow.pipeline import Pipeline, step_name
from eksflow.profiles import Profile
from eksflow.refs import Ref, TaskRef, When
from eksflow.runtime.args import Settings
from eksflow.sections import Section, section_values
from eksflow.templates import (
    FSX_VOLUME,
    RESTRICTED,
    SMALL,
    arguments,
    contract,
    gauges,
    memoization,
    step_gauges,
    step_retry,
    task,
    template_fingerprint,
)

LAYOUT_FIELDS = ("num_workers", "cpus_per_worker", "use_gpu")
# Argo sees only the job's final status, not the step's exit code, so it cannot skip bad input (exit 2) here:
# one more attempt at most (config errors are refused before submit by `plan`). Each attempt creates a new job
# ({{retries}} in its name) that resumes from the newest checkpoint on FSx.
JOB_RETRY = RetryStrategy(limit="1", retry_policy="Always", backoff=m.Backoff(duration="1m", factor="2"))


@dataclass(frozen=True)
class Job:
    """A distributed task as `plan` sees it: its step, its settings with the profile's layout, where it runs."""

    task: str
    launcher: str  # container | rayjob | mpijob | volcano
    step: ModuleType
    settings: Settings  # with the profile's layout
    values: Mapping[str, object]  # the task's other arguments (literals and Refs)
    profile: Profile
    inner_retries: int  # the step's own retries inside one job attempt (Ray Train's max_failures)
    section: str  # where the settings live in the config, for messages: `train`
    configured: Mapping[str, object]  # the layout fields the user set explicitly (checked against the profile)

    def attempts(self, cfg: PipelineConfig) -> int:
        """Most attempts the retry layers allow together: (Argo) x (the job's own retries) x (in-job retries)."""
        if self.launcher == "container":
            return cfg.retry.limit + 1
        cluster = cluster_of(cfg)
        argo = int(str(JOB_RETRY.limit)) + 1
        inner = 0 if self.launcher == "mpijob" else self.inner_retries  # mpirun has no in-job retry
        return argo * (cluster.rayjob_backoff_limit + 1) * (inner + 1)


def layout(settings: Settings, profile: Profile, nodes: int) -> Settings:
    """The settings with the layout the profile implies: one worker per device on every node."""
    if profile.kind == "cpu":
        return settings
    return settings.model_copy(update={"num_workers": nodes * profile.workers, "use_gpu": profile.kind == "gpu"})


def worker_layout(settings: Settings) -> tuple[int, int]:
    """(num_workers, cpus_per_worker) of a distributed step's settings."""
    values = settings.model_dump(include={"num_workers", "cpus_per_worker"})
    return int(values["num_workers"]), int(values["cpus_per_worker"])


def section_of(cfg: PipelineConfig, settings: Settings) -> str:
    """The config key holding `settings` (`train`), or the settings' class name when it is not a section."""
    for name in type(cfg).model_fields:
        if getattr(cfg, name) is settings:
            return name
    return type(settings).__name__


def distributed(
    step: ModuleType,
    settings: Settings,
    *sections: Settings | Section,
    neuron_step: ModuleType | None = None,
    task_name: str | None = None,
    after: TaskRef | Sequence[TaskRef] = (),
    when: When | None = None,
    memoize: Sequence[Ref | TaskRef] = (),
    **values: Any,
) -> TaskRef:
    """Add `step` as a distributed task for the configured instance type; returns the task holding its outputs.

    `settings` is the step's config section, with the worker layout the profile sets; `sections` and `values` fill
    the rest of its Args, as for task().

    `memoize` as for task(): on a job profile both the job and the task publishing its outputs are memoized under
    one key, so a hit skips the job and still gives the outputs.
    """
    pipeline = Pipeline.current()
    cfg = pipeline.cfg
    cluster = cluster_of(cfg)
    name = task_name or step_name(step)
    missing = [f for f in LAYOUT_FIELDS if f not in type(settings).model_fields]
    if missing:
        raise PipelineError(f"distributed({step.__name__}): its settings need the worker layout fields {missing}")
    profile = profiles.profile_for(cluster.instance_type)
    if profile.kind == "trainium" and neuron_step is None:
        raise PipelineError(f"distributed({step.__name__}): no neuron_step= for Trainium ({profile.instance_type})")
    placed = layout(settings, profile, cluster.nodes)
    launcher = {"cpu": "container", "gpu": "rayjob", "trainium": "volcano"}[profile.kind]
    if cluster.launcher == "mpijob" and profile.kind != "trainium":  # Trainium + mpijob: refused by `plan`
        launcher = "mpijob"
        args_type = contract(step)[0]
        if "launcher" not in args_type.model_fields:
            raise PipelineError(
                f"distributed({step.__name__}): cluster.launcher=mpijob runs it as `--launcher=mpi` ranks of mpirun, "
                "but its Args have no `launcher` field"
            )
        values = {**values, "launcher": "mpi"}
    pipeline.jobs.append(
        Job(
            task=name,
            launcher=launcher,
            step=step,
            settings=placed,
            values={**section_values(sections, contract(step)[0].model_fields, name), **values},
            profile=profile,
            inner_retries=int(getattr(step, "MAX_FAILURES", 0)),
            section=section_of(cfg, settings),
            configured={f: getattr(settings, f) for f in LAYOUT_FIELDS if f in settings.model_fields_set},
        )
    )
    metrics = step_gauges(cfg, step, name)  # the collector publishes the outputs the gauges read
    if launcher == "container":
        workers, threads = worker_layout(placed)
        workers *= threads
        added = task(
            step,
            placed,
            *sections,
            task_name=name,
            after=after,
            when=when,
            container_image=cluster.image,
            resources=Resources(cpu_request=workers, memory_request=f"{6 * workers}Gi"),
            memoize=memoize,
            **values,
        )
        container = pipeline.templates[name]
        assert isinstance(container, Container)
        # Same placement as a job's pods: the profile's nodes, and Karpenter never consolidates a node under it.
        container.node_selector = profiles.node_selector(profile, spot=cluster.spot, zone="")
        container.annotations = {**(container.annotations or {}), **profiles.DO_NOT_DISRUPT}
        return added
    args_type, outputs = contract(step)
    argv, inputs = arguments(args_type, name, [placed, *sections], values, outputs_dir=jobs.outputs_dir(cfg, name))
    fingerprint = template_fingerprint(step, cluster.image, argv, memoize, pipeline.parameter_values)
    memo, memo_inputs = memoization(cfg, name, fingerprint, memoize)
    duration = gauges(
        cfg, **{f"{name.replace('-', '_')}_job_seconds": ("wall time of the job, queueing included", "{{duration}}")}
    )
    previous: TaskRef | Sequence[TaskRef] = after
    condition = when
    if launcher == "mpijob":
        workers = worker_layout(placed)[0]
        manifest = mpijob.manifest(cfg, name, step.__name__, workers, argv)
        success, failure = mpijob.SUCCESS, mpijob.failure(cfg)
    elif launcher == "rayjob":
        manifest = jobs.rayjob(cfg, name, step.__name__, argv)
        success, failure = jobs.RAYJOB_SUCCESS, jobs.RAYJOB_FAILURE
        if cluster.scheduler == "volcano":
            group = f"{name}-podgroup"
            previous = pipeline.add(
                group,
                _resource(group, jobs.podgroup(cfg, name, cluster.nodes + 1)),
                step="Volcano PodGroup",
                outputs={},
                after=after,
                when=when,
            )
            condition = None
    else:
        manifest = jobs.volcano_job(cfg, name, str(neuron_step.__name__ if neuron_step else ""), argv)
        success, failure = jobs.VOLCANO_SUCCESS, jobs.VOLCANO_FAILURE
    job_template = _resource(name, manifest, success, failure, JOB_RETRY, duration, inputs=[*inputs, *memo_inputs])
    job_template.memoize = memo
    job = pipeline.add(
        name,
        job_template,
        step=step.__name__,
        outputs={},
        inputs={**inputs, **memo_inputs},
        after=previous,
        when=condition,
    )
    collect = f"{name}-outputs"
    collector = _collector(cfg, name, list(outputs), metrics)
    collector.memoize = memo
    collector.inputs = [Parameter(name=param) for param in memo_inputs] or None
    published = pipeline.add(collect, collector, step=step.__name__, outputs=outputs, inputs=memo_inputs, after=job)
    published._fingerprint = fingerprint
    return published


def _resource(
    name: str,
    manifest: dict[str, object],
    success: str | None = None,
    failure: str | None = None,
    retry: RetryStrategy | None = None,
    metrics: m.Metrics | None = None,
    *,
    inputs: Sequence[str] = (),
) -> Resource:
    return Resource(
        name=name,
        action="create",
        set_owner_reference=True,  # deleting the workflow deletes the job and its pods
        success_condition=success,
        failure_condition=failure,
        retry_strategy=retry,
        manifest=manifest_text(manifest),  # parameters as JSON-encoding expressions, never as text
        metrics=metrics,
        inputs=[Parameter(name=i) for i in inputs] or None,
    )


def _collector(cfg: PipelineConfig, task_name: str, outputs: list[str], metrics: m.Metrics | None) -> Container:
    """Publishes the step's output files (written on FSx) as this task's output parameters."""
    files = [f"{jobs.outputs_dir(cfg, task_name)}/{name}" for name in outputs]
    return Container(
        name=f"{task_name}-outputs",
        image=cfg.image,
        command=["cat", *files],  # fails if the step did not write every output; logs them otherwise
        outputs=[
            Parameter(name=name, value_from=m.ValueFrom(path=path)) for name, path in zip(outputs, files, strict=True)
        ],
        volume_mounts=[m.VolumeMount(name=FSX_VOLUME, mount_path=cfg.storage.fsx_mount)],
        resources=SMALL,
        retry_strategy=step_retry(cfg),
        security_context=RESTRICTED,
        metrics=metrics,
    )
