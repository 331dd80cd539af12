"""A pod network outlives neither its run, however the run ends, nor the routes of this machine (root only).

`run --nodes 2` killed with SIGKILL left its bridge, veths, namespaces and record until the next `--nodes` run:
its watchdog removes them now. A network's /24 is one that no route overlaps, not only no interface address.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eksflow.local.pod_network import REGISTRY, PodNetwork, hand_over, remove_network, unavailable
from eksflow.local.watchdog import netns_pids
from tests.unit.local.manifests import container, task, workflow

needs_root = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")
WATCHDOG = Path(__file__).resolve().parents[3] / "eksflow" / "local" / "watchdog.py"
PATIENCE_S = 60  # a bound on a loaded machine's start of a Python and its cleanup, never a measured time
# The executor of a run on two simulated nodes, in a process of its own to be killed; argv: state folder, manifest.
EXECUTOR = """
import json, sys
from pathlib import Path
from eksflow.local import run_workflow
run_workflow(json.loads(sys.argv[2]), Path(sys.argv[1]), cwd=Path.cwd(), nodes=2)
"""
MARK_AND_WAIT = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(300)"


def links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout


def owned_by(pid: int) -> list[str]:
    """The tags of the pod networks process `pid` owns."""
    found = []
    for owner in REGISTRY.glob("*/owner") if REGISTRY.is_dir() else []:
        if owner.read_text(encoding="utf-8").partition(" ")[0] == str(pid):
            found.append(owner.parent.name)
    return found


def until(done, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@needs_root
def test_an_executor_killed_with_sigkill_leaves_no_pod_network(tmp_path: Path) -> None:
    started = tmp_path / "started"
    manifest = workflow([task("wait", "wait")], [container("wait", MARK_AND_WAIT, str(started))])
    executor = subprocess.Popen(
        [sys.executable, "-c", EXECUTOR, str(tmp_path / "state"), json.dumps(manifest)],
        cwd=Path(__file__).resolve().parents[3],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tags: list[str] = []
    try:
        until(started.exists, "the run's task never started")
        tags = owned_by(executor.pid)
        assert len(tags) == 1 and f"efb{tags[0]}" in links()
        executor.send_signal(signal.SIGKILL)
        executor.wait()
        until(lambda: not (REGISTRY / tags[0]).exists(), "the killed run's pod network was left behind")
        assert f"efb{tags[0]}" not in links()
    finally:
        executor.kill()
        for tag in tags:
            remove_network(tag)


@needs_root
def test_the_watchdog_of_a_dead_executor_removes_its_pods_and_spares_a_network_a_live_daemon_owns(
    tmp_path: Path,
) -> None:
    """What a killed `run --nodes` leaves: pods (a namespace, a veth, a process in it), the bridge, the record."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    daemon = subprocess.Popen(["sleep", "300"])
    left, handed = PodNetwork(), PodNetwork()
    try:
        pod = left.add("pod-a")
        sleeper = subprocess.Popen([*pod.enter(left.hosts), "sleep", "300"])
        until(lambda: netns_pids(pod.netns), "the pod's process never started")
        handed.add("node-a")
        hand_over(left.tag, gone.pid)  # the executor: dead
        hand_over(handed.tag, daemon.pid)  # a daemon's (the local Slurm's): alive
        notes = f"net {left.folder}\nnet {handed.folder}\n"  # then its input ends without `exit`: the executor died
        watchdog = subprocess.run(
            [sys.executable, "-I", "-S", str(WATCHDOG), str(tmp_path), "1"],  # as process.Watchdog starts it
            input=notes.encode(),
            timeout=PATIENCE_S,
            check=False,
        )
        assert watchdog.returncode == 0
        assert sleeper.wait(10) is not None and not pod.exists() and not left.folder.exists()
        assert f"efb{left.tag}" not in links() and f"efv{left.tag}" not in links()
        assert left.tag not in namespaces()
        assert handed.folder.is_dir() and f"efb{handed.tag}" in links()
    finally:
        daemon.kill()
        remove_network(left.tag)
        remove_network(handed.tag)


@needs_root
def test_a_pod_network_takes_no_24_a_route_already_covers() -> None:
    """A route in a table of its own (no rule consults it, so no run here is disturbed) is a route all the same."""
    table = str(4000 + os.getpid() % 1000)
    first = PodNetwork()
    taken = first.subnet
    first.close()  # the /24 a new network would take, now covered by a route instead
    covering = ipaddress.ip_network(f"{taken.network_address}/23", strict=False)
    subprocess.run(["ip", "route", "add", str(covering), "dev", "lo", "table", table], check=True)
    network = None
    try:
        network = PodNetwork()
        assert not network.subnet.overlaps(covering), (network.subnet, covering)
    finally:
        subprocess.run(["ip", "route", "flush", "table", table], check=False)
        if network is not None:
            network.close()
