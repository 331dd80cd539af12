"""The container launcher: the plain pod `run` executes locally, on one CPU node, one CPU per worker thread.

`cluster.launcher: rayjob` (the default) on CPU nodes runs this: the step's own workers share one pod, placed on
the profile's nodes like a job's pods and never consolidated away by Karpenter while it runs.
"""

from __future__ import annotations

from hera.workflows import Resources

from eksflow import profiles
from eksflow.config import PipelineConfig
from eksflow.launchers.base import Job, JobRequest, Launcher, attempt_deadline_s, register, worker_layout
from eksflow.refs import TaskRef
from eksflow.templates import task


class ContainerTask(Launcher):
    """The step as one container task: its outputs are the task's own, Argo's retries the only ones."""

    name = "container"
    kinds = frozenset({"cpu"})

    def nodes_problem(self, nodes: int) -> str | None:
        """One pod is on one node: several nodes would be priced and asked for, and all but one left idle."""
        if nodes == 1:
            return None
        return (
            f"cluster.nodes: {nodes} CPU nodes, but the container launcher runs the job in one pod on one node; fix: "
            "--set cluster.launcher=rayjob (a training worker on each node; or mpijob, slurm), or --set cluster.nodes=1"
        )

    def pods(self, cfg: PipelineConfig, job: Job) -> str:
        """One pod."""
        return "1 pod"

    def attempts(self, cfg: PipelineConfig, job: Job) -> int:
        """Argo's retries of the pod (the config's `retry` section); nothing retries inside it."""
        return cfg.retry.limit + 1

    def add(self, request: JobRequest) -> TaskRef:
        """A task() with a CPU and 6 GiB per worker thread, on the profile's nodes."""
        workers, threads = worker_layout(request.settings)
        cpus = workers * threads
        return task(
            request.step,
            request.settings,
            *request.sections,
            task_name=request.task,
            after=request.after,
            when=request.when,
            container_image=request.cluster.image,
            resources=Resources(cpu_request=cpus, memory_request=f"{6 * cpus}Gi"),
            memoize=request.memoize,
            node_selector=profiles.node_selector(request.profile, spot=request.cluster.spot, zone=""),
            annotations=profiles.DO_NOT_DISRUPT,
            active_deadline_seconds=attempt_deadline_s(request.cfg),
            **request.values,
        )


register(ContainerTask())
