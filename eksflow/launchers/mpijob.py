"""The MPIJob launcher (kubeflow.org/v2beta1, MPI Operator v0.8): mpirun in a launcher pod over sshd worker pods.

`cluster.launcher: mpijob` runs a distributed step through it on GPU nodes (and on CPU nodes: one worker pod, a rank
per worker, or with several nodes a worker pod with one rank on each); the step's Args need a `launcher` field
taking "mpi" (eksflow.llm.steps.train has one):

    Launcher  one small pod, no devices, started once every worker's sshd is up (launcherCreationPolicy):
                python -m eksflow.runtime.mpi_launcher --outputs-dir=<outputs> --expect=<output>... --
                    mpirun -np <nodes x slots> --bind-to none --map-by slot -x PATH -x NCCL_...
                    python -m <step> --launcher=mpi ...
              The operator gives it the hostfile (<job>-worker-<i>.<job>... slots=<slotsPerWorker>) and the ssh key.
              The wrapper fails the pod when mpirun exits 0 without the step's outputs, as Open MPI 5's can after
              losing a worker's daemon (eksflow/runtime/mpi_launcher.py).
    Worker    `nodes` pods running sshd (the image's non-root config), one per node with all its devices:
              slotsPerWorker = GPUs per node (CPU: train.num_workers); EFA, NCCL and /dev/shm from the profile.

The ranks meet at MASTER_ADDR = the first worker pod (its DNS name through the job's headless Service; rank 0 runs
there with `--map-by slot`), forwarded with the rest of the launcher's environment by `-x` (ranks start under
sshd, which passes no container environment on). Gang scheduling: under Kueue the job is created suspended with
the queue label and admitted whole; under Volcano (or scheduler-plugins, whichever the operator runs with
--gang-scheduling) `runPolicy.schedulingPolicy` makes the operator create a PodGroup of launcher + workers.

Retries stay within the declared budget: the launcher Job retries `cluster.backoff_limit` times (the same
knob as the RayJob's resubmissions), Argo once more with a new job, Ray Train not at all. Argo's resource
template follows the job's status: the operator marks the MPIJob Succeeded when the launcher succeeded
(replicaStatuses.Launcher.succeeded = 1), and Failed when the launcher Job exhausted its backoff (Launcher.failed =
launcher pods failed > backoffLimit) or a worker was evicted (Worker.failed > 0). Argo's conditions are label
selectors over JSON paths, which cannot pick a condition out of the `conditions` list by its type, so they read
these counters, set in the same places as the conditions (tests/contract/test_mpijob.py checks both).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from eksflow import profiles
from eksflow.cluster import cluster_of
from eksflow.config import PipelineConfig
from eksflow.errors import PipelineError
from eksflow.launchers.base import (
    Job,
    JobRequest,
    attempt_deadline_s,
    node_layout,
    one_worker_per_node,
    register,
    worker_layout,
)
from eksflow.launchers.jobs import JobLauncher, job_name, pod_spec, training_pod_annotations
from eksflow.names import pipeline_labels
from eksflow.profiles import Profile
from eksflow.runtime import mpi_launcher
from eksflow.templates import contract

API_VERSION = "kubeflow.org/v2beta1"
MASTER_PORT = 29500  # rank 0's TCPStore on the first worker pod; every pod has its own network namespace
SSH_HOME = "/home/eksflow"  # uid 1000's home in images/train-gpu.Dockerfile
SSHD = ["/usr/sbin/sshd", "-De", "-f", f"{SSH_HOME}/.sshd_config"]  # port 2222, host key from the mounted secret
SUCCESS = "status.replicaStatuses.Launcher.succeeded == 1"
LAUNCHER_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}  # mpirun and ssh
# The image's variables the ranks need that sshd would not give them (GPU: EFA and NCCL's libraries).
IMAGE_ENV = {"cpu": ("PATH",), "gpu": ("PATH", "LD_LIBRARY_PATH")}


def failure(cfg: PipelineConfig) -> str:
    """The launcher Job gave up (more failed pods than its backoffLimit), or a worker pod failed (evicted)."""
    cluster = cluster_of(cfg)
    return f"status.replicaStatuses.Launcher.failed > {cluster.backoff_limit},status.replicaStatuses.Worker.failed > 0"


TRAINIUM_REFUSAL = (
    "cluster.launcher: mpijob runs on GPU or CPU nodes; Trainium trains with torchrun in a Volcano Job; "
    "fix: --set cluster.launcher=rayjob"
)


def mpirun_options(cfg: PipelineConfig, profile: Profile, workers: int, env: list[dict[str, str]]) -> list[str]:
    """The options of mpirun: one rank per slot, no core binding (torch sets its own threads), `env` forwarded."""
    pods, slots = node_layout(cfg, profile, workers)
    forwarded = [*IMAGE_ENV["gpu" if profile.kind == "gpu" else "cpu"], *(e["name"] for e in env)]
    options = ["-np", str(pods * slots), "--bind-to", "none", "--map-by", "slot"]
    for name in dict.fromkeys(forwarded):
        options += ["-x", name]
    return options


def manifest(
    cfg: PipelineConfig, task: str, module: str, workers: int, argv: list[str], outputs: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The MPIJob running `python -m <module> <argv>` (argv carries --launcher=mpi) on every rank.

    Its launcher fails unless the step wrote each of `outputs` into its --outputs-dir.
    """
    cluster = cluster_of(cfg)
    profile = profiles.profile_for(cluster.instance_type)
    pods, slots = node_layout(cfg, profile, workers)
    name = job_name(task)
    labels = pipeline_labels(cfg.name)
    env = [
        *profiles.env(profile, cluster.nodes),
        {"name": "MASTER_ADDR", "value": f"{name}-worker-0.{name}"},  # the operator's pod hostname + Service
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
    ]
    program = ["python", "-m", module, *argv]
    options = mpirun_options(cfg, profile, workers, env)
    # the folder the ranks write the outputs to: the step's own --outputs-dir, one wire
    folder = [word for word in argv if word.startswith("--outputs-dir=")]
    wrapper = ["python", "-m", mpi_launcher.__name__, *folder, *(f"--expect={o}" for o in outputs), "--"]
    launcher = pod_spec(cfg, profile, {"name": "launcher", "command": [*wrapper, "mpirun", *options]}, head=True)
    launcher["containers"][0].update(args=program, env=env, resources=LAUNCHER_RESOURCES)
    worker = pod_spec(cfg, profile, {"name": "worker", "command": SSHD})
    for spec in (launcher, worker):
        spec.pop("schedulerName", None)  # the operator sets it on every pod when it gang-schedules
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",  # workers' sshd outlive the launcher: delete them when it ends
        "backoffLimit": cluster.backoff_limit,
        "ttlSecondsAfterFinished": cluster.ttl_seconds_after_finished,
        "activeDeadlineSeconds": attempt_deadline_s(cfg),  # the job fails first and says why
    }
    if cluster.scheduler == "kueue":
        labels["kueue.x-k8s.io/queue-name"] = cluster.queue
        run_policy["suspend"] = True  # Kueue admits launcher + workers at once by unsuspending the job
    else:
        run_policy["schedulingPolicy"] = {"minAvailable": pods + 1, "queue": cluster.queue}

    def template(spec: dict[str, Any]) -> dict[str, Any]:  # fresh dicts each time: rendered YAML has no anchors
        return {"metadata": {"labels": dict(labels), "annotations": training_pod_annotations(cluster)}, "spec": spec}

    return {
        "apiVersion": API_VERSION,
        "kind": "MPIJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "slotsPerWorker": slots,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "sshAuthMountPath": f"{SSH_HOME}/.ssh",
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": template(launcher)},
                # OnFailure: a crashed sshd restarts in place, keeping the pod's name, DNS and place in the hostfile
                "Worker": {"replicas": pods, "restartPolicy": "OnFailure", "template": template(worker)},
            },
        },
    }


