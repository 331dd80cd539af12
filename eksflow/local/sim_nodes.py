"""Simulated nodes (`run --nodes N`): the pods of a distributed job placed on N nodes of this machine, as on a cluster.

Each node is a share of this machine (its cores and memory divided by N, the scheduler's own accounting, as
node.py does for the one-node case) and each pod on it has its own network namespace, address, host name and
/etc/hosts (pod_network.py). A pod is placed as Kubernetes' default scheduler would place the pods of one job:
on the node with the fewest pods of that job (the default topology spread), then the least allocated one, among
the nodes where its requests fit. A pod that fits no node (a worker sized for an m6i.4xlarge on a 1-core share)
goes where the same order puts it, sharing that node: on the cluster it would get a node of its size.

Each node carries the labels EKS gives a node of its network topology (`topology.k8s.aws/network-node-layer-1`
to `-3`, and `kubernetes.io/hostname`): every node, replacements included, in one spine, block and rack, its host
name its own; a job asking for a topology level gets its pods placed within one domain of it (topology_domains.py).

What the pods run, and for how long, is their kind's business (ray_pods.py runs a RayJob's); here are the nodes,
the placement and the pods' network identities. `lose` takes a node away as a reclaimed Spot instance goes: its
pods' processes are killed and their addresses vanish. A Spot interruption notice comes first as a file named
after the node in the run's `spot-notices/` folder (`touch .eksflow/runs/<run>/spot-notices/node-2`, the drill's
handle, as `kubectl drain` is a cluster's), read every half second whatever runs on the node: as Karpenter's
interruption handling does, the node is cordoned (no new pod goes there), every controller with pods on it drains
its own at once (each `add_drainer` of theirs: a RayJob's pods run their preStop hook and get SIGTERM, a
Deployment's are taken out of their Services and replaced elsewhere), and once every drain is over the node goes
and a new one is added in its place. `close` removes everything.

A node whose pods this machine cannot reach is lost too, as Kubernetes' node controller marks a node NotReady when
its kubelet has not been heard from for the node-monitor grace period (40 s) and evicts its pods: every 5 s each
node's pods are probed from the host, and a node none of whose pods answered for the grace is lost (a partitioned
node's processes live on, cut off, and a job waiting for them would wait for good). Each node lost is written to
`lost_record` (one name a line) once its processes are gone; pods are told where (eksflow.runtime.nodes), so a
process recorded on such a node is known dead (a checkpoint lease's holder: eksflow.llm.steps.common.lease).
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eksflow.local.node import Requests
from eksflow.local.pod_network import Pod, PodNetwork, PodNetworkError
from eksflow.profiles import HOSTNAME_LABEL, NETWORK_LAYER_LABEL

Drainer = Callable[[str], None]  # ends its controller's pods on the named node, as their grace allows
_NOTICE_WATCH_S = 0.5
NODE_MONITOR_GRACE_S = 40.0  # Kubernetes' node-monitor-grace-period: a node not heard from this long is NotReady
_PROBE_PORT = 9  # discard: a pod that does not listen there answers with a reset, which is an answer
_PROBE_TIMEOUT_S = 0.5


@dataclass
class SimNode:
    """One simulated node: its name, its share of the machine, what its pods hold."""

    name: str
    capacity: Requests
    allocated: Requests = field(default_factory=Requests)
    pods: dict[str, str] = field(default_factory=dict)  # pod name -> the job it belongs to
    lost: bool = False
    lost_because: str = ""  # why it was lost, where it was not reclaimed as a Spot instance is
    replaced: bool = False  # a node was added in its place
    cordoned: bool = False  # given a Spot notice: no new pod goes there
    labels: dict[str, str] = field(default_factory=dict)  # its topology labels (node_labels)


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

    def __init__(
        self, count: int, machine: Requests, notices: Path, monitor_grace_s: float = NODE_MONITOR_GRACE_S
    ) -> None:
        share = Requests(machine.cpu_m // count, machine.memory // count)
        self.nodes = [new_node(f"node-{i + 1}", share) for i in range(count)]
        self.notices = notices  # a file named after a node here is a Spot interruption notice for it
        self.monitor_grace_s = monitor_grace_s
        self._lock = threading.Lock()
        self._drainers: list[Drainer] = []
        self._closing = threading.Event()
        self._addresses: dict[str, str] = {}  # pod name -> its address, for the node monitor's probes
        self._heard: dict[str, float] = {}  # node name -> when one of its pods last answered (monotonic seconds)
        self._domains: dict[str, tuple[str, str]] = {}  # job -> the (node label, value) its pods must share
        self.network = PodNetwork()
        self.lost_record = self.network.folder / "lost-nodes"
        threading.Thread(target=self._watch_notices, name="spot-notices", daemon=True).start()
        threading.Thread(target=self._monitor_nodes, name="node-monitor", daemon=True).start()

    @property
    def hosts(self) -> Path:
        """The run's /etc/hosts, as every pod sees it."""
        return self.network.hosts

    def create_pod(
        self,
        job: str,
        role: str,
        asked: Requests,
        name: str = "",
        aliases: tuple[str, ...] = (),
    ) -> PlacedPod:
        """Place a new pod of `job` with its network, named `name` or `<job>-<role>-<suffix>`; `aliases` name it too.

        `name` is a controller's own (an MPIJob's `<job>-worker-<i>`), unique in the run. A job confined to a topology
        domain (`confine`) gets its pods, replacements included, on that domain's nodes only.
        """
        name = name or f"{job[:40]}-{role[:12]}-{secrets.token_hex(3)}".lower()
        with self._lock:
            node = choose_node(self.nodes, job, asked, self._domains.get(job))
            counted = asked.within(node.capacity)
            node.allocated += counted
            node.pods[name] = job
        try:
            network = self.network.add(name, aliases)
        except BaseException:
            self._release(node.name, name, counted)
            raise
        with self._lock:
            self._addresses[name] = network.address
        return PlacedPod(name, role, node.name, network, counted)

    def confine(self, job: str, domain: tuple[str, str] | None) -> None:
        """Place `job`'s pods only on nodes whose label `domain[0]` is `domain[1]` (a topology domain); None: any."""
        with self._lock:
            if domain is None:
                self._domains.pop(job, None)
            else:
                self._domains[job] = domain

    def delete_pod(self, pod: PlacedPod) -> None:
        """End the pod: its processes are killed, its address and namespace removed, its requests freed."""
        self.network.remove(pod.name)
        self._release(pod.node, pod.name, pod.requests)

    def lose(self, node_name: str, because: str = "") -> list[str]:
        """Take node `node_name` away with every pod on it (a reclaimed Spot instance); the pods it had.

        Recorded in `lost_record` once its pods' processes are killed: from then on nothing of it runs.
        """
        with self._lock:
            node = self._node(node_name)
            newly, node.lost = not node.lost, True
            node.lost_because = node.lost_because or because
            names = list(node.pods)
        for name in names:
            self.network.remove(name)
        if newly:
            with self._lock, open(self.lost_record, "a", encoding="utf-8") as record:
                record.write(node_name + "\n")
        return names

    def silent_nodes(self) -> list[str]:
        """Probe every pod once; the nodes none of whose pods answered for `monitor_grace_s`, each lost here."""
        now = time.monotonic()
        with self._lock:
            watched = {
                node.name: [self._addresses[pod] for pod in node.pods if pod in self._addresses]
                for node in self.nodes
                if not node.lost
            }
        silent = []
        for name, addresses in watched.items():
            if not addresses or any(answers(address) for address in addresses):
                self._heard[name] = now
            elif now - self._heard.setdefault(name, now) >= self.monitor_grace_s:
                silent.append(name)
        for name in silent:
            self.lose(name, f"its pods unreachable for {self.monitor_grace_s:g} s")
        return silent

    def is_lost(self, node_name: str) -> bool:
        """Whether node `node_name` was lost."""
        with self._lock:
            return self._node(node_name).lost

    def lost_because(self, node_name: str) -> str:
        """Why node `node_name` was lost ("" when it went as a reclaimed instance does, or is still there)."""
        with self._lock:
            return self._node(node_name).lost_because

    def add_node(self, replacing: str = "") -> str:
        """A new node of the same share (as Karpenter provisions one for pods left Pending); its name.

        `replacing`: the lost node it takes the place of.
        """
        with self._lock:
            node = new_node(f"node-{len(self.nodes) + 1}", self.nodes[0].capacity)
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

    def _monitor_nodes(self) -> None:
        """Kubernetes' node-monitor-period: 5 s for its 40 s grace."""
        while not self._closing.wait(self.monitor_grace_s / 8):
            self.silent_nodes()

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
            self._addresses.pop(pod, None)


