"""Simulated nodes (`run --nodes N`): the pods of a distributed job placed on N nodes of this machine, as on a cluster.

Each node is a share of this machine (its cores and memory divided by N, the scheduler's own accounting, as
node.py does for the one-node case) and each pod on it has its own network namespace, address, host name and
/etc/hosts (pod_network.py). A pod is placed as Kubernetes' default scheduler would place the pods of one job:
on the node with the fewest pods of that job (the default topology spread), then the least allocated one, among
the nodes where its requests fit. A pod that fits no node (a worker sized for an m6i.4xlarge on a 1-core share)
goes where the same order puts it, sharing that node: on the cluster it would get a node of its size.

What the pods run, and for how long, is their kind's business (ray_pods.py runs a RayJob's); here are the nodes,
the placement and the pods' network identities. `lose` takes a node away as a reclaimed Spot instance goes: its
pods' processes are killed and their addresses vanish. A Spot interruption notice comes first as a file named
after the node in the run's `spot-notices/` folder (`touch .eksflow/runs/<run>/spot-notices/node-2`, the drill's
handle, as `kubectl drain` is a cluster's), read every half second whatever runs on the node: as Karpenter's
interruption handling does, the node is cordoned (no new pod goes there), every controller with pods on it drains
its own at once (each `add_drainer` of theirs: a RayJob's pods run their preStop hook and get SIGTERM, a
Deployment's are taken out of their Services and replaced elsewhere), and once every drain is over the node goes
and a new one is added in its place. `close` removes everything.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eksflow.local.node import Requests
from eksflow.local.pod_network import Pod, PodNetwork, PodNetworkError

Drainer = Callable[[str], None]  # ends its controller's pods on the named node, as their grace allows
_NOTICE_WATCH_S = 0.5


@dataclass
class SimNode:
    """One simulated node: its name, its share of the machine, what its pods hold."""

    name: str
    capacity: Requests
    allocated: Requests = field(default_factory=Requests)
    pods: dict[str, str] = field(default_factory=dict)  # pod name -> the job it belongs to
    lost: bool = False
    replaced: bool = False  # a node was added in its place
    cordoned: bool = False  # given a Spot notice: no new pod goes there


@dataclass(frozen=True)
class PlacedPod:
    """A pod on a node: its name (and host name), role in its job, node and network identity."""

    name: str
    role: str
    node: str
    network: Pod
    requests: Requests

    @property
    def address(self) -> str:
        """The pod's IP address."""
        return self.network.address

    def document(self) -> dict[str, Any]:
        """The pod as status.json lists it (under its task's node, with Kubernetes' field names)."""
        return {"name": self.name, "role": self.role, "hostNodeName": self.node, "podIP": self.address}


