"""A real Slurm on this machine: munge, slurmctld, slurmd on one node or several, and slurmrestd, idempotently.

    python scripts/local_slurm.py up [--nodes N]   # install (as root, with apt-get) and start; prints the URL
    python scripts/local_slurm.py lose NODE        # a node lost: its processes killed, its address gone, set DOWN
    python scripts/local_slurm.py down             # stop every daemon it started, remove the nodes
    make slurm-up [NODES=N] / make slurm-down

Debian 12's packages (Slurm 22.05: slurmctld, slurmd, slurmrestd, munge, slurm-client) are installed with apt-get
when missing, as root. Everything else stays in one folder ($EKSFLOW_SLURM_DIR, default .eksflow/slurm): its own
munge key and socket, a JWT key, slurm.conf, state, logs and pid files; nothing is written to /etc, so the
machine's own Slurm or munge, if any, is left alone. Every Slurm command finds the cluster through
SLURM_CONF=<folder>/slurm.conf.

With one node (the default) this host is the node: its short host name, at 127.0.0.1, with all its CPUs. With
N > 1 every node is a simulated one, as Slinky's slurmd pods are (eksflow.local.pod_network, root with iproute2):
slurm-node-1 .. N, each slurmd in a network namespace of its own with its own address (its NodeAddr), host name and
an N-th of the CPUs, on a bridge whose address (198.18.X.1) is slurmctld's; the network is handed over to slurmctld
and removed with it (or by the next network's sweep once slurmctld is gone). `lose` takes a node away as a reclaimed
instance goes and sets it DOWN, as slurmctld would once it stopped answering: its job is requeued; `up` again
starts its replacement (the same name and address, as a NodeSet's pod), which ReturnToService=2 puts back.
Partition `debug`, jobs requeued on failure (JobRequeue=1), finished jobs kept for an hour (MinJobAge) so their
end state can be read.
slurmrestd speaks openapi/v0.0.38 with JWT authentication on 127.0.0.1 only; it runs as `nobody` (it refuses
root), and the token (`scontrol token`, user root, valid a day) is written to <folder>/token, mode 0600, and to
<state>/secrets/eksflow-slurm/token ($EKSFLOW_STATE_DIR, default .eksflow), where a local run's Slurm task reads
the Secret it mounts. `up` prints the `--set` flags that point a run at this cluster.

Where Slurm cannot run (not root, no apt-get, a container without the privileges slurmd needs) `up` exits 3 with
the reason on one line; tests that need Slurm skip with it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from eksflow.local.pod_network import (
    Pod,
    PodNetwork,
    PodNetworkError,
    hand_over,
    remove_network,
    unavailable,
)
from eksflow.local.watchdog import kill_netns, started_at

PACKAGES = ("slurmctld", "slurmd", "slurmrestd", "munge", "slurm-client")
BINARIES = ("munged", "slurmctld", "slurmd", "slurmrestd", "scontrol", "sinfo")
CTLD_PORT, SLURMD_PORT, REST_PORT = 16817, 16818, 16820
API_VERSION = "v0.0.38"
TOKEN_SECRET = "eksflow-slurm"  # cluster.slurm.token_secret's default
EXIT_UNAVAILABLE = 3
MAX_NODES = 16
CRED_EXPIRE_S = 20
# The daemon each pid file of the folder is for (slurmd-<node>.pid: slurmd), by the file's name.
_DAEMONS = {"munged.pid": "munged", "slurmctld.pid": "slurmctld", "slurmrestd.pid": "slurmrestd"}
_CLOCK_SLACK_S = 1.0  # /proc/stat's boot time is in whole seconds: a start time read from it is up to 1 s late


class UnavailableError(Exception):
    """Slurm cannot run on this machine; the message says why."""


def folder() -> Path:
    """Where this cluster keeps everything."""
    return Path(os.environ.get("EKSFLOW_SLURM_DIR", ".eksflow/slurm")).resolve()


def rest_url() -> str:
    """slurmrestd's address."""
    return f"http://127.0.0.1:{os.environ.get('EKSFLOW_SLURM_REST_PORT', REST_PORT)}"


