"""Accelerator profiles by EC2 instance type, and the pod wiring every training pod gets from its profile.

A profile is what one node offers (devices, EFA interfaces, CPU, memory, device memory). Everything derived from it
(resource requests, node selector, tolerations, EFA/NCCL or Neuron environment, /dev/shm, security context) is
rendered here as plain Kubernetes dicts, so the RayJob, the Volcano Job and the Argo templates wire pods the same way.
`placement` reads it back: the instance types a pod's node selector or required node affinity pins it to (what
`plan` prices a serving Deployment by); NODES holds every node shape eksflow knows, the inference-only ones included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["cpu", "gpu", "trainium"]

GPU_RESOURCE = "nvidia.com/gpu"
NEURON_RESOURCE = "aws.amazon.com/neuron"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
# Karpenter's labels for a node's instance family and size (g5 + xlarge): together they name the instance type.
INSTANCE_FAMILY_LABEL = "karpenter.k8s.aws/instance-family"
INSTANCE_SIZE_LABEL = "karpenter.k8s.aws/instance-size"
# EKS's network topology labels of a node (eksflow.topology) and Kueue's podset annotations naming one of them.
HOSTNAME_LABEL = "kubernetes.io/hostname"
NETWORK_LAYER_LABEL = "topology.k8s.aws/network-node-layer-{}"  # 1 the broadest (spine) to 3 (rack)
REQUIRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}  # Karpenter never consolidates a node under a training pod
SHM_VOLUME = "dshm"
NEURON_CACHE_VOLUME = "neuron-cache"


@dataclass(frozen=True)
class Profile:
    """One node of an instance type, as Kubernetes sees it (allocatable is a little below these figures)."""

    instance_type: str
    kind: Kind
    devices: int  # GPUs, or Neuron devices (Trainium chips); 0 on CPU nodes
    cores_per_device: int  # Neuron cores per Trainium chip (torchrun's nproc_per_node = devices x this); 1 on GPUs
    device_memory_gib: int  # per device
    efa: int  # EFA interfaces; > 0 means the pods request them and are placed in one AZ
    vcpus: int
    memory_gib: int

    @property
    def workers(self) -> int:
        """Training processes per node: one per GPU or per Neuron core, otherwise one."""
        return max(self.devices * self.cores_per_device, 1)


def _gpu(name: str, gpus: int, gib: int, efa: int, vcpus: int, memory: int) -> Profile:
    return Profile(name, "gpu", gpus, 1, gib, efa, vcpus, memory)


PROFILES: dict[str, Profile] = {
    p.instance_type: p
    for p in (
        Profile("m6i.4xlarge", "cpu", 0, 1, 0, 0, 16, 64),
        Profile("m6i.8xlarge", "cpu", 0, 1, 0, 0, 32, 128),
        _gpu("g5.xlarge", 1, 24, 0, 4, 16),
        _gpu("g5.2xlarge", 1, 24, 0, 8, 32),
        _gpu("g5.4xlarge", 1, 24, 0, 16, 64),
        _gpu("g5.8xlarge", 1, 24, 1, 32, 128),
        _gpu("g5.12xlarge", 4, 24, 1, 48, 192),
        _gpu("g5.16xlarge", 1, 24, 1, 64, 256),
        _gpu("g5.24xlarge", 4, 24, 1, 96, 384),
        _gpu("g5.48xlarge", 8, 24, 1, 192, 768),
        _gpu("p4d.24xlarge", 8, 40, 4, 96, 1152),
        _gpu("p4de.24xlarge", 8, 80, 4, 96, 1152),
        _gpu("p5.48xlarge", 8, 80, 32, 192, 2048),
        Profile("trn1.32xlarge", "trainium", 16, 2, 32, 8, 128, 512),
        Profile("trn1n.32xlarge", "trainium", 16, 2, 32, 16, 128, 512),
    )
}
# Nodes only the serving fleet uses (L4 GPUs): not training profiles (cluster.instance_type refuses them).
SERVING_ONLY: dict[str, Profile] = {
    p.instance_type: p
    for p in (
        _gpu("g6.xlarge", 1, 24, 0, 4, 16),
        _gpu("g6.2xlarge", 1, 24, 0, 8, 32),
        _gpu("g6.12xlarge", 4, 24, 0, 48, 192),
        _gpu("g6.48xlarge", 8, 24, 0, 192, 768),
    )
}
NODES: dict[str, Profile] = {**PROFILES, **SERVING_ONLY}  # every node shape eksflow knows (and prices.yaml prices)
VARIANT_DEFAULTS: dict[Kind, str] = {"cpu": "m6i.4xlarge", "gpu": "g5.12xlarge", "trainium": "trn1.32xlarge"}

# A pod's primary interface: the VPC CNI's on EKS, and the simulated nodes' (eksflow.local.pod_network) here.
POD_INTERFACE = "eth0"
# NCCL over EFA (aws-ofi-nccl): libfabric's EFA provider with GPUDirect RDMA; fork-safe verbs for dataloader workers.
EFA_ENV = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "RDMAV_FORK_SAFE": "1",
    "NCCL_PROTO": "simple",
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    "NCCL_DEBUG": "WARN",
}
# Neuron compiles each graph once; the cache volume keeps compiled graphs across the processes of a node.
NEURON_ENV = {
    "NEURON_CC_FLAGS": "--model-type=transformer --cache_dir=/var/neuron-cache",
    "NEURON_COMPILE_CACHE_URL": "/var/neuron-cache",
}


# The "restricted" Pod Security Standard. EFA pods cannot meet it: libfabric pins memory (IPC_LOCK) and the EFA
# device plugin's devices need an unlimited memlock, so those pods add IPC_LOCK (baseline-level instead).
def pod_security() -> dict[str, Any]:
    """The pod-level part of the restricted profile (a fresh dict each time: rendered YAML has no anchors)."""
    return {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}


def profile_for(instance_type: str) -> Profile:
    """The profile of `instance_type`; the caller's config validation has already refused unknown types."""
    return PROFILES[instance_type]


