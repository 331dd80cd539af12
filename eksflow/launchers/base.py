"""The launcher interface and its registry: how a distributed step runs, and which launcher runs it.

A launcher (one module each: container, rayjob, mpijob, volcano, slurm) adds the task(s) running a step for a
`JobRequest` and tells `plan` what it needs: the pods, the most attempts its retry layers allow, and why it refuses
a profile. Its module registers it (`register(MpiJob())`), a project's own launcher module too, which makes its name
one `cluster.launcher` takes (eksflow.config.LAUNCHERS, the registry, checked when the config is loaded); `select`
is the one place a launcher is picked: the one `cluster.launcher` names where it runs on the profile's kind,
otherwise the kind's own (DEFAULTS).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, ClassVar, TypeVar

from eksflow.cluster import LAUNCHERS, ClusterSettings, cluster_of
from eksflow.config import PipelineConfig
from eksflow.errors import PipelineError
from eksflow.profiles import Profile
from eksflow.refs import Ref, TaskRef, When
from eksflow.runtime.args import Settings
from eksflow.sections import Section

LAYOUT_FIELDS = ("num_workers", "cpus_per_worker", "use_gpu")
# An attempt of a distributed step may run this many times `cluster.expected_hours` before it is stopped: a bound
# of its own, where a hung attempt (a job waiting for a node that never comes back) had only the workflow's.
DEADLINE_PER_EXPECTED = 3
# The launcher of each profile kind where the configured one does not run: `rayjob` (the default) on CPU nodes is
# one plain pod, and Trainium always trains with torchrun in a Volcano Job.
DEFAULTS = {"cpu": "container", "gpu": "rayjob", "trainium": "volcano"}


@dataclass(frozen=True)
class JobRequest:
    """What a launcher runs: the step, its task name, its settings placed by the profile and its other arguments."""

    cfg: PipelineConfig
    cluster: ClusterSettings
    profile: Profile
    step: ModuleType
    task: str
    settings: Settings  # with the profile's layout
    sections: Sequence[Settings | Section]
    values: Mapping[str, Any]
    after: TaskRef | Sequence[TaskRef]
    when: When | None
    memoize: Sequence[Ref | TaskRef]
    neuron_step: ModuleType | None


@dataclass(frozen=True)
class Job:
    """A distributed task as `plan` sees it: its step, its settings with the profile's layout, where it runs."""

    task: str
    launcher: Launcher
    step: ModuleType
    settings: Settings  # with the profile's layout
    values: Mapping[str, object]  # the task's other arguments (literals and Refs)
    profile: Profile
    inner_retries: int  # the step's own retries inside one job attempt (Ray Train's max_failures)
    section: str  # where the settings live in the config, for messages: `train`
    configured: Mapping[str, object]  # the layout fields the user set explicitly (checked against the profile)

    def attempts(self, cfg: PipelineConfig) -> int:
        """Most attempts the retry layers allow together, as its launcher counts them."""
        return self.launcher.attempts(cfg, self)


class Launcher(ABC):
    """How a distributed step runs on the cluster; one instance per kind of job, registered by its module."""

    name: ClassVar[str]  # what `cluster.launcher` names it by
    kinds: ClassVar[frozenset[str]]  # the profile kinds (cpu, gpu, trainium) it runs on
    topology_aware: ClassVar[bool] = False  # whether its pods carry Kueue's podset topology annotation

    def refusal(self, profile: Profile) -> str | None:
        """Why `plan` refuses this launcher configured for `profile`; None where the profile's own may run instead."""
        return None

    def runs_on(self, profile: Profile, nodes: int) -> bool:
        """Whether it runs a job of `nodes` nodes of `profile`; where it does not, the profile kind's default does."""
        return profile.kind in self.kinds

    def nodes_problem(self, nodes: int) -> str | None:
        """Why it cannot spread a job over `nodes` nodes (every command refuses that alike); None where it can."""
        return None

    def prepare(self, request: JobRequest) -> JobRequest:
        """The request as this launcher runs it; PipelineError for a step it cannot run."""
        return request

    def admission(self, cfg: PipelineConfig) -> str:
        """One line for `plan`: what admits the job's pods all at once."""
        cluster = cluster_of(cfg)
        return f"{cluster.scheduler} queue {cluster.queue}"

    @abstractmethod
    def pods(self, cfg: PipelineConfig, job: Job) -> str:
        """One line for `plan`: the pods the job runs in."""

    @abstractmethod
    def attempts(self, cfg: PipelineConfig, job: Job) -> int:
        """Most attempts the retry layers allow together (Argo's, the job's own, the step's in-job retries)."""

    @abstractmethod
    def add(self, request: JobRequest) -> TaskRef:
        """Add the task(s) running the step to the pipeline being built; returns the task holding its outputs."""


