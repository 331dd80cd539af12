"""Kueue's Topology Aware Scheduling on the simulated nodes: a job's pods in one domain of a level, or Pending.

On EKS each node carries its place in AWS's network (`topology.k8s.aws/network-node-layer-1` to `-3`, and
`kubernetes.io/hostname`), and Kueue reads a pod template's `kueue.x-k8s.io/podset-required-topology: <node
label>` as: admit the pod set only when all its pods fit in one domain of that level (the nodes sharing the label's
value), and `podset-preferred-topology` as: in as few domains as fit. eksflow renders these annotations on the
training pods of a RayJob, MPIJob and TrainJob (eksflow.topology); the simulated nodes carry the same labels
(sim_nodes.new_node).

Here a job's training pods go one to a node (a TrainJob's node pods, an MPIJob's workers, a RayJob's worker pods:
each asks for most of a node), so a domain holds a job when it has a node, not lost or being drained, for each; the
job's other pods (an MPIJob's launcher, a RayJob's head) join them there, where Kueue places each pod set in a
domain of its own. Required: every pod of the job goes to the smallest domain that holds them (Kueue's BestFit;
ties go to the first by name), replacements included (a replacement node is in its lost node's domain), and when
none does, the job stays Pending with one line giving each domain's node count. Preferred: within such a domain
when one exists, and anywhere otherwise (never Pending), where Kueue would fill as few domains as it can.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from eksflow.local.resources import counted
from eksflow.local.sim_nodes import SimNode
from eksflow.profiles import (
    HOSTNAME_LABEL,
    NETWORK_LAYER_LABEL,
    PREFERRED_TOPOLOGY_ANNOTATION,
    REQUIRED_TOPOLOGY_ANNOTATION,
)

# What eksflow's `cluster.topology` calls each level, for the Pending line
LEVEL_NAMES = {
    NETWORK_LAYER_LABEL.format(1): "spine",
    NETWORK_LAYER_LABEL.format(2): "block",
    NETWORK_LAYER_LABEL.format(3): "rack",
    HOSTNAME_LABEL: "host",
}


@dataclass(frozen=True)
class TopologyAsk:
    """The node label of the level a pod set must share (required) or should share (preferred); "" for none."""

    required: str = ""
    preferred: str = ""


@dataclass(frozen=True)
class Placement:
    """Where a job's pods may go: one domain, a node label and its value (None: any node), or why it stays Pending."""

    domain: tuple[str, str] | None
    pending: str = ""  # one line; "" when the pods can be placed


def topology_ask(annotations: Iterable[tuple[str, str]]) -> TopologyAsk:
    """The topology a pod template's annotations ask for."""
    found = dict(annotations)
    return TopologyAsk(found.get(REQUIRED_TOPOLOGY_ANNOTATION, ""), found.get(PREFERRED_TOPOLOGY_ANNOTATION, ""))


def domains(nodes: Iterable[SimNode], label: str) -> dict[str, list[str]]:
    """The domains of level `label` (its values, sorted) and their nodes that can take a pod (not lost or drained).

    A node without the label is in no domain: Kueue places no pod set of that level on it.
    """
    found: dict[str, list[str]] = {}
    for node in nodes:
        if label in node.labels and not node.lost and not node.cordoned:
            found.setdefault(node.labels[label], []).append(node.name)
    return dict(sorted(found.items()))


def place(nodes: Iterable[SimNode], pods: int, ask: TopologyAsk, job: str) -> Placement:
    """Where the `pods` pods of `job` go under `ask`: one domain's nodes, any node, or Pending with the reason."""
    nodes = list(nodes)
    label = ask.required or ask.preferred
    if not label:
        return Placement(None)
    by_domain = domains(nodes, label)
    holding = [(len(names), value) for value, names in by_domain.items() if len(names) >= pods]
    if holding:
        _, best = min(holding)  # the smallest domain that holds them all, then the first by name
        return Placement((label, best))
    if not ask.required:
        return Placement(None)
    counts = ", ".join(f"{value} {counted(len(names), 'node')}" for value, names in by_domain.items()) or "none"
    return Placement(
        None,
        f"Pending: {job}'s {counted(pods, 'pod')} require one {LEVEL_NAMES.get(label, label)} ({label}) with a node "
        f"for each, and none has {pods}: {counts}",
    )
