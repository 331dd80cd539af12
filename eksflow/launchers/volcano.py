"""The Volcano launcher (batch.volcano.sh/v1alpha1 Job): Trainium trains with torchrun of the step's `neuron_step`.

One pod per node runs torchrun with one process per Neuron core; the ranks meet at the first pod (Volcano's svc
plugin gives each pod a DNS name). Volcano admits the Job only when every pod can start.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from eksflow import profiles
from eksflow.cluster import cluster_of
from eksflow.config import PipelineConfig
from eksflow.errors import PipelineError
from eksflow.launchers.base import Job, JobRequest, register
from eksflow.launchers.jobs import JobLauncher, job_name, pod_metadata, pod_spec

SUCCESS = "status.state.phase == Completed"
FAILURE = "status.state.phase in (Failed,Aborted,Terminated)"
RDZV_PORT = 29400


class VolcanoJob(JobLauncher):
    """torchrun of the step's Neuron variant in a Volcano Job, one pod per Trainium node."""

    name = "volcano"
    kinds = frozenset({"trainium"})

    def prepare(self, request: JobRequest) -> JobRequest:
        """Trainium runs the step's Neuron variant: `distributed()` must name it."""
        if request.neuron_step is None:
            raise PipelineError(
                f"distributed({request.step.__name__}): no neuron_step= for Trainium "
                f"({request.profile.instance_type}); fix: pass the step's Neuron variant as neuron_step="
                + _neuron_variant(request.step.__name__)
            )
        return request

    def pods(self, cfg: PipelineConfig, job: Job) -> str:
        """One torchrun pod per node."""
        return f"{cluster_of(cfg).nodes} torchrun pod(s)"

    def conditions(self, cfg: PipelineConfig) -> tuple[str, str]:
        """The Volcano Job's phase."""
        return SUCCESS, FAILURE

    def manifest(self, request: JobRequest, argv: list[str]) -> dict[str, Any]:
        """The Volcano Job running torchrun of the Neuron step."""
        assert request.neuron_step is not None  # prepare() refused the request without one
        return manifest(request.cfg, request.task, request.neuron_step.__name__, argv)


def manifest(cfg: PipelineConfig, task: str, module: str, argv: list[str]) -> dict[str, Any]:
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
            "maxRetry": cluster.backoff_limit,
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


register(VolcanoJob())


def _neuron_variant(step: str) -> str:
    """`train_neuron (the module eksflow.llm.steps.train_neuron: ...)`: the step's `<name>_neuron`, when it has one."""
    package, _, name = step.rpartition(".")
    variant = f"{step}_neuron"
    try:
        found = importlib.util.find_spec(variant) is not None  # looked up, not imported: it needs optimum-neuron
    except (ImportError, ValueError):  # a step outside any importable package
        found = False
    if not found:
        return "<module>, a module that runs the step under torchrun on Neuron cores"
    imported = f": `from {package} import {name}_neuron`" if package else ""
    return f"{name}_neuron (the module {variant}{imported})"