L = TypeVar("L", bound=Launcher)


def register(launcher: L) -> L:
    """Make `launcher` selectable by its name; its module calls this once."""
    known = LAUNCHERS.get(launcher.name)
    if known is not None and type(known) is not type(launcher):
        raise PipelineError(
            f"launcher {launcher.name!r}: {type(launcher).__module__} registers it again ({type(known).__module__} "
            "did first); fix: give one of them another name"
        )
    LAUNCHERS[launcher.name] = launcher
    return launcher


def named(name: str) -> Launcher:
    """The registered launcher called `name`; PipelineError naming the registered ones otherwise."""
    if name not in LAUNCHERS:
        raise PipelineError(
            f"cluster.launcher: no launcher {name!r}; registered: {', '.join(sorted(LAUNCHERS))}; fix: --set "
            "cluster.launcher=<one of them>, or import the module registering it before building the pipeline"
        )
    return LAUNCHERS[name]


def select(cluster: ClusterSettings, profile: Profile) -> Launcher:
    """The launcher of a distributed step: the configured one where it runs on the profile's kind, else the kind's."""
    configured = named(cluster.launcher)
    return configured if configured.runs_on(profile, cluster.nodes) else named(DEFAULTS[profile.kind])


def refusal(cluster: ClusterSettings, profile: Profile) -> str | None:
    """Why `plan` refuses the configured launcher on `profile` (mpijob on Trainium); None when nothing is refused."""
    return named(cluster.launcher).refusal(profile)


def layout(settings: Settings, profile: Profile, nodes: int) -> Settings:
    """The settings with the layout the profile implies: one worker per device on every node."""
    if profile.kind == "cpu":
        return settings
    return settings.model_copy(update={"num_workers": nodes * profile.workers, "use_gpu": profile.kind == "gpu"})


def one_worker_per_node(request: JobRequest) -> JobRequest:
    """The request with a worker (a rank) per node of the cluster: CPU nodes of several train one rank each."""
    workers = request.cluster.nodes * request.profile.workers
    return replace(request, settings=request.settings.model_copy(update={"num_workers": workers}))


def node_layout(cfg: PipelineConfig, profile: Profile, workers: int) -> tuple[int, int]:
    """(nodes, ranks per node) of a job of `workers` ranks: an MPIJob's worker pods, a Slurm job's nodes.

    A node's devices on GPU; on CPU all `workers` on one node, or one on each of several.
    """
    nodes = cluster_of(cfg).nodes
    if profile.kind == "cpu":
        return (1, workers) if nodes == 1 else (nodes, 1)
    return nodes, profile.workers


def worker_layout(settings: Settings) -> tuple[int, int]:
    """(num_workers, cpus_per_worker) of a distributed step's settings."""
    values = settings.model_dump(include={"num_workers", "cpus_per_worker"})
    return int(values["num_workers"]), int(values["cpus_per_worker"])


def attempt_deadline_s(cfg: PipelineConfig) -> int:
    """The activeDeadlineSeconds of one attempt of a distributed step: DEADLINE_PER_EXPECTED x expected_hours.

    Within 95% of the workflow's own deadline, so the task fails first and says why; a minute at least.
    """
    expected_s = cluster_of(cfg).expected_hours * 3600
    return max(60, min(math.ceil(DEADLINE_PER_EXPECTED * expected_s), int(cfg.active_deadline_seconds * 0.95)))
