"""The serving fleet on simulated nodes (`run --nodes N`): a Deployment's replicas as pods, kept as its ReplicaSet does.

With simulated nodes (eksflow/local/sim_nodes.py) a Deployment of the fleet runs spec.replicas pods, placed as the
default scheduler spreads one Deployment's pods: the vLLM replicas on different nodes, the proxy on the least
loaded node left. Each pod runs the container's command in its own network namespace, listening on the container's
port on its own address, which only the run's bridge reaches; the engine's key guards every route as before. Its
Services are addresses on this machine's end of the bridge (eksflow/local/service_proxy.py), spreading connections
over the ready pods.

A pod is an endpoint of its Services once it is ready (the readiness probe's check, local_fleet's `ready`), and is
taken out of them when it ends or its node goes: its connections close, and the next connection goes to a pod that
is still there. The ReplicaSet then puts a new pod in its place, on a new node when its own is gone (as Karpenter
provisions one for a pod left Pending); it joins the Services once it is ready in turn. A Spot notice for a node
(sim_nodes.py) drains this Deployment's pods there as an eviction does: each leaves its Services at once, its
replacement starts on another node (the noticed one is cordoned), and it gets SIGTERM, with the grace to finish the
requests it holds. Each pod's process is told to the run's watchdog, and `close` ends them all (SIGTERM, SIGKILL
after the grace) and removes the pods.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eksflow.llm.serving.fleet_endpoints import Endpoint
from eksflow.llm.serving.fleet_pods import FleetError, error_line
from eksflow.local import PlacedPod, PodNetworkError, Requests, SimulatedCluster
from eksflow.runtime.readable import log_tail

StartPod = Callable[[PlacedPod], "subprocess.Popen[bytes]"]  # run the container's command in this pod
Ready = Callable[[str], bool]  # the readiness probe's check, given the pod's base URL
_WATCH_S = 0.5


@dataclass
class FleetPod:
    """One replica: where it runs, its process (the pod's handle on this machine), whether it takes connections."""

    pod: PlacedPod
    proc: subprocess.Popen[bytes]
    ready: bool = False


class Replicas:
    """One Deployment's pods on the simulated nodes, kept at `count` while the run lasts."""

    def __init__(
        self,
        cluster: SimulatedCluster,
        name: str,
        role: str,
        *,
        count: int,
        port: int,
        requests: Requests,
        start_pod: StartPod,
        ready: Ready,
        stop_pod: Callable[[subprocess.Popen[bytes]], None],
        changed: Callable[[], None],
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.role = role
        self.count = count
        self.port = port
        self.requests = requests
        self._start_pod = start_pod
        self._ready = ready
        self._stop_pod = stop_pod
        self._changed = changed  # the pods or their readiness changed: the Services' endpoints follow
        self._lock = threading.Lock()
        self._scaling = threading.Lock()  # held while pods are taken out and added: the count stays `count`
        self._pods: list[FleetPod] = []
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        """Start every replica and the watch that keeps them and lets each in once it is ready."""
        for _ in range(self.count):
            self._add()
        self._watcher = threading.Thread(target=self._watch, name=f"replicas-{self.name}", daemon=True)
        self._watcher.start()
        self.cluster.add_drainer(self.drain)

    def url(self, pod: FleetPod) -> str:
        """The pod's own address, as its readiness probe and its Services reach it."""
        return f"http://{pod.pod.address}:{self.port}"

    def pods(self) -> list[FleetPod]:
        """The pods now running."""
        with self._lock:
            return list(self._pods)

    def alive(self) -> bool:
        """Whether any pod runs."""
        return any(p.proc.poll() is None for p in self.pods())

    def endpoints(self) -> list[Endpoint]:
        """The pods as their Services' endpoints: a ready one takes connections, and the steps list them all."""
        return [
            Endpoint(p.pod.name, p.pod.node, p.pod.address, self.port, p.ready and p.proc.poll() is None)
            for p in self.pods()
        ]

    def documents(self) -> list[dict[str, str]]:
        """The pods, as status.json lists a task's pods."""
        return [p.pod.document() for p in self.pods()]

    def available(self) -> bool:
        """Whether every replica runs and is ready (the Deployment is available)."""
        pods = self.pods()
        return len(pods) == self.count and all(p.ready and p.proc.poll() is None for p in pods)

    def wait_available(self, stop_reason: Callable[[], str], where: str, log_of: Callable[[str], Path]) -> float:
        """Wait until every replica is ready (the Deployment is available); the seconds it took.

        FleetError if a pod ends first (its log's tail in the message; `log_of` gives a pod's log) or the run stops.
        """
        started = time.monotonic()
        while not stop_reason():
            if (ended := next((p for p in self.pods() if p.proc.poll() is not None), None)) is not None:
                log = log_of(ended.pod.name)
                said = error_line(log_tail(log)) or "(no output)"  # its own error, not whatever its log ends with
                raise FleetError(
                    f"{ended.pod.name} on {ended.pod.node} exited with code {ended.proc.returncode} before it was "
                    f"ready: {said}; log {log}"
                )
            if self.available():
                return time.monotonic() - started
            time.sleep(1.0)
        raise FleetError(f"{where}: {stop_reason()} while {self.name} was starting")

    def close(self) -> None:
        """End every pod (SIGTERM, then SIGKILL after the grace) and remove it."""
        self._closing.set()
        self.cluster.remove_drainer(self.drain)
        if self._watcher is not None:
            self._watcher.join()
        with self._lock:
            pods, self._pods = self._pods, []
        for pod in pods:
            with contextlib.suppress(ProcessLookupError):
                pod.proc.terminate()
        for pod in pods:
            self._stop_pod(pod.proc)
            self.cluster.delete_pod(pod.pod)
        self._changed()

    def drain(self, node: str) -> None:
        """A Spot notice for `node`: this Deployment's pods there are evicted, each replaced on another node first.

        As Kubernetes evicts a pod: it is out of its Services' endpoints at once (a terminating pod takes no new
        connection), the ReplicaSet starts its replacement, placed off the cordoned node, and it gets SIGTERM, killed
        when the grace is over; vLLM finishes the requests it holds meanwhile.
        """
        with self._scaling:
            with self._lock:
                leaving = [p for p in self._pods if p.pod.node == node]
                for pod in leaving:
                    self._pods.remove(pod)
            if not leaving:
                return
            self._changed()
            for _ in leaving:
                if self._closing.is_set():
                    break
                try:
                    self._add()
                except (OSError, PodNetworkError):
                    break  # the watch adds it once a node can take it
        for pod in leaving:
            with contextlib.suppress(ProcessLookupError):
                pod.proc.terminate()
        for pod in leaving:
            self._stop_pod(pod.proc)
            self.cluster.delete_pod(pod.pod)

    def _add(self) -> FleetPod:
        placed = self.cluster.create_pod(self.name, self.role, self.requests)
        try:
            proc = self._start_pod(placed)
        except BaseException:
            self.cluster.delete_pod(placed)
            raise
        pod = FleetPod(placed, proc)
        with self._lock:
            self._pods.append(pod)
        self._changed()
        return pod

    def _watch(self) -> None:
        """Take ended pods out, put new ones in their place, and let each new one in once it is ready."""
        while not self._closing.wait(_WATCH_S):
            with self._lock:
                ended = [p for p in self._pods if p.proc.poll() is not None]
                for pod in ended:
                    self._pods.remove(pod)
            if ended:
                self._changed()  # out of the Services at once: their connections close
            for pod in ended:
                node = pod.pod.node
                if not pod.pod.network.exists():  # its sandbox went without the pod ending: its node is gone
                    self.cluster.lose(node)
                self._stop_pod(pod.proc)
                self.cluster.delete_pod(pod.pod)
                if self.cluster.is_lost(node):
                    self.cluster.replace_lost()
            with self._scaling:
                while len(self.pods()) < self.count and not self._closing.is_set():
                    try:
                        self._add()
                    except (OSError, PodNetworkError):
                        break  # the next round tries again, as a ReplicaSet does
            self._probe()

    def _probe(self) -> None:
        """Probe each running pod not ready yet, once; a pod found ready joins the Services."""
        for pod in self.pods():
            if self._closing.is_set():
                return
            if not pod.ready and pod.proc.poll() is None and self._ready(self.url(pod)):
                pod.ready = True
                self._changed()
