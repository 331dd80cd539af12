"""The TrainJob launcher (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2.3.0): torchrun in one pod per node.

`cluster.launcher: trainjob` runs a distributed step as a TrainJob referencing a (Cluster)TrainingRuntime
(`cluster.trainjob.runtime`, by default the Trainer's `torch-distributed`), on GPU nodes and on CPU nodes; the
step's Args need a `launcher` field taking "torchrun" (eksflow.llm.steps.train has one). The Trainer turns it into
a JobSet whose replicated job `node` is one Indexed Job of `numNodes` pods, each running the trainer container:

    command   torchrun -m <step>             (eksflow: `spec.trainer.command`, a plain argv, no shell)
    args      --launcher=torchrun <argv>     (eksflow: `spec.trainer.args`, references as data: manifests.py)
    env       PET_NNODES = numNodes, PET_NPROC_PER_NODE = numProcPerNode, PET_NODE_RANK = the pod's completion
              index, PET_MASTER_ADDR = <trainjob>-node-0-0.<trainjob> (the first pod, through the JobSet's
              headless Service), PET_MASTER_PORT = 29500 (the Trainer's torch plugin sets all five; it refuses them
              in `spec.trainer.env`); the profile's EFA/NCCL variables (eksflow)

torchrun reads `PET_<OPTION>` for each option it was not given (torch.distributed.argparse_util.env), so the pods
need no flag of their own: each starts `numProcPerNode` workers, rank = node rank x nproc + local rank, meeting
at rank 0's TCPStore on the first pod. eksflow sets `numProcPerNode` (the torch plugin's "auto" counts a CPU node's
cores): one process per GPU, one per CPU node. `resourcesPerNode` and the image are the profile's (the same
requests, limits and image as the other launchers' worker pods).

Pod-level settings go through `spec.runtimePatches` (manager eksflow.dev/launcher), patching the runtime's `node`
job: the pod template's labels and annotations (Karpenter do-not-disrupt, Kueue's topology annotation), its
service account, security contexts, node selector, tolerations, and the FSx claim and /dev/shm mounted into the
`node` container (a patch may not set that container's env: `spec.trainer.env` carries it).

Gang admission: under Kueue the TrainJob is created suspended with the queue label; Kueue builds one pod set per
replicated job from the Trainer's JobSet and admits them at once. Under Volcano the runtime's
`podGroupPolicy.volcano` makes the Trainer create a PodGroup; eksflow names the queue in the JobSet's annotations
(`scheduling.volcano.sh/queue-name`) through the same patch.

Retries: `activeDeadlineSeconds` bounds an attempt as for the other jobs. The TrainJob has no backoff field: the
runtime's JobSet failurePolicy decides restarts (torch-distributed has none: the first failed node fails the
TrainJob), so `cluster.backoff_limit` does not apply; Argo retries once more with a new TrainJob, which resumes
from the newest checkpoint on FSx. Argo's conditions are label selectors over JSON paths (they cannot pick a
condition by type), so they read the conditions list by position: the Trainer writes `Suspended` first for a
TrainJob created suspended (under Kueue), then `Complete` or `Failed` (the JobSet's end, or the deadline);
without suspension `Complete`/`Failed` is the first. Not exercised here: the Trainer's controller, JobSet, Kueue's
admission and topology placement, EFA and GPUs (the local executor runs the rendered pods: eksflow/local/).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from eksflow import profiles
from eksflow.cluster import ClusterSettings, cluster_of
from eksflow.config import PipelineConfig
from eksflow.errors import ConfigError, PipelineError
from eksflow.launchers.base import (
    Job,
    JobRequest,
    attempt_deadline_s,
    one_worker_per_node,
    register,
    worker_layout,
)
from eksflow.launchers.jobs import JOB_RETRY, JobLauncher, job_name, pod_spec, training_pod_annotations
from eksflow.names import pipeline_labels
from eksflow.profiles import Profile
from eksflow.templates import contract

API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINER_JOB = "node"  # the runtime's replicated job and container of the trainer (the Trainer's constants.Node)
PATCH_MANAGER = "eksflow.dev/launcher"  # a domain-prefixed path, as the Trainer's webhook requires
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
FAILURE = "status.conditions.0.type == Failed,status.conditions.1.type == Failed"  # any one fails the task
# The longest workflow name a pipeline `name` gets: a CronWorkflow's runs are `<name>-<unix time>` (10 digits);
# generateName adds 6 characters (`-` and 5), `argo submit --from` the same.
RUN_SUFFIX = len("-1765000000")
MAX_LABEL = 63  # a TrainJob's name (the CRD's CEL rule) and each pod's hostname are DNS labels
TRAINIUM_REFUSAL = (
    "cluster.launcher: trainjob runs on GPU or CPU nodes; Trainium trains with torchrun in a Volcano Job; "
    "fix: --set cluster.launcher=rayjob"
)


def success(cluster: ClusterSettings) -> str:
    """`Complete` in its place: second after `Suspended` under Kueue (created suspended), first otherwise."""
    return f"status.conditions.{1 if cluster.scheduler == 'kueue' else 0}.type == Complete"


def name_problem(pipeline: str, task: str, nodes: int) -> str:
    """Why the TrainJob of `task` or its pods would get a name the API server refuses, or "".

    The TrainJob is `<workflow>-<task>-<retry>` (jobs.job_name), an RFC 1035 label of at most 63 characters (its
    CRD's rules); the JobSet's pods get the hostnames `<TrainJob>-node-0-<i>`, DNS labels of at most 63 too.
    """
    if not pipeline[:1].isalpha():
        return (
            f"cluster.launcher: trainjob names its TrainJob after the run, and a TrainJob's name must start with a "
            f"letter (RFC 1035); the pipeline name {pipeline!r} does not; fix: --set name=<a name starting with one>"
        )
    retry = len(str(int(str(JOB_RETRY.limit))))
    longest = len(pipeline) + RUN_SUFFIX + len(f"-{task}-") + retry + len(f"-{TRAINER_JOB}-0-{nodes - 1}")
    if longest <= MAX_LABEL:
        return ""
    room = len(pipeline) - (longest - MAX_LABEL)
    return (
        f"cluster.launcher: trainjob: the pods of task {task!r} would be named up to {longest} characters "
        f"(<run>-{task}-<retry>-{TRAINER_JOB}-0-<node>, the run being <name>-<10 digits> from a CronWorkflow), "
        f"over the {MAX_LABEL} a hostname allows; fix: a pipeline name of at most {max(room, 0)} characters "
        "(--set name=...)" + ("" if room > 0 else " and a shorter task name")
    )


def processes_per_node(profile: Profile) -> int:
    """The workers torchrun starts on each node: one per GPU, one on a CPU node."""
    return profile.workers if profile.kind == "gpu" else 1


def manifest(cfg: PipelineConfig, task: str, module: str, argv: list[str]) -> dict[str, Any]:
    """The TrainJob running `torchrun -m <module> <argv>` (argv carries --launcher=torchrun) on every node."""
    cluster = cluster_of(cfg)
    profile = profiles.profile_for(cluster.instance_type)
    labels = pipeline_labels(cfg.name)
    pod = pod_spec(cfg, profile, {"name": TRAINER_JOB})
    (container,) = pod.pop("containers")
    pod.pop("schedulerName", None)  # not a patchable field: the runtime's Volcano plugin sets it
    trainer = {
        "image": container["image"],
        "command": ["torchrun", "-m", module],
        "args": argv,
        "env": container["env"],
        "numNodes": cluster.nodes,
        "numProcPerNode": processes_per_node(profile),
        "resourcesPerNode": container["resources"],
    }
    patched_container = {
        "name": TRAINER_JOB,
        "securityContext": container["securityContext"],
        "volumeMounts": container["volumeMounts"],
    }
    pod_template = {
        "metadata": {
            "labels": dict(labels),
            "annotations": training_pod_annotations(cluster),
        },
        "spec": {**pod, "containers": [patched_container]},
    }
    job_set: dict[str, Any] = {
        "spec": {"replicatedJobs": [{"name": TRAINER_JOB, "template": {"spec": {"template": pod_template}}}]}
    }
    spec: dict[str, Any] = {
        "runtimeRef": {"name": cluster.trainjob.runtime, "kind": cluster.trainjob.runtime_kind},
        "trainer": trainer,
        "activeDeadlineSeconds": attempt_deadline_s(cfg),  # the job fails first and says why
    }
    if cluster.scheduler == "kueue":
        labels["kueue.x-k8s.io/queue-name"] = cluster.queue
        spec["suspend"] = True  # Kueue admits every node's pod at once by unsuspending the TrainJob
    else:
        job_set["metadata"] = {"annotations": {VOLCANO_QUEUE_ANNOTATION: cluster.queue}}
    spec["runtimePatches"] = [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": job_set}}]
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": job_name(task), "labels": labels},
        "spec": spec,
    }


class TrainJob(JobLauncher):
    """torchrun of `python -m <step> --launcher=torchrun` in a Kubeflow Trainer TrainJob, a pod per node."""

    name = "trainjob"
    kinds = frozenset({"cpu", "gpu"})
    topology_aware = True

    def refusal(self, profile: Profile) -> str | None:
        """Trainium trains with torchrun in a Volcano Job only."""
        return TRAINIUM_REFUSAL if profile.kind == "trainium" else None

    def prepare(self, request: JobRequest) -> JobRequest:
        """Every worker runs the step with `--launcher=torchrun`: its Args need that field. CPU: one per node."""
        if problem := name_problem(request.cfg.name, request.task, request.cluster.nodes):
            raise ConfigError(problem)
        if "launcher" not in contract(request.step)[0].model_fields:
            raise PipelineError(
                f"distributed({request.step.__name__}): cluster.launcher=trainjob runs it as `--launcher=torchrun` "
                "workers of torchrun, but its Args have no `launcher` field; fix: give its Args a `launcher` field "
                'taking "torchrun" (as eksflow.llm.steps.train has), or --set cluster.launcher=rayjob'
            )
        if request.profile.kind == "cpu":
            request = one_worker_per_node(request)
        return replace(request, values={**request.values, "launcher": "torchrun"})

    def pods(self, cfg: PipelineConfig, job: Job) -> str:
        """The node pods and torchrun's workers on each."""
        cluster = cluster_of(cfg)
        per_node = processes_per_node(job.profile)
        runtime = f"{cluster.trainjob.runtime_kind} {cluster.trainjob.runtime}"
        return (
            f"{cluster.nodes} TrainJob node pod(s) x {per_node} torchrun worker(s) "
            f"({worker_layout(job.settings)[0]} in all; runtime {runtime})"
        )

    def attempts(self, cfg: PipelineConfig, job: Job) -> int:
        """Argo's JOB_RETRY only: the runtime's JobSet restarts are its own (torch-distributed: none).

        torchrun restarts no worker (no --max-restarts): a failed worker fails its pod.
        """
        return int(str(JOB_RETRY.limit)) + 1

    def conditions(self, cfg: PipelineConfig) -> tuple[str, str]:
        """The TrainJob's `Complete` and `Failed` conditions, by position."""
        return success(cluster_of(cfg)), FAILURE

    def manifest(self, request: JobRequest, argv: list[str]) -> dict[str, Any]:
        """The TrainJob whose every node runs torchrun of the step."""
        return manifest(request.cfg, request.task, request.step.__name__, argv)


register(TrainJob())
