"""What every job launcher (rayjob, mpijob, volcano) shares: the job task, its outputs collector, its pods.

A resource template has no container whose files Argo could read, so the step writes its outputs to FSx and a
small `<task>-outputs` container task publishes them as output parameters (Argo reads output parameters from a
mounted volume): downstream tasks read that task, so the DAG is the same for every launcher. `JobLauncher.add`
builds both from the launcher's manifest; the pod helpers wire every pod from its profile (eksflow.profiles) the
same way.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from hera.workflows import Container, Parameter, RetryStrategy
from hera.workflows import models as m

from eksflow import profiles, topology
from eksflow.cluster import ClusterSettings, cluster_of
from eksflow.config import PipelineConfig
from eksflow.launchers.base import Job, JobRequest, Launcher, attempt_deadline_s
from eksflow.names import pipeline_labels
from eksflow.pipeline import Pipeline
from eksflow.profiles import Profile
from eksflow.refs import TaskRef
from eksflow.resources import resource
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
    template_fingerprint,
)

# Argo sees only the job's final status, not the step's exit code, so it cannot skip bad input (exit 2) here:
# one more attempt at most (config errors are refused before submit by `plan`). Each attempt creates a new job
# ({{retries}} in its name) that resumes from the newest checkpoint on FSx.
JOB_RETRY = RetryStrategy(limit="1", retry_policy="Always", backoff=m.Backoff(duration="1m", factor="2"))
# Argo waits for a job this much longer than the job's own deadline (attempt_deadline_s): the job fails first and
# says why, and a job that never reports is still given up on.
DEADLINE_MARGIN_S = 300


class JobLauncher(Launcher):
    """A launcher running the step in a Kubernetes job: a resource template, then the `<task>-outputs` collector."""

    in_job_retries: ClassVar[bool] = True  # whether the step's own retries (Ray Train's max_failures) take part

    @abstractmethod
    def manifest(self, request: JobRequest, argv: list[str]) -> dict[str, Any]:
        """The job object running the step with `argv` (its outputs written to outputs_dir)."""

    @abstractmethod
    def conditions(self, cfg: PipelineConfig) -> tuple[str, str]:
        """Argo's success and failure conditions over the job object's status."""

    def before(self, request: JobRequest) -> TaskRef | None:
        """A task the job waits on, added first in its place in the DAG (a PodGroup); None by default."""
        return None

    def attempts(self, cfg: PipelineConfig, job: Job) -> int:
        """(Argo's JOB_RETRY) x (the job's own retries) x (the step's in-job retries, where it has them)."""
        argo = int(str(JOB_RETRY.limit)) + 1
        inner = job.inner_retries if self.in_job_retries else 0
        return argo * (cluster_of(cfg).backoff_limit + 1) * (inner + 1)

    def add(self, request: JobRequest) -> TaskRef:
        """The job task and its collector, each memoized: a hit skips the job and still gives outputs.

        Their keys differ (the same fingerprint): under one key the collector would hit the job's entry, saved
        moments before with no outputs, on the first run.
        """
        pipeline = Pipeline.current()
        cfg, name, step = request.cfg, request.task, request.step
        args_type, outputs = contract(step)
        sections = [request.settings, *request.sections]
        argv, inputs = arguments(args_type, name, sections, request.values, outputs_dir=outputs_dir(cfg, name))
        image, memoize = request.cluster.image, request.memoize
        fingerprint = template_fingerprint(step, image, argv, memoize, pipeline.parameter_values)
        memo, memo_inputs = memoization(cfg, name, fingerprint, memoize)
        seconds = f"{name.replace('-', '_')}_job_seconds"
        success, failure = self.conditions(cfg)
        first = self.before(request)
        job = resource(
            name,
            self.manifest(request, argv),
            success=success,
            failure=failure,
            after=request.after if first is None else first,
            when=request.when if first is None else None,  # the first task holds the condition
            inputs={**inputs, **memo_inputs},
            retry_strategy=JOB_RETRY,
            prometheus=gauges(cfg, **{seconds: ("wall time of the job, queueing included", "{{duration}}")}),
            memoize=memo,
            step=step.__name__,
            active_deadline_seconds=attempt_deadline_s(cfg) + DEADLINE_MARGIN_S,
        )
        collected, _ = memoization(cfg, f"{name}-outputs", fingerprint, memoize)
        template = collector(cfg, name, list(outputs), step_gauges(cfg, step, name), collected, list(memo_inputs))
        collect = f"{name}-outputs"
        return pipeline.add(
            collect, template, step=step.__name__, outputs=outputs, inputs=memo_inputs, after=job,
            fingerprint=fingerprint,
        )  # fmt: skip


def collector(
    cfg: PipelineConfig,
    task_name: str,
    outputs: list[str],
    metrics: m.Metrics | None,
    memoize: m.Memoize | None,
    memo_inputs: list[str],
) -> Container:
    """Publishes the step's output files (written on FSx) as this task's output parameters, memoized as its job."""
    files = [f"{outputs_dir(cfg, task_name)}/{name}" for name in outputs]
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
        memoize=memoize,
        inputs=[Parameter(name=param) for param in memo_inputs] or None,
    )