def install() -> None:
    """Debian's Slurm and munge packages, unless every daemon is already on the PATH."""
    if all(shutil.which(b) for b in BINARIES):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise UnavailableError("Slurm is not installed and installing it needs root with apt-get (Debian's slurm-wlm)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, stdout=subprocess.DEVNULL)


@dataclass(frozen=True)
class Node:
    """A slurmd's node: its name and address, and its pod (None: this host itself)."""

    name: str
    address: str
    pod: Pod | None = None


@dataclass(frozen=True)
class Layout:
    """The cluster's nodes, slurmctld's address, and the pod network's tag and hosts file (with several nodes)."""

    nodes: list[Node]
    controller: str
    network: str = ""
    hosts: str = ""

    def save(self, root: Path) -> None:
        record = {
            "nodes": [
                {"name": n.name, "address": n.address, "netns": n.pod.netns if n.pod else ""} for n in self.nodes
            ],
            "controller": self.controller,
            "network": self.network,
            "hosts": self.hosts,
        }
        (root / "nodes.json").write_text(json.dumps(record, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, root: Path) -> Layout | None:
        try:
            record = json.loads((root / "nodes.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        nodes = [
            Node(n["name"], n["address"], Pod(n["name"], n["netns"], n["address"]) if n["netns"] else None)
            for n in record["nodes"]
        ]
        return cls(nodes, record["controller"], record["network"], record["hosts"])


def layout(root: Path, count: int) -> Layout:
    """The running cluster's layout when it has `count` nodes; else a new one (several nodes: a new pod network)."""
    current = Layout.load(root)
    if current is not None and running(root / "slurmctld.pid"):
        if len(current.nodes) != count:
            raise UnavailableError(
                f"the local Slurm runs {len(current.nodes)} node(s), not {count}: `make slurm-down` first"
            )
        return current
    if current is not None and current.network:  # slurmctld is gone: so are its nodes
        remove_network(current.network)
    if count == 1:
        return Layout([Node(socket.gethostname().split(".")[0], "127.0.0.1")], "127.0.0.1")
    if why := unavailable():
        raise UnavailableError(f"{count} nodes: {why}")
    network = PodNetwork()
    pods = [network.add(f"slurm-node-{i + 1}") for i in range(count)]
    nodes = [Node(pod.name, pod.address, pod) for pod in pods]
    return Layout(nodes, network.gateway, network.tag, str(network.hosts))


def write_config(root: Path, cluster: Layout) -> Path:
    """Keys (once), slurm.conf (every time: the host's name and CPUs may change); returns slurm.conf."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # slurmrestd, as nobody, reads slurm.conf here; the keys stay private (0400, 0600)
    closed = [str(p) for p in (root, *root.parents) if not p.stat().st_mode & 0o001]
    if closed:
        raise UnavailableError(
            f"slurmrestd runs as nobody and cannot reach {root / 'slurm.conf'} ({closed[0]} is closed to others): "
            "set EKSFLOW_SLURM_DIR to a folder whose parents others may enter"
        )
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    munge_key, jwt_key = root / "munge" / "munge.key", root / "jwt.key"
    for key, size in ((munge_key, 1024), (jwt_key, 32)):
        if not key.exists():
            key.write_bytes(secrets.token_bytes(size))
            key.chmod(0o400 if key == munge_key else 0o600)
    host = socket.gethostname().split(".")[0]
    cpus = max((os.cpu_count() or 1) // len(cluster.nodes), 1)  # a node's share of this machine
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=eksflow",
                f"SlurmctldHost={host}({cluster.controller})",
                f"SlurmctldPort={os.environ.get('EKSFLOW_SLURM_CTLD_PORT', CTLD_PORT)}",
                f"SlurmdPort={os.environ.get('EKSFLOW_SLURM_SLURMD_PORT', SLURMD_PORT)}",
                "AuthType=auth/munge",
                # cred_expire is also how long a requeued job waits before it may start again (120 s by default)
                f"AuthInfo=socket={root / 'munge' / 'munge.socket'},cred_expire={CRED_EXPIRE_S}",
                "AuthAltTypes=auth/jwt",
                f"AuthAltParameters=jwt_key={jwt_key}",
                "CredType=cred/munge",
                "ProctrackType=proctrack/linuxproc",  # no cgroup delegation needed (containers, CI)
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                # a requeued job is started within seconds of its hold's end, not at the next minute's pass
                "SchedulerParameters=sched_interval=5",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"StateSaveLocation={root / 'state'}",
                # per node (%n): several slurmd share this folder
                f"SlurmdSpoolDir={root / 'spool' / '%n'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'spool' / '%n' / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
                "MinJobAge=3600",
                "JobRequeue=1",
                "ReturnToService=2",
                *(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN" for n in cluster.nodes),
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        ),
        encoding="utf-8",
    )
    return conf


def daemon_pid(pid_file: Path) -> int | None:
    """The pid `pid_file` names while that process is still its daemon; None otherwise.

    A pid file outlives its daemon (a crash, `kill -9`, a reboot) and pids are reused, and whoever can write the
    folder can name any process in one, which `down` would signal as root. So a pid counts only when the file is a
    plain file of ours (not a link), the process runs the daemon (its argv[0], or on a pod node the command
    enter_pod.py runs after `--`), and it started no later than the file was written: a daemon writes its pid file
    once it runs, where a process that got the pid since started after.
    """
    name = _DAEMONS.get(pid_file.name) or ("slurmd" if pid_file.name.startswith("slurmd-") else "")
    try:
        facts = pid_file.lstat()
        if not stat.S_ISREG(facts.st_mode) or facts.st_uid != os.geteuid():
            return None
        pid = int(pid_file.read_text(encoding="utf-8").strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    commands = [argv[0], *(argv[i + 1] for i, word in enumerate(argv[:-1]) if word == b"--")]
    started = started_at(pid)
    if not name or name.encode() not in {os.path.basename(c) for c in commands} or started is None:
        return None
    return pid if started <= facts.st_mtime + _CLOCK_SLACK_S else None


def running(pid_file: Path) -> bool:
    """True when the pid file names its daemon, alive (`daemon_pid`)."""
    return daemon_pid(pid_file) is not None


def slurmd_pid_file(root: Path, node: Node) -> Path:
    """Where the pid of the node's slurmd is kept (on a pod node: of the process holding the pod, whose PID 1 it is)."""
    return root / f"slurmd-{node.name}.pid"


def start(root: Path, conf: Path, cluster: Layout) -> None:
    """Start each daemon that is not running."""
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge = root / "munge"
    if not running(munge / "munged.pid"):
        subprocess.run(
            ["munged", f"--key-file={munge / 'munge.key'}", f"--socket={munge / 'munge.socket'}",
             f"--pid-file={munge / 'munged.pid'}", f"--log-file={root / 'log' / 'munged.log'}",
             f"--seed-file={munge / 'munged.seed'}", "--force"],
            check=True,
        )  # fmt: skip
    if not running(root / "slurmctld.pid"):
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env)
    if cluster.network:
        hand_over(cluster.network, wait_pid(root / "slurmctld.pid"))
    for node in cluster.nodes:
        (root / "spool" / node.name).mkdir(parents=True, exist_ok=True)
        pid_file = slurmd_pid_file(root, node)
        if running(pid_file):
            continue
        enter: list[str] = []
        if node.pod is not None:
            node.pod.connect()  # a lost node's replacement: the same name and address
            enter = node.pod.enter(Path(cluster.hosts))
        with open(root / "log" / f"slurmd-{node.name}.out", "ab") as log:
            # -D, in the foreground: on a pod node it is the pod's PID 1, whose exit ends the pod
            slurmd = subprocess.Popen(
                [*enter, "slurmd", "-D", "-f", str(conf), "-N", node.name],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        pid_file.write_text(str(slurmd.pid))
    if not running(root / "slurmrestd.pid"):
        port = rest_url().rsplit(":", 1)[1]
        with open(root / "log" / "slurmrestd.log", "ab") as log:
            rest = subprocess.Popen(
                ["slurmrestd", "-f", str(conf), "-a", "rest_auth/jwt", "-u", "nobody", "-g", "nogroup",
                 "-s", f"openapi/{API_VERSION}", f"127.0.0.1:{port}"],
                env={**env, "SLURM_JWT": "daemon"}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        (root / "slurmrestd.pid").write_text(str(rest.pid))


def wait_pid(pid_file: Path, timeout_s: float = 30) -> int:
    """The pid a daemon writes to `pid_file` once it has forked away."""
    deadline = time.monotonic() + timeout_s
    while not running(pid_file):
        if time.monotonic() > deadline:
            raise UnavailableError(f"no daemon wrote {pid_file} within {timeout_s:.0f} s; see its log")
        time.sleep(0.1)
    return int(pid_file.read_text().strip())


def wait_ready(root: Path, conf: Path, timeout_s: float = 60) -> str:
    """Wait for every node to be up and slurmrestd to answer; write and return the token file."""
    env = {**os.environ, "SLURM_CONF": str(conf)}
    deadline = time.monotonic() + timeout_s
    while True:
        sinfo = ["sinfo", "-h", "-N", "-o", "%N %T"]
        listed = subprocess.run(sinfo, check=False, env=env, capture_output=True, text=True).stdout.split("\n")
        states = dict(line.split() for line in listed if len(line.split()) == 2)
        if states and all(state.rstrip("*") in ("idle", "mixed", "allocated") for state in states.values()):
            break
        for node, state in states.items():
            if state.startswith(("down", "drain")):
                resume = ["scontrol", "update", f"nodename={node}", "state=resume"]
                subprocess.run(resume, check=False, env=env, capture_output=True)
        if time.monotonic() > deadline:
            shown = ", ".join(f"{node} {state}" for node, state in states.items()) or "no answer"
            raise UnavailableError(f"the nodes did not come up (sinfo: {shown}); see {root / 'log'}")
        time.sleep(1)
    out = subprocess.run(
        ["scontrol", "token", "username=root", "lifespan=86400"], env=env, capture_output=True, text=True, check=True
    ).stdout
    token_file = root / "token"
    token_file.write_text(out.strip().split("=", 1)[1])
    token_file.chmod(0o600)
    while True:
        request = urllib.request.Request(
            f"{rest_url()}/slurm/{API_VERSION}/ping",
            headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token_file.read_text()},
        )
        try:
            with urllib.request.urlopen(request, timeout=5):
                return str(token_file)
        except (urllib.error.URLError, OSError) as err:
            if time.monotonic() > deadline:
                why = f"slurmrestd at {rest_url()} does not answer ({err}); see {root / 'log'}"
                raise UnavailableError(why) from err
            time.sleep(0.5)


def up(count: int) -> None:
    """Install if needed, start what is not running (a lost node's replacement too), print where the cluster is."""
    if os.geteuid() != 0:
        raise UnavailableError("a local Slurm runs its daemons as root here (slurmd, munged): run as root")
    install()
    root = folder()
    root.mkdir(parents=True, exist_ok=True)
    cluster = layout(root, count)
    cluster.save(root)
    conf = write_config(root, cluster)
    start(root, conf, cluster)
    token_file = wait_ready(root, conf)
    # Where a local run reads the Secret its Slurm task mounts (eksflow.local: <state>/secrets/<Secret name>).
    secret = Path(os.environ.get("EKSFLOW_STATE_DIR", ".eksflow")).resolve() / "secrets" / TOKEN_SECRET
    secret.mkdir(parents=True, exist_ok=True)
    secret.chmod(0o700)
    shutil.copyfile(token_file, secret / "token")
    (secret / "token").chmod(0o600)
    print(f"SLURM_CONF={conf}")
    print(f"EKSFLOW_SLURM_URL={rest_url()}")
    print(f"EKSFLOW_SLURM_TOKEN_FILE={token_file}")
    print(f"EKSFLOW_SLURM_NODES={','.join(f'{n.name}@{n.address}' for n in cluster.nodes)}")
    print(
        f"run with: --set cluster.launcher=slurm --set cluster.slurm.url={rest_url()} "
        f"--set cluster.slurm.api_version={API_VERSION} --set cluster.slurm.user=root"
        + (f" --set cluster.nodes={count}" if count > 1 else ""),
        file=sys.stderr,
    )


def lose(name: str) -> None:
    """Node `name` lost: every process on it killed, its address gone, and DOWN (its jobs requeued)."""
    root = folder()
    cluster = Layout.load(root)
    node = next((n for n in cluster.nodes if n.name == name), None) if cluster else None
    if cluster is None or node is None or node.pod is None:
        names = [n.name for n in cluster.nodes if n.pod] if cluster else []
        raise UnavailableError(f"no simulated node {name!r} in {root}; the nodes: {', '.join(names) or 'none'}")
    kill_netns(node.pod.netns)  # slurmd, its slurmstepd and every task
    node.pod.disconnect()
    slurmd_pid_file(root, node).unlink(missing_ok=True)
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    # What slurmctld does itself once the node misses SlurmdTimeout (300 s): the drill does not wait for it.
    down_node = ["scontrol", "update", f"nodename={name}", "state=down", "reason=node lost"]
    subprocess.run(down_node, check=True, env=env, capture_output=True)
    print(f"{name} ({node.address}) lost and DOWN; `up` starts its replacement", file=sys.stderr)


def down() -> None:
    """Stop every daemon this folder's pid files name (slurmrestd, the slurmd, slurmctld, munged); remove the nodes.

    A pid file that names no longer its daemon (`daemon_pid`) is removed, and its process left alone.
    """
    root = folder()
    cluster = Layout.load(root)
    nodes = [slurmd_pid_file(root, n) for n in cluster.nodes] if cluster else list(root.glob("slurmd-*.pid"))
    for pid_file in (root / "slurmrestd.pid", *nodes, root / "slurmctld.pid", root / "munge" / "munged.pid"):
        pid = daemon_pid(pid_file)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while running(pid_file) and time.monotonic() < deadline:
                time.sleep(0.2)
        elif pid_file.is_file() and not pid_file.is_symlink():
            named = pid_file.read_text(encoding="utf-8", errors="replace").strip()[:20]
            print(f"{pid_file} names {named!r}, which is not its daemon now: nothing signalled", file=sys.stderr)
        pid_file.unlink(missing_ok=True)
    if cluster is not None and cluster.network:
        remove_network(cluster.network)
    (root / "nodes.json").unlink(missing_ok=True)


def main() -> int:
    """`up`, `lose` or `down`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "lose", "down"))
    parser.add_argument("node", nargs="?", help="lose: the node's name (slurm-node-N)")
    parser.add_argument("--nodes", type=int, default=1, choices=range(1, MAX_NODES + 1), metavar=f"1..{MAX_NODES}")
    args = parser.parse_args()
    if (args.command == "lose") != (args.node is not None):
        parser.error("a node's name goes with `lose`, and only with it")
    try:
        if args.command == "up":
            up(args.nodes)
        elif args.command == "lose":
            lose(args.node)
        else:
            down()
    except (UnavailableError, PodNetworkError) as err:
        print(f"local Slurm unavailable: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