def new_node(name: str, capacity: Requests) -> SimNode:
    """A node of the run: one spine, block and rack for all (as a capacity block's nodes are), its own host name."""
    layers = {
        NETWORK_LAYER_LABEL.format(layer): f"nn-{level}-1" for layer, level in ((1, "spine"), (2, "block"), (3, "rack"))
    }
    return SimNode(name, capacity, labels={**layers, HOSTNAME_LABEL: name})


def choose_node(nodes: list[SimNode], job: str, asked: Requests, domain: tuple[str, str] | None = None) -> SimNode:
    """The node a new pod of `job` asking `asked` goes to; PodNetworkError when none is left.

    Among the nodes of `domain` (a node label and its value; None: any): fewest pods of its job first, then the least
    allocated, among the nodes where it fits (all, if it fits none).
    """
    alive = [
        node
        for node in nodes
        if not node.lost and not node.cordoned and (domain is None or node.labels.get(domain[0]) == domain[1])
    ]
    if not alive:
        raise PodNetworkError(
            "no simulated node is left to place a pod on: every one"
            + ("" if domain is None else f" with {domain[0]}={domain[1]}")
            + " was lost or is being drained"
        )

    def order(node: SimNode) -> tuple[int, float, int]:
        same_job = sum(1 for owner in node.pods.values() if owner == job)
        return same_job, node.allocated.cpu_m / max(node.capacity.cpu_m, 1), nodes.index(node)

    fitting = [node for node in alive if not asked.short_of(node.capacity - node.allocated)]
    return min(fitting or alive, key=order)


def answers(address: str) -> bool:
    """Whether this machine reaches `address`: a connection accepted or refused is an answer, silence is not."""
    try:
        socket.create_connection((address, _PROBE_PORT), timeout=_PROBE_TIMEOUT_S).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return True