def job_name(task: str) -> str:
    """One job per task and workflow attempt; `setOwnerReference` deletes it with the workflow."""
    return f"{{{{workflow.name}}}}-{task}-{{{{retries}}}}"


def outputs_dir(cfg: PipelineConfig, task: str) -> str:
    """Where the step writes its output files on FSx when it runs inside a job (no pod file Argo could read)."""
    return f"{cfg.storage.fsx_mount}/runs/{{{{workflow.name}}}}/{task}/outputs"


def pod_spec(cfg: PipelineConfig, profile: Profile, container: dict[str, Any], *, head: bool = False) -> dict[str, Any]:
    """A training pod: profile resources and placement, FSx + /dev/shm, service account, security context."""
    cluster = cluster_of(cfg)
    container = {
        **container,
        "image": cluster.neuron_image if profile.kind == "trainium" else cluster.image,
        "env": profiles.env(profile, cluster.nodes),
        "resources": profiles.resources(profile, head=head),
        "volumeMounts": profiles.volume_mounts(profile, cfg.storage.fsx_mount),
        "securityContext": profiles.container_security(profile),
    }
    spec: dict[str, Any] = {
        "serviceAccountName": cfg.service_account,
        "securityContext": profiles.pod_security(),
        "containers": [container],
        "volumes": profiles.volumes(profile, cfg.storage.fsx_claim),
    }
    if head:  # the head only coordinates: any on-demand CPU node, never a Spot node it could lose
        spec["nodeSelector"] = {profiles.CAPACITY_TYPE_LABEL: "on-demand"}
    else:
        spec["nodeSelector"] = profiles.node_selector(profile, spot=cluster.spot, zone=cluster.zone)
        if tolerations := profiles.tolerations(profile):
            spec["tolerations"] = tolerations
    if cluster.scheduler == "volcano":
        spec["schedulerName"] = "volcano"
    return spec


def training_pod_annotations(cluster: ClusterSettings) -> dict[str, str]:
    """A training pod's annotations: Karpenter's do-not-disrupt, and Kueue's podset topology where one is asked."""
    return {**profiles.DO_NOT_DISRUPT, **topology.pod_annotations(cluster)}


def pod_metadata(cfg: PipelineConfig, task: str) -> dict[str, Any]:
    """Labels, Karpenter do-not-disrupt, Kueue's topology, and the Volcano PodGroup a pod belongs to."""
    cluster = cluster_of(cfg)
    metadata: dict[str, Any] = {
        "labels": pipeline_labels(cfg.name),
        "annotations": training_pod_annotations(cluster),
    }
    if cluster.scheduler == "volcano":
        metadata["annotations"]["scheduling.k8s.io/group-name"] = podgroup_name(task)
    return metadata


def podgroup_name(task: str) -> str:
    """The PodGroup gang-scheduling a RayJob under Volcano."""
    return f"{{{{workflow.name}}}}-{task}-pg"
