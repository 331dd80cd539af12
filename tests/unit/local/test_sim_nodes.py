"""Simulated nodes: where pods go, what status.json and the CLI say of them, and the pod network made and removed.

The placement and the refusals run anywhere; the pod network tests need root and iproute2 (CI runs as root) and
make real namespaces on a bridge of 198.18.0.0/15, which each test removes again.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eksflow.cli import parser
from eksflow.local.node import Requests
from eksflow.local.pod_network import (
    POD_RANGE,
    REGISTRY,
    PodNetwork,
    PodNetworkError,
    _locked,
    _write_owner,
    hand_over,
    remove_network,
    sweep,
    unavailable,
)
from eksflow.local.sim_nodes import SimNode, choose_node
from eksflow.local.status import NodeStatus, node_document, read_nodes
from eksflow.local.watchdog import netns_pids
from tests.unit.test_cli import in_process

GIB = 2**30
CORE = Requests(1000, 12 * GIB)  # a node of two on this 2-core machine
needs_root = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")


def nodes(count: int) -> list[SimNode]:
    return [SimNode(f"node-{i + 1}", CORE) for i in range(count)]


def place(cluster: list[SimNode], job: str, asked: Requests) -> str:
    node = choose_node(cluster, job, asked)
    node.allocated += asked.within(node.capacity)
    node.pods[f"{job}-{len(node.pods)}-{node.name}"] = job
    return node.name


def test_a_rayjob_spreads_one_pod_per_node_before_doubling_up_even_when_its_pods_are_sized_for_a_bigger_node():
    cluster = nodes(2)
    head = Requests(4000, 16 * GIB)  # the CPU profile's head and workers ask for more than a 1-core share
    worker = Requests(14000, 48 * GIB)
    assert [place(cluster, "train", r) for r in (head, worker, worker)] == ["node-1", "node-2", "node-1"]


def test_a_pod_that_fits_goes_to_the_least_allocated_node_and_a_lost_node_gets_none():
    cluster = nodes(3)
    place(cluster, "other", Requests(800, GIB))
    cluster[1].lost = True
    assert place(cluster, "train", Requests(500, GIB)) == "node-3"
    assert place(cluster, "train", Requests(500, GIB)) == "node-3"  # it still fits there; on node-1 it would not
    for node in cluster:
        node.lost = True
    with pytest.raises(PodNetworkError, match="every one was lost"):
        choose_node(cluster, "train", Requests())


def test_status_json_keeps_each_pods_node_and_address():
    pods = [{"name": "train-head-1a2b3c", "role": "head", "hostNodeName": "node-1", "podIP": "198.18.0.2"}]
    node = NodeStatus("train", "train", "Succeeded", host_node="node-1", pods=pods)
    document = node_document("wf", node)
    assert document["hostNodeName"] == "node-1" and document["pods"] == pods
    (read,) = read_nodes({"status": {"nodes": {"train": document}}}, Path("/nonexistent")).values()
    assert (read.host_node, read.pods) == ("node-1", pods)
    assert "hostNodeName" not in node_document("wf", NodeStatus("x", "x", "Succeeded"))  # without nodes: as before


def test_nodes_without_root_are_refused_in_one_line_and_a_bad_count_by_argparse(monkeypatch, capsys):
    from pipelines.llama_lora import build

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, _, err = in_process(build, capsys, "run", "--nodes", "2")
    assert code == 2 and err.strip().splitlines() == [
        "config error: --nodes 2: simulated nodes need root (they make network namespaces and a bridge); run as "
        "root or without --nodes"
    ]
    code, _, err = in_process(build, capsys, "run", "--nodes", "0")
    assert code == 2 and "--nodes: must be a whole number from 1 to 16, got '0'" in err


@pytest.mark.parametrize(
    "text", [" 2", "2 ", "+2", "\u0662", "1_6", ""], ids=["space", "trailing", "plus", "arabic", "_", "empty"]
)
def test_a_node_count_is_ascii_digits_alone(text, capsys):
    with pytest.raises(SystemExit) as refused:
        parser("p", "").parse_args(["run", "--nodes", text])
    assert refused.value.code == 2
    assert f"--nodes: must be a whole number from 1 to 16, got {text!r}" in capsys.readouterr().err


def test_an_empty_eksflow_nodes_is_unset_and_a_set_one_is_the_default(monkeypatch):
    monkeypatch.setenv("EKSFLOW_NODES", "")
    assert parser("p", "").parse_args(["run"]).nodes == 1
    monkeypatch.setenv("EKSFLOW_NODES", "3")
    assert parser("p", "").parse_args(["run"]).nodes == 3


@needs_root
def test_pods_have_their_own_address_and_host_name_reach_each_other_and_nothing_is_left(tmp_path):
    network = PodNetwork()
    try:
        server, client = network.add("pod-a"), network.add("pod-b")
        assert server.address != client.address
        assert all(ipaddress.ip_address(p.address) in POD_RANGE for p in (server, client))
        listen = (
            "import socket;s=socket.socket();s.bind(('0.0.0.0',7000));s.listen();"
            "c,a=s.accept();c.sendall(socket.gethostname().encode()+b' '+a[0].encode())"
        )
        served = subprocess.Popen([*server.enter(network.hosts), sys.executable, "-c", listen])
        ask = (
            "import socket,time\nfor _ in range(100):\n try:\n  c=socket.create_connection(('pod-a',7000));break\n"
            " except OSError: time.sleep(0.05)\nprint(c.recv(100).decode(), socket.gethostname())"
        )
        answer = subprocess.run(
            [*client.enter(network.hosts), sys.executable, "-c", ask],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        served.wait(10)
        # pod-a answered with its host name and saw pod-b's address; pod-b has its own host name
        assert answer.stdout.split() == ["pod-a", client.address, "pod-b"], answer.stderr
        assert socket.gethostname() not in ("pod-a", "pod-b")  # the host keeps its own
    finally:
        network.close()
    assert not (REGISTRY / network.tag).exists()
    listed = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    assert network.bridge not in listed
    assert (
        network.tag not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    )


@needs_root
def test_a_network_whose_executor_was_killed_is_swept_by_the_next_one():
    make = (
        "import time;from eksflow.local.pod_network import PodNetwork;"
        "n=PodNetwork();p=n.add('orphan');"
        "import subprocess;subprocess.Popen([*p.enter(n.hosts),'sleep','300']);print(n.tag,flush=True);time.sleep(300)"
    )
    owner = subprocess.Popen([sys.executable, "-c", make], stdout=subprocess.PIPE, text=True)
    tag = owner.stdout.readline().strip() if owner.stdout else ""
    assert tag
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 30  # the pod's process enters its namespace once its interpreter has started
    while not netns_pids(f"ef{tag}-2") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert netns_pids(f"ef{tag}-2"), "the orphan pod's sleep outlived its executor"
    subprocess.run(["ip", "netns", "add", "ef0badc0-7"], check=True)  # a namespace whose record is gone
    subprocess.run(["ip", "link", "add", "efb0badc1", "type", "bridge"], check=True)  # and a bridge
    assert {tag, "0badc0", "0badc1"} <= set(sweep())
    assert not netns_pids(f"ef{tag}-2") and not (REGISTRY / tag).exists()
    assert (
        "ef0badc0-7" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    )
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    assert f"efb{tag}" not in links and "efb0badc1" not in links


@needs_root
def test_a_sweep_waits_for_a_network_being_made_instead_of_taking_it_for_a_dead_ones():
    """A run's record exists a moment before its owner is written: a sweep from a run starting beside it (another
    test's, under pytest-xdist) must not find it then and remove a live run's network. The machine's registry: the
    namespaces a sweep removes are the machine's, so no other registry may be swept (it would take every live run's
    for unrecorded)."""
    making = REGISTRY / "0a0b0c"
    REGISTRY.mkdir(parents=True, exist_ok=True)
    try:
        with _locked():  # as PodNetwork holds it from its sweep to its owner's record
            making.mkdir()
            swept = threading.Thread(target=sweep)
            swept.start()
            swept.join(1.0)
            assert swept.is_alive() and making.is_dir()  # waiting on the lock, the record untouched
            _write_owner(making, os.getpid())
        swept.join()
        assert making.is_dir()  # its owner is alive
    finally:
        remove_network(making.name)


@needs_root
def test_a_network_handed_over_to_a_daemon_lives_as_long_as_it_and_a_disconnected_pod_comes_back():
    """What the local Slurm's nodes rely on: the network outlives its maker, and a lost node's pod is reconnected."""
    daemon = subprocess.Popen(["sleep", "300"])
    network = PodNetwork()
    try:
        pod = network.add("node-a")
        hand_over(network.tag, daemon.pid)
        assert network.tag not in sweep() and (REGISTRY / network.tag).is_dir()  # its owner lives

        listen = "import socket;s=socket.socket();s.bind(('0.0.0.0',7000));s.listen()\nwhile 1: s.accept()[0].close()"
        subprocess.Popen([*pod.enter(network.hosts), sys.executable, "-c", listen])

        def answers(patience_s: float) -> bool:
            """Whether the listener answers within `patience_s` (it may not listen yet, the link be coming up)."""
            deadline = time.monotonic() + patience_s
            while True:
                try:
                    socket.create_connection((pod.address, 7000), timeout=1).close()
                    return True
                except OSError:
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.1)

        assert answers(60)  # a loaded machine takes seconds to start a Python in the pod
        pod.disconnect()
        assert not answers(0)  # its address answers no one
        pod.connect()
        pod.connect()  # idempotent
        assert answers(60)
        route = subprocess.run(["ip", "-n", pod.netns, "route"], capture_output=True, text=True, check=True).stdout
        assert "default dev eth0" in route
        daemon.kill()
        daemon.wait()
        sweep()  # its owner gone, the network goes (this sweep's doing, or another test's run beside it)
        assert not pod.exists() and not (REGISTRY / network.tag).exists()
    finally:
        daemon.kill()
        remove_network(network.tag)
    assert not (REGISTRY / network.tag).exists()


@needs_root
def test_a_node_whose_pods_cannot_be_reached_is_lost_with_its_pods_and_recorded(tmp_path):
    """`ip -n <pod netns> link set eth0 down` on a training worker's pod: its processes live on, cut off, and Ray
    waited for them for good. As the node controller marks a node NotReady once it has not been heard from for its
    grace and evicts its pods, the node is lost: its pods' processes killed, its name recorded for the pods to read
    (eksflow.runtime.nodes); a node whose pods answer is kept."""
    from eksflow.local.sim_nodes import SimulatedCluster

    cluster = SimulatedCluster(2, Requests(2000, 4 * GIB), tmp_path / "spot-notices", monitor_grace_s=1.0)
    try:
        kept = cluster.create_pod("train", "worker", Requests(500, GIB))
        cut = cluster.create_pod("train", "worker", Requests(500, GIB))
        assert kept.node != cut.node
        cut_off = subprocess.Popen([*cut.network.enter(cluster.hosts), "sleep", "300"])
        deadline = time.monotonic() + 30
        while not netns_pids(cut.network.netns):
            assert time.monotonic() < deadline, "the pod's process never started"
            time.sleep(0.05)
        cut.network.disconnect()
        # A hang guard of its own: under a loaded machine (make test's other worker) the start above can take most
        # of its 30 s, and the loss needs 1 s of silence, then the pod's processes killed and reaped.
        deadline = time.monotonic() + 60
        while not cluster.lost_record.exists():  # written once the node's pods are gone
            assert time.monotonic() < deadline, "the unreachable node was never lost"
            time.sleep(0.1)
        assert cluster.is_lost(cut.node)
        assert cut_off.wait(10) is not None and not cut.network.exists()  # evicted: killed, its sandbox gone
        assert not cluster.is_lost(kept.node) and kept.network.exists()
        assert cluster.lost_record.read_text().split() == [cut.node]
        assert cluster.lost_because(cut.node) == "its pods unreachable for 1 s"
    finally:
        cluster.close()


LISTEN_AS_RAY_HEAD = (
    "import socket,time;s=socket.socket();s.bind(('0.0.0.0',6379));s.listen()\nwhile 1: s.accept()[0].close()"
)


@needs_root
def test_each_ray_pod_gets_its_node_a_temporary_folder_that_goes_with_it_and_the_lost_nodes_record(tmp_path):
    """What a RayJob's pod processes get, as KubeRay's pods do (their `ray start` stood in for by a listener): the
    node they run on (the downward API's spec.nodeName) and the record of lost nodes, which a checkpoint lease reads;
    and a TMPDIR in the pod's own folder, which goes with the pod: each training attempt left a pymp-* folder of
    multiprocessing's in /tmp."""
    from eksflow.local import process
    from eksflow.local.ray_pods import RayPods, pod_temp
    from eksflow.local.resources import LocalJob, RayGroup
    from eksflow.local.sim_nodes import SimulatedCluster
    from eksflow.runtime import nodes

    cluster = SimulatedCluster(2, Requests(2000, 4 * GIB), tmp_path / "spot-notices")
    groups = tuple(RayGroup(role, 1, (), (), Requests(500, GIB)) for role in ("head", "cpu"))
    started: list[dict[str, str]] = []
    tracker = process.ProcessTracker()

    def spawn(argv: list[str], env: dict[str, str], log) -> subprocess.Popen[bytes]:
        started.append(dict(env))
        enter = argv[: argv.index("--") + 1]  # the pod's namespaces; a listener where `ray start` would run
        listener = [*enter, sys.executable, "-c", LISTEN_AS_RAY_HEAD]
        return subprocess.Popen(listener, env=env, stdout=log, stderr=log, start_new_session=True)  # as process.start

    pods = RayPods(
        cluster, "train", LocalJob("RayJob", "true", ray_groups=groups), env=dict(os.environ), logs=tmp_path / "logs",
        spawn=spawn, reap=lambda proc: process.end(proc, tracker), changed=lambda documents: None,
    )  # fmt: skip
    try:
        pods.start({})
        placed = {pod["name"]: pod for pod in pods.documents()}
        temps = []
        for env in started:
            (pod,) = [p for p in pods._pods if env["TMPDIR"].startswith(str(pod_temp(p.pod)) + "/")]
            assert Path(env["TMPDIR"]).is_dir() and env[nodes.NODE_NAME_ENV] == placed[pod.pod.name]["hostNodeName"]
            assert env[nodes.LOST_NODES_ENV] == str(cluster.lost_record)
            temps.append(Path(env["TMPDIR"]))
        assert len(temps) == 2
        (Path(temps[1]) / "pymp-left-behind").mkdir()  # what multiprocessing leaves when its process is killed
    finally:
        pods.close()
        cluster.close()
    assert not any(temp.exists() for temp in temps)
