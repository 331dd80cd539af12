"""The RayJob launcher (ray.io/v1, KubeRay): the step on a Ray head pod plus one worker pod per node, Ray Train.

It runs distributed steps on GPU nodes (the default `cluster.launcher`), and on CPU nodes when there are several
(`cluster.nodes` > 1; one CPU node is a plain pod), one training worker per node. Under Kueue the RayJob is created
suspended with the queue label and admitted whole; under Volcano a PodGroup task comes first and every pod names
it, so no pod starts until the head and all workers can.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from eksflow import profiles
from eksflow.cluster import cluster_of
from eksflow.config import PipelineConfig
from eksflow.launchers.base import Job, JobRequest, attempt_deadline_s, one_worker_per_node, register
from eksflow.launchers.jobs import JobLauncher, job_name, pod_metadata, pod_spec, podgroup_name
from eksflow.names import pipeline_labels
from eksflow.profiles import Profile
from eksflow.refs import TaskRef
from eksflow.resources import resource

SUCCESS = "status.jobDeploymentStatus == Complete,status.jobStatus == SUCCEEDED"
FAILURE = "status.jobDeploymentStatus == Failed"
NON_WORD = re.compile(r"\W")
SPOT_GRACE_S = 90  # within EC2's two-minute Spot notice, after the time Karpenter takes to drain the node
PRESTOP_WAIT_S = 15  # the workers' time to see the drain (polled every second) and commit a checkpoint
# A constant script: nothing a user or a step controls is in it.
PRESTOP_DRAIN = [
    "sh",
    "-c",
    "ray drain-node --reason=DRAIN_NODE_REASON_PREEMPTION --reason-message='pod terminating: its node is draining' "
    f"--deadline-remaining-seconds={SPOT_GRACE_S}; sleep {PRESTOP_WAIT_S}",
]
# Ray Train's PreemptionWatcher polls Ray's draining nodes every 5 s by default; every second leaves the workers
# more of the preStop wait to commit in.
RAY_ENV = [{"name": "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "value": "1"}]
PARAMETER = re.compile(r"\{\{(workflow|inputs)\.parameters\.([\w\-]+)\}\}")


class RayJob(JobLauncher):
    """Ray Train on a KubeRay RayJob: `python -m <step>` as the entrypoint on the head, `nodes` GPU workers."""

    name = "rayjob"
    kinds = frozenset({"gpu"})
    topology_aware = True

    def runs_on(self, profile: Profile, nodes: int) -> bool:
        """GPU nodes, and CPU nodes when there are several (one CPU node trains in a plain pod)."""
        return profile.kind == "gpu" or (profile.kind == "cpu" and nodes > 1)

    def prepare(self, request: JobRequest) -> JobRequest:
        """On CPU nodes, one training worker per node (Ray Train spreads CPU workers across the nodes)."""
        return one_worker_per_node(request) if request.profile.kind == "cpu" else request

    def pods(self, cfg: PipelineConfig, job: Job) -> str:
        """The head (the driver, no devices) and one worker per node."""
        return f"1 Ray head + {cluster_of(cfg).nodes} worker(s)"

    def conditions(self, cfg: PipelineConfig) -> tuple[str, str]:
        """KubeRay's deployment and job status."""
        return SUCCESS, FAILURE

    def manifest(self, request: JobRequest, argv: list[str]) -> dict[str, Any]:
        """The RayJob whose entrypoint is the step."""
        return manifest(request.cfg, request.task, request.step.__name__, argv)

    def before(self, request: JobRequest) -> TaskRef | None:
        """Under Volcano, the PodGroup of the head and every worker."""
        if request.cluster.scheduler != "volcano":
            return None
        group = podgroup(request.cfg, request.task, request.cluster.nodes + 1)
        return resource(
            f"{request.task}-podgroup", group, after=request.after, when=request.when, step="Volcano PodGroup"
        )


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


def manifest(cfg: PipelineConfig, task: str, module: str, argv: list[str]) -> dict[str, Any]:
    """The RayJob: a head pod (driver, no devices) and `nodes` worker pods; the entrypoint is the step."""
    cluster = cluster_of(cfg)
    profile = profiles.profile_for(cluster.instance_type)
    labels = pipeline_labels(cfg.name)
    command, parameter_env = entrypoint(["python", "-m", module, *argv])
    head = pod_spec(cfg, profile, {"name": "ray-head"}, head=True)
    head["containers"][0]["env"] += [*RAY_ENV, *parameter_env]  # the driver runs on the head, with its environment
    spec: dict[str, Any] = {
        "entrypoint": command,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": cluster.ttl_seconds_after_finished,
        "backoffLimit": cluster.backoff_limit,
        "activeDeadlineSeconds": attempt_deadline_s(cfg),  # the job fails first and says why
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
                        "spec": worker_pod_spec(cfg, profile),
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


def worker_pod_spec(cfg: PipelineConfig, profile: Profile) -> dict[str, Any]:
    """A worker pod that drains its Ray node before it goes, so a Spot notice becomes a checkpoint.

    Karpenter (or the node termination handler) drains a node on a Spot interruption notice; kubelet then runs
    each pod's preStop hook before SIGTERM. `ray drain-node` marks the pod's Ray node as being preempted, with the
    grace as its deadline, and the hook waits PRESTOP_WAIT_S: Ray Train's PreemptionWatcher tells the workers,
    whose loop commits a checkpoint at once and trains on. (Ray's own SIGTERM handler drains the node too, but
    its raylet exits as soon as it is drained, before the workers can react.) When the node goes, Ray Train
    restarts the workers from that checkpoint on the nodes left and the replacement (preemptions are not counted
    against its max_failures).
    """
    spec = pod_spec(cfg, profile, {"name": "ray-worker"})
    spec["containers"][0]["env"] += RAY_ENV
    spec["terminationGracePeriodSeconds"] = SPOT_GRACE_S
    spec["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": PRESTOP_DRAIN}}}
    return spec


def podgroup(cfg: PipelineConfig, task: str, members: int) -> dict[str, Any]:
    """Volcano gang: no pod of the job starts until all `members` can."""
    cluster = cluster_of(cfg)
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": podgroup_name(task), "labels": {"app.kubernetes.io/part-of": "eksflow"}},
        "spec": {"minMember": members, "queue": cluster.queue},
    }


register(RayJob())