def container_security(profile: Profile) -> dict[str, Any]:
    """Restricted container security context, plus IPC_LOCK where EFA needs pinned memory."""
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }
    if profile.efa:
        context["capabilities"]["add"] = ["IPC_LOCK"]
    return context


def resources(profile: Profile, *, head: bool = False) -> dict[str, Any]:
    """Requests = limits for a whole node's devices; the head pod of a RayJob only coordinates (no devices)."""
    if head or profile.kind == "cpu":
        cpu = 4 if head else profile.vcpus - 2  # leave room for the kubelet, daemonsets and the Ray agent
        memory = 16 if head else profile.memory_gib * 3 // 4
        return {"requests": {"cpu": str(cpu), "memory": f"{memory}Gi"}, "limits": {"memory": f"{memory}Gi"}}
    limits = {
        "cpu": str(profile.vcpus - 4),
        "memory": f"{profile.memory_gib * 9 // 10}Gi",
        GPU_RESOURCE if profile.kind == "gpu" else NEURON_RESOURCE: str(profile.devices),
    }
    if profile.efa:
        limits[EFA_RESOURCE] = str(profile.efa)
    return {"requests": dict(limits), "limits": limits}


def node_selector(profile: Profile, *, spot: bool, zone: str) -> dict[str, str]:
    """Instance type and capacity type; one AZ when EFA is used (EFA traffic does not cross AZs)."""
    selector = {INSTANCE_TYPE_LABEL: profile.instance_type, CAPACITY_TYPE_LABEL: "spot" if spot else "on-demand"}
    if profile.efa and zone:
        selector[ZONE_LABEL] = zone
    return selector


def tolerations(profile: Profile) -> list[dict[str, str]]:
    """Accelerator node pools are tainted so that only pods asking for the devices land there."""
    if profile.kind == "cpu":
        return []
    key = GPU_RESOURCE if profile.kind == "gpu" else NEURON_RESOURCE
    return [{"key": key, "operator": "Exists", "effect": "NoSchedule"}]