class SimulatedCluster:
    """N nodes sharing this machine, and the pods placed on them."""

    def __init__(self, count: int, machine: Requests, notices: Path) -> None:
        share = Requests(machine.cpu_m // count, machine.memory // count)
        self.nodes = [SimNode(f"node-{i + 1}", share) for i in range(count)]
        self.notices = notices  # a file named after a node here is a Spot interruption notice for it
        self._lock = threading.Lock()
        self._drainers: list[Drainer] = []
        self._closing = threading.Event()
        self.network = PodNetwork()
        threading.Thread(target=self._watch_notices, name="spot-notices", daemon=True).start()

    @property
    def hosts(self) -> Path:
        """The run's /etc/hosts, as every pod sees it."""
        return self.network.hosts

    def create_pod(
        self, job: str, role: str, asked: Requests, name: str = "", aliases: tuple[str, ...] = ()
    ) -> PlacedPod:
        """Place a new pod of `job` with its network, named `name` or `<job>-<role>-<suffix>`; `aliases` name it too.

        `name` is a controller's own (an MPIJob's `<job>-worker-<i>`), unique in the run.
        """
        name = name or f"{job[:40]}-{role[:12]}-{secrets.token_hex(3)}".lower()
        with self._lock:
            node = choose_node(self.nodes, job, asked)
            counted = asked.within(node.capacity)
            node.allocated += counted
            node.pods[name] = job
        try:
            network = self.network.add(name, aliases)
        except BaseException:
            self._release(node.name, name, counted)
            raise
        return PlacedPod(name, role, node.name, network, counted)

    def delete_pod(self, pod: PlacedPod) -> None:
        """End the pod: its processes are killed, its address and namespace removed, its requests freed."""
        self.network.remove(pod.name)
        self._release(pod.node, pod.name, pod.requests)

    def lose(self, node_name: str) -> list[str]:
        """Take node `node_name` away with every pod on it (a reclaimed Spot instance); the pods it had."""
        with self._lock:
            node = self._node(node_name)
            node.lost = True
            names = list(node.pods)
        for name in names:
            self.network.remove(name)
        return names

    def is_lost(self, node_name: str) -> bool:
        """Whether node `node_name` was lost."""
        with self._lock:
            return self._node(node_name).lost

    def add_node(self, replacing: str = "") -> str:
        """A new node of the same share (as Karpenter provisions one for pods left Pending); its name.

        `replacing`: the lost node it takes the place of.
        """
        with self._lock:
            node = SimNode(f"node-{len(self.nodes) + 1}", self.nodes[0].capacity)
            self.nodes.append(node)
            if replacing:
                self._node(replacing).replaced = True
            return node.name

    def replace_lost(self) -> list[str]:
        """A new node for each lost one not replaced yet (a job's pods are about to ask for them); their names."""
        with self._lock:
            lost = [node.name for node in self.nodes if node.lost and not node.replaced]
        return [self.add_node(replacing=name) for name in lost]

    def take_notices(self) -> list[str]:
        """The nodes given a Spot interruption notice since the last call (the drill's handle: a file each)."""
        found = []
        for notice in sorted(self.notices.glob("*")) if self.notices.is_dir() else []:
            notice.unlink(missing_ok=True)
            with self._lock:
                if any(node.name == notice.name and not node.lost for node in self.nodes):
                    found.append(notice.name)
        return found

    def add_drainer(self, drain: Drainer) -> None:
        """Have `drain(node)` called for each node given a Spot notice: it ends its own pods there, in their grace."""
        with self._lock:
            self._drainers.append(drain)

    def remove_drainer(self, drain: Drainer) -> None:
        """Stop calling `drain` (its pods have ended)."""
        with self._lock:
            if drain in self._drainers:
                self._drainers.remove(drain)

    def drain(self, node_name: str) -> None:
        """Act on a Spot notice for node `node_name`: cordon it, drain it, then it goes and a new one takes its place.

        Every drainer ends its pods there at once, each within its grace; the node goes once all of them are done.
        """
        with self._lock:
            self._node(node_name).cordoned = True
            drainers = list(self._drainers)
        threads = [threading.Thread(target=d, args=(node_name,), daemon=True) for d in drainers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.lose(node_name)
        self.replace_lost()

    def close(self) -> None:
        """Stop reading notices; remove every pod and the network."""
        self._closing.set()
        self.network.close()

    def _watch_notices(self) -> None:
        while not self._closing.wait(_NOTICE_WATCH_S):
            for node in self.take_notices():
                threading.Thread(target=self.drain, args=(node,), name=f"drain-{node}", daemon=True).start()

    def _node(self, name: str) -> SimNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def _release(self, node_name: str, pod: str, counted: Requests) -> None:
        with self._lock:
            node = self._node(node_name)
            if node.pods.pop(pod, None) is not None:
                node.allocated -= counted


def choose_node(nodes: list[SimNode], job: str, asked: Requests) -> SimNode:
    """The node a new pod of `job` asking `asked` goes to; PodNetworkError when every node is lost.

    Fewest pods of its job first, then the least allocated, among the nodes where it fits (all, if it fits none).
    """
    alive = [node for node in nodes if not node.lost and not node.cordoned]
    if not alive:
        raise PodNetworkError("no simulated node is left to place a pod on: every one was lost or is being drained")

    def order(node: SimNode) -> tuple[int, float, int]:
        same_job = sum(1 for owner in node.pods.values() if owner == job)
        return same_job, node.allocated.cpu_m / max(node.capacity.cpu_m, 1), nodes.index(node)

    fitting = [node for node in alive if not asked.short_of(node.capacity - node.allocated)]
    return min(fitting or alive, key=order)
