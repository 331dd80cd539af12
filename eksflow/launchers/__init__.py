"""Distributed steps: `distributed(step, settings, ...)` runs any step module across workers, per accelerator profile.

Each launcher is a module registered in eksflow.launchers.base; `select` picks one from `cluster.launcher` and the
profile's kind:

- container (CPU): the plain container task (what `run` executes locally), one pod, one CPU per worker thread.
- rayjob (GPU): an Argo `resource` template creating a KubeRay RayJob (ray.io/v1) that runs `python -m <step> ...`
  on a head pod plus one worker pod per node, gang-admitted by Kueue (or Volcano, with a PodGroup task first).
- volcano (Trainium): a resource template creating a Volcano Job running torchrun of `neuron_step` on every node.
- mpijob (`cluster.launcher: mpijob`, GPU or CPU): an MPIJob (kubeflow.org/v2beta1) whose launcher runs
  `mpirun ... python -m <step> --launcher=mpi` over sshd worker pods.
- trainjob (`cluster.launcher: trainjob`, GPU or CPU): a Kubeflow Trainer TrainJob (trainer.kubeflow.org/v1alpha1)
  referencing a (Cluster)TrainingRuntime: `torchrun -m <step> --launcher=torchrun` in one pod per node.
- slurm (`cluster.launcher: slurm`, GPU or CPU): a Slurm batch job through slurmrestd (Slinky), `srun` ranks of
  `python -m <step> --launcher=mpi`, followed by one container task (eksflow.runtime.slurm_job).

The step's settings must carry the worker layout (`num_workers`, `cpus_per_worker`, `use_gpu`): the profile sets
`num_workers` to one per device on every node. A job's outputs reach downstream tasks through a `<task>-outputs`
task (eksflow.launchers.jobs), so the DAG is the same for every launcher. Each job is recorded on the pipeline for
`plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from eksflow import profiles, topology
from eksflow.cluster import cluster_of
from eksflow.config import PipelineConfig
from eksflow.errors import ConfigError, PipelineError

# Importing a launcher's module registers it.
from eksflow.launchers import container, mpijob, rayjob, slurm, trainjob, volcano  # noqa: F401
from eksflow.launchers.base import LAYOUT_FIELDS, Job, JobRequest, layout, select
from eksflow.pipeline import Pipeline, step_name
from eksflow.refs import Ref, TaskRef, When
from eksflow.runtime.args import Settings
from eksflow.sections import Section, section_values
from eksflow.templates import contract

__all__ = ["Job", "distributed"]  # Job: what Pipeline.jobs holds


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

    `memoize` as for task(): on a job profile both the job and the task publishing its outputs are memoized, on the
    same fingerprint under keys of their own, so a hit skips the job and still gives the outputs.
    """
    pipeline = Pipeline.current()
    cfg = pipeline.cfg
    cluster = cluster_of(cfg)
    name = task_name or step_name(step)
    missing = [f for f in LAYOUT_FIELDS if f not in type(settings).model_fields]
    if missing:
        raise PipelineError(
            f"distributed({step.__name__}): its settings need the worker layout fields {missing}; fix: add them to "
            f"{type(settings).__name__} (the profile sets num_workers and use_gpu on GPU and Trainium nodes)"
        )
    profile = profiles.profile_for(cluster.instance_type)
    launcher = select(cluster, profile)
    if problem := launcher.nodes_problem(cluster.nodes):  # here, so render, run, plan and submit refuse it alike
        if launcher.name != cluster.launcher:
            problem = (
                f"cluster.launcher: {cluster.launcher} does not run on {profile.kind} nodes; the {launcher.name} "
                f"launcher runs the job instead\n{problem}"
            )
        raise ConfigError(problem)
    if cluster.topology != "none" and not launcher.topology_aware:
        raise ConfigError(topology.refusal(cluster, launcher.name))
    request = launcher.prepare(
        JobRequest(
            cfg=cfg,
            cluster=cluster,
            profile=profile,
            step=step,
            task=name,
            settings=layout(settings, profile, cluster.nodes),
            sections=sections,
            values=values,
            after=after,
            when=when,
            memoize=memoize,
            neuron_step=neuron_step,
        )
    )
    pipeline.jobs.append(
        Job(
            task=name,
            launcher=launcher,
            step=step,
            settings=request.settings,
            values={**section_values(sections, contract(step)[0].model_fields, name), **request.values},
            profile=profile,
            inner_retries=int(getattr(step, "MAX_FAILURES", 0)),
            section=section_of(cfg, settings),
            configured={f: getattr(settings, f) for f in LAYOUT_FIELDS if f in settings.model_fields_set},
        )
    )
    return launcher.add(request)