def env(profile: Profile, nodes: int = 1) -> list[dict[str, str]]:
    """EFA/NCCL or Neuron environment for the training container; across nodes, the interface gloo binds to."""
    values: dict[str, str] = {"HF_HUB_OFFLINE": "1"}
    if nodes > 1:  # else gloo binds to whatever the pod's host name resolves to, which may be no pod address
        values["GLOO_SOCKET_IFNAME"] = POD_INTERFACE
    if profile.efa and profile.kind == "gpu":
        values.update(EFA_ENV)
    if profile.kind == "trainium":
        values.update(NEURON_ENV, NEURON_RT_NUM_CORES=str(profile.workers))
        if profile.efa:
            values.update({k: EFA_ENV[k] for k in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "RDMAV_FORK_SAFE")})
    return [{"name": k, "value": v} for k, v in values.items()]


def volumes(profile: Profile, fsx_claim: str) -> list[dict[str, Any]]:
    """FSx claim, /dev/shm as memory (NCCL and dataloaders need more than the 64 MiB default), Neuron cache."""
    shm_gib = max(profile.memory_gib // 8, 1)
    listed: list[dict[str, Any]] = [
        {"name": "fsx", "persistentVolumeClaim": {"claimName": fsx_claim}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}},
    ]
    if profile.kind == "trainium":
        listed.append({"name": NEURON_CACHE_VOLUME, "emptyDir": {}})
    return listed


def volume_mounts(profile: Profile, fsx_mount: str) -> list[dict[str, str]]:
    """Where the steps expect each volume."""
    mounts = [{"name": "fsx", "mountPath": fsx_mount}, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    if profile.kind == "trainium":
        mounts.append({"name": NEURON_CACHE_VOLUME, "mountPath": "/var/neuron-cache"})
    return mounts


@dataclass(frozen=True)
class Placement:
    """Where a pod may run, as its node selector and required node affinity say; () where they do not say."""

    instance_types: tuple[str, ...]
    capacity_types: tuple[str, ...]  # on-demand, spot


def placement(pod_spec: Mapping[str, Any]) -> Placement:
    """The instance types a pod is pinned to: node.kubernetes.io/instance-type, or Karpenter's family and size.

    The node selector holds in every term of the required node affinity, and a node that matches any one term
    will do, so each term pins its own types and the pod may land on any of them; one term that pins none (or no
    term, with no selector) leaves the instance type to the cluster. Only `In` expressions pin; `NotIn`, `Exists`
    and `Gt` narrow without naming a type.
    """
    selector = {key: {str(value)} for key, value in (pod_spec.get("nodeSelector") or {}).items()}
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    types: set[str] = set()
    capacity: set[str] = set()
    pinned = capacity_pinned = True
    for term in required.get("nodeSelectorTerms") or [{}]:
        allowed = dict(selector)
        for expression in term.get("matchExpressions") or []:
            if expression.get("operator") == "In":
                values = {str(v) for v in expression.get("values") or []}
                key = expression.get("key")
                allowed[key] = allowed[key] & values if key in allowed else values
        if INSTANCE_TYPE_LABEL in allowed:
            types |= allowed[INSTANCE_TYPE_LABEL]
        elif INSTANCE_FAMILY_LABEL in allowed and INSTANCE_SIZE_LABEL in allowed:
            types |= {f"{f}.{s}" for f in allowed[INSTANCE_FAMILY_LABEL] for s in allowed[INSTANCE_SIZE_LABEL]}
        else:
            pinned = False
        capacity |= allowed.get(CAPACITY_TYPE_LABEL, set())
        capacity_pinned &= CAPACITY_TYPE_LABEL in allowed
    return Placement(tuple(sorted(types)) if pinned else (), tuple(sorted(capacity)) if capacity_pinned else ())
