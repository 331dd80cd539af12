"""A serving Deployment's replicas on simulated nodes: a Spot notice for a node drains its pods there, as Kubernetes.

Real pods (network namespaces on the run's bridge, each running a small HTTP server as its container), the
fleet's own Replicas and the cluster's notice handling; needs root and iproute2 (CI runs as root).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eksflow.llm.serving import fleet_pods
from eksflow.llm.serving.fleet_endpoints import Endpoint
from eksflow.llm.serving.fleet_nodes import Replicas
from eksflow.local.node import Requests
from eksflow.local.pod_network import unavailable
from eksflow.local.sim_nodes import PlacedPod, SimulatedCluster

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")
PORT = 8000
GIB = 2**30
# The container: an HTTP server that stops on SIGTERM (as PID 1 of its pod it has to say so, as vLLM does).
SERVER = (
    "import http.server, os, signal, sys; signal.signal(signal.SIGTERM, lambda *_: os._exit(0)); "
    "http.server.ThreadingHTTPServer(('0.0.0.0', int(sys.argv[1])), http.server.BaseHTTPRequestHandler).serve_forever()"
)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[SimulatedCluster, Replicas, list[list[Endpoint]]]]:
    """Two replicas of a Deployment on three nodes; every change of its endpoints, as its Services see them."""
    cluster = SimulatedCluster(3, Requests(3000, 12 * GIB), tmp_path / "spot-notices")
    seen: list[list[Endpoint]] = []

    def start_pod(pod: PlacedPod) -> subprocess.Popen[bytes]:
        server = [sys.executable, "-c", SERVER, str(PORT)]
        return fleet_pods.spawn([*pod.network.enter(cluster.hosts), *server], tmp_path, {}, tmp_path / "pod.log", None)

    def ready(url: str) -> bool:
        return fleet_pods.status(url + "/") == 501  # the handler has no GET: any answer proves the server up

    replicas = Replicas(
        cluster, "web", "vllm", count=2, port=PORT, requests=Requests(500, GIB), start_pod=start_pod, ready=ready,
        stop_pod=lambda p: fleet_pods.end(p, None, 5.0), changed=lambda: seen.append(replicas.endpoints()),
    )  # fmt: skip
    replicas.start()
    try:
        wait(replicas.available, "both replicas ready")
        yield cluster, replicas, seen
    finally:
        replicas.close()
        cluster.close()


def wait(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s:g} s"
        time.sleep(0.1)


def test_a_spot_notice_for_a_serving_node_drains_its_pod_and_replaces_it_elsewhere(deployment, tmp_path):
    """Before, a notice for a node holding only serving pods was never read (only a RayJob's watch read notices)."""
    cluster, replicas, seen = deployment
    victim = replicas.pods()[0]
    other = replicas.pods()[1]
    (tmp_path / "spot-notices").mkdir()
    (tmp_path / "spot-notices" / victim.pod.node).touch()
    wait(lambda: cluster.is_lost(victim.pod.node), f"{victim.pod.node} drained and gone")
    wait(replicas.available, "the replacement ready")
    nodes = {p.pod.node for p in replicas.pods()}
    assert victim.pod.node not in nodes and other.pod.node in nodes and len(replicas.pods()) == 2
    assert victim.proc.returncode is not None and not (tmp_path / "spot-notices" / victim.pod.node).exists()
    assert len(cluster.nodes) == 4  # a new node added in the lost one's place, as Karpenter does
    # Out of the Services first: no endpoint list after the notice names the drained pod as ready.
    drained = next(i for i, listed in enumerate(seen) if victim.pod.name not in {e.pod for e in listed})
    assert all(victim.pod.name not in {e.pod for e in listed if e.ready} for listed in seen[drained:])


def test_no_pod_is_placed_on_a_node_being_drained(deployment):
    cluster, replicas, _ = deployment
    serving = [p.pod.node for p in replicas.pods()]
    for node in cluster.nodes:
        node.cordoned = node.name != serving[1]  # the empty node, the least allocated, among them
    placed = cluster.create_pod("another", "web", Requests(100, GIB))
    try:
        assert placed.node == serving[1]
    finally:
        cluster.delete_pod(placed)
