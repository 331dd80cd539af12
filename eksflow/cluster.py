"""The `cluster` section: where a pipeline's distributed steps run on EKS, and the launchers it may name.

A pipeline that calls `distributed()` declares `cluster: ClusterSettings = ClusterSettings()`; `cluster_of` finds it.
`LAUNCHERS` is the registry `cluster.launcher` is checked against (eksflow.launchers.base.register fills it).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from eksflow.config import Image, PipelineConfig, image_field
from eksflow.errors import ConfigError
from eksflow.profiles import PROFILES
from eksflow.runtime.args import K8S_NAME, Settings
from eksflow.runtime.slurm import MAX_TIME_LIMIT_MIN, SlurmUrl, TimeLimitMin

if TYPE_CHECKING:
    from eksflow.launchers.base import Launcher

# The launchers `cluster.launcher` may name, by name: eksflow.launchers.base.register adds each, so a project's own
# launcher is valid once its module is imported (importing eksflow.launchers registers eksflow's, as any pipeline
# calling `distributed()` does).
LAUNCHERS: dict[str, Launcher] = {}


class SlurmSettings(Settings):
    """The Slurm cluster of `cluster.launcher: slurm` (Slinky on EKS): its slurmrestd, and the job's scheduling.

    The JWT is a key of a Secret (`token_secret`, key `token`) an operator creates once, e.g. from
    `scontrol token username=<user> lifespan=<s>` or Slinky's Token object; it never travels as a parameter.
    """

    url: SlurmUrl = Field(
        "http://slurm-restapi.slurm.svc.cluster.local:6820",
        description="slurmrestd's address (Slinky's RestApi Service): http(s)://<DNS name or IP>[:<port 1-65535>]",
    )
    api_version: Literal["v0.0.38", "v0.0.44"] = Field(
        "v0.0.44", description="slurmrestd's OpenAPI version: v0.0.44 (Slurm 25.x, Slinky), v0.0.38 (Slurm 22.05)"
    )
    user: str = Field("slurm", pattern=r"^[a-z_][a-z0-9_-]*$", max_length=32, description="the token's Slurm user")
    token_secret: str = Field(  # also the name of the pod's volume: a DNS-1123 label, at most 63 characters
        "eksflow-slurm", pattern=K8S_NAME, max_length=63, description="Secret holding the JWT under key `token`"
    )
    partition: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="Slurm partition; empty: the default")
    account: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="Slurm account; empty: the user's default")
    qos: str = Field("", pattern=r"^[-A-Za-z0-9_.]*$", description="Slurm QoS; empty: the default")
    time_limit_min: TimeLimitMin = Field(
        0, description=f"the job's time limit in minutes, at most {MAX_TIME_LIMIT_MIN} (a year); 0: the partition's"
    )
    controller: str = Field("slurm", pattern=K8S_NAME, max_length=63, description="Slinky's Controller object")
    slurm_namespace: str = Field(
        "slurm", pattern=K8S_NAME, max_length=63, description="namespace of the Controller, NodeSets and RestApi"
    )


class TrainJobSettings(Settings):
    """The Kubeflow Trainer runtime a `cluster.launcher: trainjob` job references (eksflow.launchers.trainjob).

    The runtime is installed with the Trainer (v2.3.0 ships `torch-distributed`); its trainer replicated job and
    container are called `node`, as the Trainer's torch runtimes name them. Under `cluster.scheduler: volcano` the
    runtime needs `podGroupPolicy.volcano` (the Trainer's Volcano plugin gang-schedules the pods).
    """

    runtime: str = Field(
        "torch-distributed",
        pattern=K8S_NAME,
        max_length=63,
        description="the (Cluster)TrainingRuntime the TrainJob references: a DNS-1123 label",
    )
    runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = Field(
        "ClusterTrainingRuntime",
        description="ClusterTrainingRuntime (cluster-wide, as the Trainer installs them) or TrainingRuntime (in "
        "the workflow's namespace)",
    )


DEPRECATED_BACKOFF_LIMIT = "rayjob_backoff_limit"  # cluster.backoff_limit's old name, still read


class ClusterSettings(Settings):
    """Where distributed steps run on EKS: node type (its accelerator profile), gang scheduling, the jobs' images.

    A pipeline that calls `distributed()` declares this section as `cluster`.
    """

    instance_type: str = Field("m6i.4xlarge", description="EC2 instance type of the training nodes (profiles.py)")
    nodes: int = Field(1, ge=1, le=64, description="training nodes; the job is admitted only when all fit at once")
    launcher: str = Field(
        "rayjob",
        description="GPU (and CPU) training job: rayjob (KubeRay RayJob, Ray Train; CPU: one plain pod), mpijob "
        "(MPI Operator MPIJob, mpirun over worker pods), trainjob (Kubeflow Trainer v2 TrainJob, torchrun in a pod "
        "per node) or slurm (a Slurm batch job through slurmrestd, srun ranks); Trainium always runs torchrun in a "
        "Volcano Job",
    )
    scheduler: Literal["kueue", "volcano"] = Field("kueue", description="gang admission of the training job")
    queue: str = Field("eksflow", pattern=K8S_NAME, max_length=63, description="Kueue LocalQueue or Volcano Queue name")
    spot: bool = Field(False, description="Spot capacity for training (requires checkpointing)")
    zone: str = Field("", pattern=r"^([a-z]{2}-[a-z]+-\d[a-z])?$", description="AZ of EFA nodes, e.g. us-west-2a")
    backoff_limit: int = Field(
        1,
        ge=0,
        le=10,
        description="the training job's own retries: RayJob resubmissions, MPIJob launcher restarts (a TrainJob's "
        "are its runtime's)",
    )
    retry_budget: int = Field(12, ge=1, description="most training attempts: Argo x RayJob x Ray Train, multiplied")
    ttl_seconds_after_finished: int = Field(600, ge=0, description="how long a finished RayJob's cluster is kept")
    expected_hours: float = Field(
        1.0, gt=0, description="expected training time: `plan`'s cost per run; an attempt is stopped after 3x it"
    )
    model_params_b: float = Field(0.0, ge=0, description="base model size in billions; 0: read from its name")
    image: Image = image_field("ghcr.io/eksflow/train-gpu:0.1.0", "image of GPU jobs (CUDA, NCCL, EFA)")
    neuron_image: Image = image_field("ghcr.io/eksflow/train-neuron:0.1.0", "image of Trainium jobs (Neuron SDK)")
    slurm: SlurmSettings = SlurmSettings()
    trainjob: TrainJobSettings = TrainJobSettings()
    topology: Literal["none", "block", "rack", "host"] = Field(
        "none",
        description="keep the job's pods in one network domain (Kueue Topology Aware Scheduling, EKS's "
        "topology.k8s.aws/network-node-layer-* labels): block (layer 2), rack (layer 3) or host; none: anywhere",
    )
    topology_mode: Literal["required", "preferred"] = Field(
        "required",
        description="required: admitted only when every pod fits in one domain; preferred: as close as they fit",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_backoff_limit(cls, data: Any) -> Any:
        """Take `rayjob_backoff_limit`, the name before every job launcher read it, as `backoff_limit`."""
        if not (isinstance(data, dict) and DEPRECATED_BACKOFF_LIMIT in data):
            return data
        if "backoff_limit" in data:
            raise ValueError(f"{DEPRECATED_BACKOFF_LIMIT} is the old name of backoff_limit; give only backoff_limit")
        print(f"warning: cluster.{DEPRECATED_BACKOFF_LIMIT} is deprecated; use cluster.backoff_limit", file=sys.stderr)
        moved = {key: value for key, value in data.items() if key != DEPRECATED_BACKOFF_LIMIT}
        return {**moved, "backoff_limit": data[DEPRECATED_BACKOFF_LIMIT]}

    @model_validator(mode="after")
    def _topology_through_kueue(self) -> ClusterSettings:
        if self.topology != "none" and self.scheduler != "kueue":
            raise ValueError(
                f"topology: {self.topology} places pods through Kueue's Topology Aware Scheduling, which "
                f"scheduler: {self.scheduler} does not run; set scheduler: kueue, or topology: none"
            )
        return self

    @field_validator("instance_type")
    @classmethod
    def _known(cls, instance_type: str) -> str:
        if instance_type not in PROFILES:
            raise ValueError(f"unknown instance type {instance_type!r}; known: {', '.join(sorted(PROFILES))}")
        return instance_type

    @field_validator("launcher")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in LAUNCHERS:
            raise ValueError(
                f"no launcher {name!r}; registered: {', '.join(sorted(LAUNCHERS))} (a project's own: import "
                "the module registering it before loading the config)"
            )
        return name


def cluster_of(cfg: PipelineConfig) -> ClusterSettings:
    """The pipeline's `cluster` section: where its distributed steps run (ConfigError when it declares none)."""
    cluster = getattr(cfg, "cluster", None)
    if not isinstance(cluster, ClusterSettings):
        raise ConfigError(
            f"{type(cfg).__name__} has no `cluster: ClusterSettings` section, which distributed steps and --variant "
            "need; add `cluster: ClusterSettings = ClusterSettings()` to it"
        )
    return cluster
