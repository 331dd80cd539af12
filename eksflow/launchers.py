"""Training launchers: how the train step runs for each accelerator profile.

- cpu: the plain container template from `step_factory` (what `run` executes locally).
- gpu: an Argo `resource` template that creates a KubeRay RayJob (ray.io/v1) running `python -m steps.train ...`
  on a head pod plus one worker pod per node, gang-admitted by Kueue or Volcano.
- trainium: an Argo `resource` template that creates a Volcano Job running torchrun on every node.

A resource template has no container whose files Argo could read, so the train step writes its outputs to FSx
(`--outputs-dir=<run>/train/outputs`) and a small `train-outputs` container task publishes those files as output
parameters (Argo reads output parameters from a mounted volume). Downstream tasks read that task's outputs, so the
DAG is the same for every profile.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

import yaml
from hera.workflows import Container, Parameter, Resource, Resources, RetryStrategy, Task
from hera.workflows import models as m

from eksflow import profiles
from eksflow.config import PipelineConfig
from eksflow.profiles import Profile
from eksflow.templates import (
    FSX_VOLUME,
    RESTRICTED,
    SMALL,
    STEP_RETRY,
    StepFactory,
    StepTemplate,
    gauges,
    step_argv,
)
from steps import train
from steps.train import MAX_FAILURES, TrainSettings

TRAINIUM_MODULE = "steps.train_neuron"  # optimum-neuron NeuronTrainer, same Args as steps.train
RAYJOB_SUCCESS = "status.jobDeploymentStatus == Complete,status.jobStatus == SUCCEEDED"
RAYJOB_FAILURE = "status.jobDeploymentStatus == Failed"
VOLCANO_SUCCESS = "status.state.phase == Completed"
VOLCANO_FAILURE = "status.state.phase in (Failed,Aborted,Terminated)"
RDZV_PORT = 29400
WORKFLOW_PARAMETER = re.compile(r"\{\{workflow\.parameters\.(\w+)\}\}")
# Argo sees only the job's final status, not the train step's exit code, so it cannot skip bad input (exit 2) here:
# one more attempt at most (config errors are refused before submit by `plan`). Each attempt creates a new job
# ({{retries}} in its name) that resumes from the newest checkpoint on FSx.
TRAIN_JOB_RETRY = RetryStrategy(limit="1", retry_policy="Always", backoff=m.Backoff(duration="1m", factor="2"))


def train_metrics(cfg: PipelineConfig) -> m.Metrics:
    """Loss and throughput of the finished training run, for Prometheus and the Argo UI."""
    return gauges(
        cfg,
        train_final_loss=("mean training loss of the last logging window", "{{outputs.parameters.final_loss}}"),
        train_tokens_per_second=("training throughput, all workers", "{{outputs.parameters.tokens_per_s}}"),
    )


def retry_attempts(cfg: PipelineConfig) -> int:
    """Most training attempts the retry layers allow together: (Argo) x (RayJob, MPIJob or Volcano Job) x Ray Train."""
    if profiles.profile_for(cfg.cluster.instance_type).kind == "cpu" and cfg.cluster.launcher != "mpijob":
        return int(str(STEP_RETRY.limit)) + 1
    argo = int(str(TRAIN_JOB_RETRY.limit)) + 1
    return argo * (cfg.cluster.rayjob_backoff_limit + 1) * (MAX_FAILURES + 1)


def train_layout(cfg: PipelineConfig, profile: Profile) -> TrainSettings:
    """Train settings with the layout the profile implies: one Ray Train worker per device on every node."""
    if profile.kind == "cpu":
        return cfg.train
    return cfg.train.model_copy(
        update={"num_workers": cfg.cluster.nodes * profile.workers, "use_gpu": profile.kind == "gpu"}
    )


def job_name() -> str:
    """One training job per workflow attempt; `setOwnerReference` deletes it with the workflow."""
    return "{{workflow.name}}-train-{{retries}}"


def outputs_dir(cfg: PipelineConfig) -> str:
    """Where the train step writes its output files on FSx when it runs inside a job."""
    return f"{cfg.storage.fsx_mount}/runs/{{{{workflow.name}}}}/train/outputs"


def pod_spec(cfg: PipelineConfig, profile: Profile, container: dict[str, Any], *, head: bool = False) -> dict[str, Any]:
    """A training pod: profile resources and placement, FSx + /dev/shm, service account, security context."""
    container = {
        **container,
        "image": cfg.images.train_neuron if profile.kind == "trainium" else cfg.images.train,
        "env": profiles.env(profile),
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
        spec["nodeSelector"] = profiles.node_selector(profile, spot=cfg.cluster.spot, zone=cfg.cluster.zone)
        if tolerations := profiles.tolerations(profile):
            spec["tolerations"] = tolerations
    if cfg.cluster.scheduler == "volcano":
        spec["schedulerName"] = "volcano"
    return spec


def pod_metadata(cfg: PipelineConfig) -> dict[str, Any]:
    """Labels, Karpenter do-not-disrupt, and the Volcano PodGroup a pod belongs to."""
    metadata: dict[str, Any] = {
        "labels": {"app.kubernetes.io/part-of": "eksflow", "eksflow.dev/pipeline": cfg.name},
        "annotations": dict(profiles.DO_NOT_DISRUPT),
    }
    if cfg.cluster.scheduler == "volcano":
        metadata["annotations"]["scheduling.k8s.io/group-name"] = podgroup_name()
    return metadata


def podgroup_name() -> str:
    """The PodGroup gang-scheduling a RayJob under Volcano."""
    return "{{workflow.name}}-train-pg"


def entrypoint(argv: list[str]) -> tuple[str, list[dict[str, str]]]:
    """A shell command line for `argv`, with workflow parameters passed as environment variables.

    RayJob runs its entrypoint through a shell, so an Argo parameter must never be spliced into it (S2): each
    `{{workflow.parameters.x}}` becomes "${EKSFLOW_PARAM_X}" (expanded once, never re-parsed) and the returned env
    entries carry the values in the head container's structured env. Everything else is shell-quoted.
    """
    env: dict[str, str] = {}
    words = []
    for item in argv:
        pieces = WORKFLOW_PARAMETER.split(item)  # literal, name, literal, name, ..., literal
        word = ""
        for i, piece in enumerate(pieces):
            if i % 2:
                var = f"EKSFLOW_PARAM_{piece.upper()}"
                env[var] = f"{{{{workflow.parameters.{piece}}}}}"
                word += f'"${{{var}}}"'
            elif piece:
                word += shlex.quote(piece)
        words.append(word)
    return " ".join(words), [{"name": k, "value": v} for k, v in env.items()]


def rayjob(cfg: PipelineConfig, argv: list[str]) -> dict[str, Any]:
    """The RayJob: a head pod (driver, no devices) and `nodes` worker pods; the entrypoint is the train step."""
    profile = profiles.profile_for(cfg.cluster.instance_type)
    labels = {"app.kubernetes.io/part-of": "eksflow", "eksflow.dev/pipeline": cfg.name}
    command, parameter_env = entrypoint(["python", "-m", train.__name__, *argv])
    head = pod_spec(cfg, profile, {"name": "ray-head"}, head=True)
    head["containers"][0]["env"] += parameter_env  # the driver runs on the head, with the head's environment
    spec: dict[str, Any] = {
        "entrypoint": command,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": cfg.cluster.ttl_seconds_after_finished,
        "backoffLimit": cfg.cluster.rayjob_backoff_limit,
        "activeDeadlineSeconds": 23 * 3600,  # inside the workflow's 24 h, so the RayJob fails first and says why
        "rayClusterSpec": {
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},  # no training work on the head
                "template": {
                    "metadata": pod_metadata(cfg),
                    "spec": head,
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": profile.kind,
                    "replicas": cfg.cluster.nodes,
                    "minReplicas": cfg.cluster.nodes,
                    "maxReplicas": cfg.cluster.nodes,
                    "rayStartParams": {},
                    "template": {
                        "metadata": pod_metadata(cfg),
                        "spec": pod_spec(cfg, profile, {"name": "ray-worker"}),
                    },
                }
            ],
        },
    }
    if cfg.cluster.scheduler == "kueue":
        labels["kueue.x-k8s.io/queue-name"] = cfg.cluster.queue
        spec["suspend"] = True  # Kueue admits the whole job (head + workers) at once by unsuspending it
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": job_name(), "labels": labels},
        "spec": spec,
    }


def podgroup(cfg: PipelineConfig, members: int) -> dict[str, Any]:
    """Volcano gang: no pod of the job starts until all `members` can."""
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": podgroup_name(), "labels": {"app.kubernetes.io/part-of": "eksflow"}},
        "spec": {"minMember": members, "queue": cfg.cluster.queue},
    }


def volcano_job(cfg: PipelineConfig, argv: list[str]) -> dict[str, Any]:
    """Trainium: one torchrun per node, `nproc_per_node` = Neuron cores per node, rendezvous on the first pod."""
    profile = profiles.profile_for(cfg.cluster.instance_type)
    nodes = cfg.cluster.nodes
    task = "worker"
    # Volcano's svc plugin gives each pod the DNS name <job>-<task>-<index>.<job>.
    endpoint = f"{job_name()}-{task}-0.{job_name()}:{RDZV_PORT}"
    command = [
        "torchrun",
        f"--nnodes={nodes}",
        f"--nproc_per_node={profile.workers}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        "--rdzv_id={{workflow.name}}",
        "-m",
        TRAINIUM_MODULE,
        *argv,
    ]
    spec = pod_spec(cfg, profile, {"name": "train", "command": command})
    spec["restartPolicy"] = "Never"
    spec.pop("schedulerName", None)  # the Job's own schedulerName applies to every pod
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": job_name(), "labels": {"app.kubernetes.io/part-of": "eksflow"}},
        "spec": {
            "schedulerName": "volcano",
            "queue": cfg.cluster.queue,
            "minAvailable": nodes,
            "maxRetry": cfg.cluster.rayjob_backoff_limit,
            "ttlSecondsAfterFinished": cfg.cluster.ttl_seconds_after_finished,
            "plugins": {"svc": [], "env": []},
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
            "tasks": [
                {
                    "name": task,
                    "replicas": nodes,
                    "minAvailable": nodes,
                    "template": {
                        "metadata": {
                            "labels": pod_metadata(cfg)["labels"],
                            "annotations": dict(profiles.DO_NOT_DISRUPT),
                        },
                        "spec": spec,
                    },
                }
            ],
        },
    }


class TrainLauncher:
    """The train step as DAG tasks; calling it adds them after `after` and returns the task holding the outputs."""

    def __init__(self, templates: list[StepTemplate | Resource], collect: StepTemplate | None) -> None:
        self.templates = templates
        self.collect = collect

    def __call__(self, *, after: Task, arguments: Mapping[str, Any] | None = None, when: str | None = None) -> Task:
        """Add the tasks after `after` (the first one only if `when` holds); the returned task carries the outputs.

        Each later task runs only if the one before it succeeded, so a skipped first task skips the rest.
        """
        first = self.templates[0]
        if isinstance(first, StepTemplate):
            task = first(arguments=arguments, when=when)
            after >> task  # type: ignore[operator]  # Hera types >> as Task | list
            return task
        previous: Task | None = None
        for template in self.templates:
            assert isinstance(template, Resource)
            created = template(when=when) if previous is None else template()
            assert isinstance(created, Task)
            if previous is None:
                after >> created  # type: ignore[operator]
            else:
                previous.on_success(created)
            previous = created
        assert self.collect is not None and previous is not None
        collected = self.collect()
        previous.on_success(collected)
        return collected


def train_launcher(cfg: PipelineConfig, step: StepFactory, **values: object) -> TrainLauncher:
    """The launcher for `cfg.cluster.instance_type`; `values` are the train step's non-settings args."""
    profile = profiles.profile_for(cfg.cluster.instance_type)
    settings = train_layout(cfg, profile)
    duration = gauges(cfg, train_job_seconds=("wall time of the training job, queueing included", "{{duration}}"))
    if cfg.cluster.launcher == "mpijob":  # Trainium: refused with the way out (mpijob.layout)
        from eksflow import mpijob  # it builds on this module's pod wiring

        argv = step_argv(train, settings, wired=(), outputs_dir=outputs_dir(cfg), launcher="mpi", **values)
        job = _resource("train", mpijob.manifest(cfg, argv), mpijob.SUCCESS, mpijob.failure(cfg), TRAIN_JOB_RETRY)
        job.metrics = duration
        return TrainLauncher([job], _collector(cfg))
    if profile.kind == "cpu":  # one pod: one CPU per worker thread
        workers = settings.num_workers
        resources = Resources(cpu_request=workers * settings.cpus_per_worker, memory_request=f"{6 * workers}Gi")
        template = step(
            train,
            settings,
            wired=["dataset_dir"],
            image=cfg.images.train,
            resources=resources,
            metrics=train_metrics(cfg),
            **values,
        )
        # Same placement as a job's pods: the profile's nodes, and Karpenter never consolidates a node under it.
        template.container.node_selector = profiles.node_selector(profile, spot=cfg.cluster.spot, zone="")
        template.container.annotations = dict(profiles.DO_NOT_DISRUPT)
        return TrainLauncher([template], None)
    argv = step_argv(train, settings, wired=(), outputs_dir=outputs_dir(cfg), **values)
    templates: list[StepTemplate | Resource] = []
    if profile.kind == "gpu":
        if cfg.cluster.scheduler == "volcano":
            templates.append(_resource("train-podgroup", podgroup(cfg, cfg.cluster.nodes + 1)))
        job = _resource("train", rayjob(cfg, argv), RAYJOB_SUCCESS, RAYJOB_FAILURE, TRAIN_JOB_RETRY, duration)
    else:
        job = _resource("train", volcano_job(cfg, argv), VOLCANO_SUCCESS, VOLCANO_FAILURE, TRAIN_JOB_RETRY, duration)
    templates.append(job)
    return TrainLauncher(templates, _collector(cfg))


