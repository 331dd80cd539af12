"""Topology-aware placement: `cluster.topology` as Kueue's podset annotations, and the Kueue objects behind it.

EKS labels every node of the instance types EC2 reports a network topology for with its place in AWS's network
hierarchy (https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html):
`topology.k8s.aws/network-node-layer-1` (the top, the broadest grouping), `-2` (the middle), `-3` (the bottom for
most instance types: nodes sharing it are physically closest; a fourth layer exists on a few types only, so it is
no level here), and `kubernetes.io/hostname`. `cluster.topology` names the domain a job's pods must share:

    block   topology.k8s.aws/network-node-layer-2
    rack    topology.k8s.aws/network-node-layer-3
    host    kubernetes.io/hostname

Kueue's Topology Aware Scheduling reads the annotation `kueue.x-k8s.io/podset-required-topology` (admitted only
when the whole pod set fits in one domain of that level) or `kueue.x-k8s.io/podset-preferred-topology` (as few
domains as fit), valued with the node label, on each pod template of the job (every pod set: a RayJob's head and
workers, an MPIJob's launcher and workers, a TrainJob's trainer pods). It needs a Kueue `Topology` listing the
levels and a `ResourceFlavor` naming it (`spec.topologyName`) that selects the training nodes: `objects` gives both
(`python -m pipelines.topology`, in workflow-templates/); the cluster's ClusterQueue then offers that flavor.
"""

from __future__ import annotations

from typing import Any

from eksflow.cluster import ClusterSettings, cluster_of
from eksflow.config import PipelineConfig
from eksflow.profiles import (
    HOSTNAME_LABEL,
    INSTANCE_TYPE_LABEL,
    NETWORK_LAYER_LABEL,
    PREFERRED_TOPOLOGY_ANNOTATION,
    REQUIRED_TOPOLOGY_ANNOTATION,
)

# The Topology's levels, coarsest first (Kueue's order); the hostname level must be the last.
LEVELS = (*(NETWORK_LAYER_LABEL.format(layer) for layer in (1, 2, 3)), HOSTNAME_LABEL)
NODE_LABELS = {"block": LEVELS[1], "rack": LEVELS[2], "host": HOSTNAME_LABEL}
ANNOTATIONS = {"required": REQUIRED_TOPOLOGY_ANNOTATION, "preferred": PREFERRED_TOPOLOGY_ANNOTATION}
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"  # the storage version of the vendored CRDs (v1beta1 still served)
TOPOLOGY_NAME = "eksflow-network"


def pod_annotations(cluster: ClusterSettings) -> dict[str, str]:
    """The podset topology annotation of every training pod template; none under `cluster.topology: none`."""
    if cluster.topology == "none":
        return {}
    return {ANNOTATIONS[cluster.topology_mode]: NODE_LABELS[cluster.topology]}


def refusal(cluster: ClusterSettings, launcher: str) -> str:
    """Why `launcher` cannot place a job by `cluster.topology` (its pods are no Kueue pod set)."""
    return (
        f"cluster.topology: {cluster.topology} keeps a job's pods in one network domain through Kueue's podset "
        f"annotations, which the {launcher} launcher's job does not carry; fix: --set cluster.launcher=rayjob (or "
        "mpijob, trainjob), or --set cluster.topology=none"
    )


def flavor_name(cluster: ClusterSettings) -> str:
    """The topology-aware ResourceFlavor of the training nodes: `g5-12xlarge-network`."""
    return f"{cluster.instance_type.replace('.', '-')}-network"


def objects(cfg: PipelineConfig) -> list[dict[str, Any]]:
    """The Kueue Topology of EKS's network layers and a ResourceFlavor of the training nodes naming it."""
    cluster = cluster_of(cfg)
    topology = {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "Topology",
        "metadata": {"name": TOPOLOGY_NAME},
        "spec": {"levels": [{"nodeLabel": label} for label in LEVELS]},
    }
    flavor = {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": flavor_name(cluster)},
        "spec": {"nodeLabels": {INSTANCE_TYPE_LABEL: cluster.instance_type}, "topologyName": TOPOLOGY_NAME},
    }
    return [topology, flavor]
