"""The pod network of simulated nodes: a bridge of the run's own, and one network namespace per pod (root only).

On EKS (the VPC CNI) every pod has its own address and its own eth0, and pods reach each other across nodes
directly. Here the same holds on one machine: a run with simulated nodes gets a Linux bridge holding
198.18.X.1/24, a /24 of the benchmarking range 198.18.0.0/15 that no interface of this machine uses, and each pod
a network namespace whose `eth0` (one end of a veth pair, the other on the bridge) holds 198.18.X.N. A pod's
processes enter it through enter_pod.py, which also gives them the pod's host name and the run's /etc/hosts
(every pod's name and address, as kubelet writes them). Nothing is routed beyond the bridge: a pod's default
route is on-link (no gateway), so a packet for any other address finds no neighbour and never leaves the
bridge, whatever this machine forwards; pod traffic reaches pods and the host's bridge address only.

Every object is named after the network's tag (bridge efb<tag>, namespaces ef<tag>-<n>, veths efv<tag><n>) and
recorded in REGISTRY/<tag>/ with the executor that owns it. `close` removes the pods (their processes first),
the bridge and the record. An executor killed (SIGKILL, say) cannot: its watchdog (watchdog.py, told of the
network) removes it then, and `sweep`, which every new network runs first, removes the networks of any executor
that is gone, so nothing outlives its run. The removal itself lives in watchdog.py, which runs without
site-packages. A network made for daemons (the local Slurm's nodes) is handed over to one of them and lives as long
as it does.

A network's /24 is one that no interface address of this machine and no route (of any routing table) overlaps:
packets for a pod whose /24 another route also covers could go that way instead of to the bridge.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eksflow.errors import EXIT_FAILED, EksflowError
from eksflow.local.watchdog import NETNS, delete_netns, remove_pod_network, start_time
from eksflow.profiles import POD_INTERFACE  # the name the training pods' socket settings give gloo and NCCL

# One per machine, as the namespaces and bridges it records are: a sweep removes every `ef*` one it does not list.
REGISTRY = Path("/run/eksflow/pod-networks")
POD_RANGE = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544's benchmarking range: never a real network's
_ENTER = Path(__file__).with_name("enter_pod.py")
_TAG = re.compile(r"[0-9a-f]{6}")  # secrets.token_hex(3)


class PodNetworkError(EksflowError):
    """The pod network could not be made or changed; the message has what `ip` said."""

    label = "pod network error"
    exit_code = EXIT_FAILED


def unavailable() -> str:
    """Why simulated nodes cannot run on this machine, or "" when they can."""
    if not sys.platform.startswith("linux"):
        return "simulated nodes need Linux network namespaces"
    if os.geteuid() != 0:
        return "simulated nodes need root (they make network namespaces and a bridge); run as root or without --nodes"
    if shutil.which("ip") is None:
        return "simulated nodes need iproute2's `ip` (apt-get install iproute2)"
    return ""


@dataclass(frozen=True)
class Pod:
    """A pod's network identity: its host name, namespace and address."""

    name: str
    netns: str
    address: str
    aliases: tuple[str, ...] = ()  # more names /etc/hosts gives its address (a pod's FQDN under its subdomain)

    def exists(self) -> bool:
        """Whether the pod's namespace is still there (a lost node takes its pods' namespaces with it)."""
        return (NETNS / self.netns).exists()

    def enter(self, hosts: Path) -> list[str]:
        """The argv prefix that starts this pod with a command, its PID 1 (the command follows it)."""
        return [sys.executable, "-I", "-S", str(_ENTER), self.netns, self.name, str(hosts), "--"]

    def disconnect(self) -> None:
        """Take the pod's eth0 down: its address answers no one, as a reclaimed instance's."""
        _ip("-n", self.netns, "link", "set", POD_INTERFACE, "down")

    def connect(self) -> None:
        """Bring eth0 back up with its on-link default route (which going down took away); idempotent."""
        _ip("-n", self.netns, "link", "set", POD_INTERFACE, "up")
        _ip("-n", self.netns, "route", "replace", "default", "dev", POD_INTERFACE)


