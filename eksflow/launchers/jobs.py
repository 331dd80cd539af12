"""The Kubernetes objects a distributed step runs in: a KubeRay RayJob, a Volcano PodGroup, a Volcano Job.

Pure functions of the config, the accelerator profile and the step's argv; eksflow.launchers turns them into Argo
resource templates. Every pod is wired from its profile (eksflow.profiles) the same way.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from eksflow import profiles
from eksflow.config import PipelineConfig, cluster_of
from eksflow.profiles import Profile

RAYJOB_SUCCESS = "status.jobDeploymentStatus == Complete,status.jobStatus == SUCCEEDED"
RAYJOB_FAILURE = "status.jobDeploymentStatus == Failed"
VOLCANO_SUCCESS = "status.state.phase == Completed"
VOLCANO_FAILURE = "status.state.phase in (Failed,Aborted,Terminated)"
RDZV_PORT = 29400
NON_WORD = re.compile(r"\W")
PARAMETER = re.compile(r"\{\{(workflow|inputs)\.parameters\.([\w\-]+)\}\}")


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
        spec["nodeSelector"] = profiles.node_selector(profile, spot=cluster.spot, zone=cluster.zone)
        if tolerations := profiles.tolerations(profile):
            spec["tolerations"] = tolerations
    if cluster.scheduler == "volcano":
        spec["schedulerName"] = "volcano"
    return spec


def pod_metadata(cfg: PipelineConfig, task: str) -> dict[str, Any]:
    """Labels, Karpenter do-not-disrupt, and the Volcano PodGroup a pod belongs to."""
    cluster = cluster_of(cfg)
    metadata: dict[str, Any] = {
        "labels": {"app.kubernetes.io/part-of": "eksflow", "eksflow.dev/pipeline": cfg.name},
        "annotations": dict(profiles.DO_NOT_DISRUPT),
    }
    if cluster.scheduler == "volcano":
        metadata["annotations"]["scheduling.k8s.io/group-name"] = podgroup_name(task)
    return metadata


def podgroup_name(task: str) -> str:
    """The PodGroup gang-scheduling a RayJob under Volcano."""
    return f"{{{{workflow.name}}}}-{task}-pg"


def entrypoint(argv: list[str]) -> tuple[str, list[dict[str, str]]]:
    """A shell command line for `argv`, with parameters passed as environment variables.

    RayJob runs its entrypoint through a shell, so an Argo parameter must never be spliced into it (S2): each
    `{{workflow.parameters.x}}` or `{{inputs.parameters.x}}` becomes "${EKSFLOW_PARAM_X}" (expanded once, never
    re-parsed) and the returned env entries carry the values in the head container's structured env. Everything
    else is shell-quoted.
    """
    env: dict[str, str] = {}
    words = []
    for item in argv:
        pieces = PARAMETER.split(item)  # literal, scope, name, literal, scope, name, ..., literal
        word = ""
        for i in range(0, len(pieces), 3):
            if pieces[i]:
                word += shlex.quote(pieces[i])
            if i + 2 < len(pieces):
                scope, name = pieces[i + 1], pieces[i + 2]
                prefix = "PARAM" if scope == "workflow" else "INPUT"
                var = f"EKSFLOW_{prefix}_{NON_WORD.sub('_', name).upper()}"
                env[var] = f"{{{{{scope}.parameters.{name}}}}}"
                word += f'"${{{var}}}"'
        words.append(word)
    return " ".join(words), [{"name": k, "value": v} for k, v in env.items()]


def rayjob(cfg: PipelineConfig, task: str, module: str, argv: list[str]) -> dict[str, Any]:
    """The RayJob: a head pod (driver, no devices) and `nodes` worker pods; the entrypoint is the step."""
    cluster = cluster_of(cfg)
    profile = profiles.profile_for(cluster.instance_type)
    labels = {"app.kubernetes.io/part-of": "eksflow", "eksflow.dev/pipeline": cfg.name}
    command, parameter_env = entrypoint(["python", "-m", module, *argv])
    head = pod_spec(cfg, profile, {"name": "ray-head"}, head=True)
    head["containers"][0]["env"] += parameter_env  # the driver runs on the head, with the head's environment
    spec: dict[str, Any] = {
        "entrypoint": command,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": cluster.ttl_seconds_after_finished,
        "backoffLimit": cluster.rayjob_backoff_limit,
        "activeDeadlineSeconds": 23 * 3600,  # inside the workflow's 24 h, so the RayJob fails first and says why
        "rayClusterSpec": {
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},  # no training work on the head
                "template": {
                    "metadata": pod_metadata(cfg, task),
                    "spec": head,
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": profile.kind,
                    "replicas": cluster.nodes,
                    "minReplicas": cluster.nodes,
                    "maxReplicas": cluster.nodes,
                    "rayStartParams": {},
                    "template": {
                        "metadata": pod_metadata(cfg, task),
                        "spec": pod_spec(cfg, profile, {"name": "ray-worker"}),
                    },
                }
            ],
        },
    }
    if cluster.scheduler == "kueue":
        labels["kueue.x-k8s.io/queue-name"] = cluster.queue
        spec["suspend"] = True  # Kueue admits the whole job (head + workers) at once by unsuspending it
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": job_name(task), "labels": labels},
        "spec": spec,
    }


def podgroup(cfg: PipelineConfig, task: str, members: int) -> dict[str, Any]:
    """Volcano gang: no pod of the job starts until all `members` can."""
    cluster = cluster_of(cfg)
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": podgroup_name(task), "labels": {"app.kubernetes.io/part-of": "eksflow"}},
        "spec": {"minMember": members, "queue": cluster.queue},
    }


def volcano_job(cfg: PipelineConfig, task: str, module: str, argv: list[str]) -> dict[str, Any]:
    """Trainium: one torchrun per node, `nproc_per_node` = Neuron cores per node, rendezvous on the first pod."""
    cluster = cluster_of(cfg)
    profile = profiles.profile_for(cluster.instance_type)
    nodes = cluster.nodes
    role = "worker"
    # Volcano's svc plugin gives each pod the DNS name <job>-<role>-<index>.<job>.
    endpoint = f"{job_name(task)}-{role}-0.{job_name(task)}:{RDZV_PORT}"
    command = [
        "torchrun",
        f"--nnodes={nodes}",
        f"--nproc_per_node={profile.workers}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        "--rdzv_id={{workflow.name}}",
        "-m",
        module,
        *argv,
    ]
    spec = pod_spec(cfg, profile, {"name": "train", "command": command})
    spec["restartPolicy"] = "Never"
    spec.pop("schedulerName", None)  # the Job's own schedulerName applies to every pod
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": job_name(task), "labels": {"app.kubernetes.io/part-of": "eksflow"}},
        "spec": {
            "schedulerName": "volcano",
            "queue": cluster.queue,
            "minAvailable": nodes,
            "maxRetry": cluster.rayjob_backoff_limit,
            "ttlSecondsAfterFinished": cluster.ttl_seconds_after_finished,
            "plugins": {"svc": [], "env": []},
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
            "tasks": [
                {
                    "name": role,
                    "replicas": nodes,
                    "minAvailable": nodes,
                    "template": {
                        "metadata": {
                            "labels": pod_metadata(cfg, task)["labels"],
                            "annotations": dict(profiles.DO_NOT_DISRUPT),
                        },
                        "spec": spec,
                    },
                }
            ],
        },
    }