def _resource(
    name: str,
    manifest: dict[str, Any],
    success: str | None = None,
    failure: str | None = None,
    retry: RetryStrategy | None = None,
    metrics: m.Metrics | None = None,
) -> Resource:
    return Resource(
        name=name,
        action="create",
        set_owner_reference=True,  # deleting the workflow deletes the job and its pods
        success_condition=success,
        failure_condition=failure,
        retry_strategy=retry,
        manifest=yaml.safe_dump(manifest, sort_keys=False),
        metrics=metrics,
    )


def _collector(cfg: PipelineConfig) -> StepTemplate:
    """Publishes the train step's output files (written on FSx) as this task's output parameters."""
    files = [f"{outputs_dir(cfg)}/{name}" for name in train.Outputs.model_fields]
    return StepTemplate(
        Container(
            name="train-outputs",
            image=cfg.images.steps,
            command=["cat", *files],  # fails if the train step did not write every output; logs them otherwise
            outputs=[
                Parameter(name=name, value_from=m.ValueFrom(path=path))
                for name, path in zip(train.Outputs.model_fields, files, strict=True)
            ],
            volume_mounts=[m.VolumeMount(name=FSX_VOLUME, mount_path=cfg.storage.fsx_mount)],
            resources=SMALL,
            retry_strategy=STEP_RETRY,
            security_context=RESTRICTED,
            metrics=train_metrics(cfg),
        )
    )