def join(handle: int) -> list[str]:
    """The argv prefix that runs a command in a started pod, as `kubectl exec` does: in all its namespaces.

    `handle` is the pid of the pod's enter_pod.py process, whose one child is the pod's PID 1.
    """
    return ["nsenter", f"--target={pod_init(handle)}", "--pid", "--mount", "--uts", "--net", "--"]


def pod_init(handle: int, wait_s: float = 5.0) -> int:
    """The host pid of the PID 1 of the pod whose enter_pod.py process is `handle`; PodNetworkError if none."""
    children = Path(f"/proc/{handle}/task/{handle}/children")
    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(OSError, ValueError):
            return int(children.read_text().split()[0])
        if time.monotonic() > deadline:
            raise PodNetworkError(f"the pod of process {handle} has no running command")
        time.sleep(0.02)


class PodNetwork:
    """The run's bridge and its pods; `close` removes them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, Pod] = {}
        self._next = 2  # .1 is the bridge's
        REGISTRY.mkdir(parents=True, exist_ok=True)
        # Under the registry's lock: two runs starting at once must not pick the same /24, and a sweep must not
        # find this network's record before its owner is written (it would take it for a dead executor's).
        with _locked():
            _sweep()
            self.tag = secrets.token_hex(3)
            self.subnet = _free_subnet()
            self.folder = REGISTRY / self.tag
            self.folder.mkdir()
            (self.folder / "subnet").write_text(str(self.subnet), encoding="utf-8")
            _write_owner(self.folder, os.getpid())
        self.hosts = self.folder / "hosts"
        self._write_hosts()
        self.bridge = f"efb{self.tag}"
        self.gateway = str(self.subnet.network_address + 1)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except PodNetworkError:
            self.close()
            raise

    def add(self, name: str, aliases: tuple[str, ...] = ()) -> Pod:
        """A new pod `name` (its host name, unique in the run) with the next free address, `aliases` naming it too."""
        with self._lock:
            if name in self._pods:
                raise PodNetworkError(f"pod {name!r} exists already")
            number = self._next
            self._next += 1
            if number >= self.subnet.num_addresses - 1:
                raise PodNetworkError(f"the pod network {self.subnet} has no address left for pod {name!r}")
            pod = Pod(name, f"ef{self.tag}-{number}", str(self.subnet.network_address + number), aliases)
            self._pods[name] = pod
        veth = f"efv{self.tag}{number:x}"
        try:
            _ip("netns", "add", pod.netns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", POD_INTERFACE, "netns", pod.netns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", pod.netns, "addr", "add", f"{pod.address}/{self.subnet.prefixlen}", "dev", POD_INTERFACE)
            _ip("-n", pod.netns, "link", "set", POD_INTERFACE, "up")
            _ip("-n", pod.netns, "link", "set", "lo", "up")
            # On-link, with no gateway: a program finds its own address as in a pod (Ray picks its node's address
            # by routing towards 8.8.8.8), yet nothing beyond the bridge answers for other addresses, so no packet
            # leaves it whatever this machine forwards.
            _ip("-n", pod.netns, "route", "add", "default", "dev", POD_INTERFACE)
        except PodNetworkError:
            self.remove(pod.name)
            raise
        self._write_hosts()
        return pod

    def remove(self, name: str) -> None:
        """Kill pod `name`'s processes and remove its namespace, and with it its address and veth."""
        with self._lock:
            pod = self._pods.pop(name, None)
        if pod is None:
            return
        delete_netns(pod.netns)
        self._write_hosts()

    def close(self) -> None:
        """Remove every pod, the bridge and the record."""
        for name in list(self._pods):
            self.remove(name)
        remove_pod_network(self.folder)

    def _write_hosts(self) -> None:
        with self._lock:
            lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
            lines += [" ".join([f"{pod.address}\t{pod.name}", *pod.aliases]) for pod in self._pods.values()]
            # rewritten in place: every pod's mount namespace has this very file bound over its /etc/hosts
            with open(self.hosts, "a+", encoding="utf-8") as hosts:
                hosts.seek(0)
                hosts.truncate()
                hosts.write("\n".join(lines) + "\n")