def describe(cfg: PipelineConfig, profile: Profile, workers: int) -> str:
    """One line for `plan`: the pods and the mpirun they run."""
    pods, slots = node_layout(cfg, profile, workers)
    return f"1 MPI launcher + {pods} worker pod(s) x {slots} slot(s): mpirun -np {pods * slots}"


class MpiJob(JobLauncher):
    """mpirun of `python -m <step> --launcher=mpi` over sshd worker pods, on GPU or CPU nodes."""

    name = "mpijob"
    kinds = frozenset({"cpu", "gpu"})
    topology_aware = True
    in_job_retries = False  # mpirun has no in-job retry: a failed rank fails the launcher

    def refusal(self, profile: Profile) -> str | None:
        """Trainium trains with torchrun in a Volcano Job only."""
        return TRAINIUM_REFUSAL if profile.kind == "trainium" else None

    def prepare(self, request: JobRequest) -> JobRequest:
        """Every rank runs the step with `--launcher=mpi`: its Args need that field."""
        if "launcher" not in contract(request.step)[0].model_fields:
            raise PipelineError(
                f"distributed({request.step.__name__}): cluster.launcher=mpijob runs it as `--launcher=mpi` ranks of "
                'mpirun, but its Args have no `launcher` field; fix: give its Args a `launcher` field taking "mpi" '
                "(as eksflow.llm.steps.train has), or --set cluster.launcher=rayjob"
            )
        if request.profile.kind == "cpu" and request.cluster.nodes > 1:
            request = one_worker_per_node(request)
        return replace(request, values={**request.values, "launcher": "mpi"})

    def pods(self, cfg: PipelineConfig, job: Job) -> str:
        """The launcher pod and the worker pods with their slots."""
        return describe(cfg, job.profile, worker_layout(job.settings)[0])

    def conditions(self, cfg: PipelineConfig) -> tuple[str, str]:
        """The launcher Job's and the workers' counters (Argo cannot pick a condition by type)."""
        return SUCCESS, failure(cfg)

    def manifest(self, request: JobRequest, argv: list[str]) -> dict[str, Any]:
        """The MPIJob whose every rank runs the step."""
        workers = worker_layout(request.settings)[0]
        outputs = tuple(contract(request.step)[1])
        return manifest(request.cfg, request.task, request.step.__name__, workers, argv, outputs)


register(MpiJob())