def sweep() -> list[str]:
    """Remove the pod networks whose executor is gone, and pod namespaces and bridges no network records; their tags."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with _locked():
        return _sweep()


def _sweep() -> list[str]:
    removed = []
    for folder in sorted(REGISTRY.iterdir()) if REGISTRY.is_dir() else []:
        if folder.is_dir() and not _owner_alive(folder / "owner"):
            remove_pod_network(folder)
            removed.append(folder.name)
    # a record is made before its bridge and namespaces and removed after them: one without a record was left behind
    for netns in sorted(NETNS.glob("ef*-*")) if NETNS.is_dir() else []:
        tag = netns.name[2:].partition("-")[0]
        if _TAG.fullmatch(tag) and not (REGISTRY / tag).is_dir():
            delete_netns(netns.name)
            removed.append(tag)
    for link in _ip("-o", "link", "show", "type", "bridge").splitlines():
        bridge = link.split(":")[1].strip()
        if bridge.startswith("efb") and _TAG.fullmatch(bridge[3:]) and not (REGISTRY / bridge[3:]).is_dir():
            with contextlib.suppress(PodNetworkError):
                _ip("link", "delete", bridge)
            removed.append(bridge[3:])
    return sorted(set(removed))


def hand_over(tag: str, pid: int) -> None:
    """Make process `pid` the owner of network `tag`: it lives as long as that daemon, past its maker's exit."""
    _write_owner(REGISTRY / tag, pid)


def remove_network(tag: str) -> None:
    """Remove network `tag` (its pods with their processes, its bridge, its record), whoever owns it."""
    if _TAG.fullmatch(tag) and (REGISTRY / tag).is_dir():
        remove_pod_network(REGISTRY / tag)


def _write_owner(folder: Path, pid: int) -> None:
    """Record `pid` (with its start time: a reused pid is no owner) as the network's owner; whole or not at all."""
    draft = folder / f".owner.{os.getpid()}"
    draft.write_text(f"{pid} {start_time(pid) or ''}", encoding="utf-8")
    draft.replace(folder / "owner")


def _owner_alive(owner: Path) -> bool:
    try:
        pid_text, _, started = owner.read_text(encoding="utf-8").partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False  # a record cut short: its executor died while writing it
    return start_time(pid) == started.strip() and bool(started.strip())


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of POD_RANGE that no interface here, no route and no other run's network uses."""
    used: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = _routed()
    listed = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False)
    for line in listed.stdout.splitlines():
        words = line.split()
        if "inet" in words:
            with contextlib.suppress(ValueError):
                used.add(ipaddress.ip_interface(words[words.index("inet") + 1]).network)
    for record in REGISTRY.glob("*/subnet"):
        with contextlib.suppress(OSError, ValueError):
            used.add(ipaddress.ip_network(record.read_text(encoding="utf-8").strip()))
    for subnet in POD_RANGE.subnets(new_prefix=24):
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise PodNetworkError(
        f"every /24 of {POD_RANGE} is in use on this machine (an address, a route or another run's pod network); "
        "end other runs with nodes, or remove the routes into it (ip route show table all)"
    )


def _routed() -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The destinations of the IPv4 routes of every routing table, default routes aside (they cover every address).

    A route that covers a pod's address (a VPN's, say) may take the host's packets for the pod elsewhere than to
    the bridge: a longer prefix does, and so does any route of a table that a rule consults first.
    """
    listed = json.loads(_ip("-j", "-4", "route", "show", "table", "all") or "[]")
    routed: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
    for route in listed:
        destination = route.get("dst", "default")
        if destination != "default":
            with contextlib.suppress(ValueError):
                routed.add(ipaddress.ip_network(destination, strict=False))
    return routed


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(REGISTRY / ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done.stdout
