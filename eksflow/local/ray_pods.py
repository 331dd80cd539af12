"""A RayJob on simulated nodes, as KubeRay runs it: a head pod, worker pods joining it, the entrypoint on the head.

KubeRay starts each pod's Ray container with `ray start --block`: `--head` on the head, `--address=<head>:6379` on
a worker, the group's rayStartParams as `--key=value` options, and num-cpus from the container's CPU where the
params do not give it. Once the head answers, the job's entrypoint runs against it (KubeRay's submitter hands it
to the head's job manager, so the driver runs on the head). Here the same commands run in pods of the run's
simulated nodes (sim_nodes.py): num-cpus is the pod's CPU request within its node's share, and the entrypoint
runs in the head pod with RAY_ADDRESS set.

KubeRay keeps each worker group at its replicas: a worker pod that ends while the job runs (its node lost, its
`ray start` killed) is replaced by a new pod, on a new node when its own is gone (as Karpenter provisions one
for a pod left Pending). Ray Train then restarts its worker group from the last committed checkpoint.

Every Ray process is keyed and fenced: a token made for the job (Ray's token authentication, RAY_AUTH_MODE=token)
is in each pod's and the entrypoint's environment, never on a command line, and Ray listens on the pods'
addresses, which only the run's bridge reaches. The pods end with the job: their processes killed, their
namespaces removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from eksflow.errors import EXIT_FAILED, EksflowError
from eksflow.local.pod_network import PodNetworkError, join
from eksflow.local.resources import LocalJob, RayGroup
from eksflow.local.sim_nodes import PlacedPod, SimulatedCluster
from eksflow.runtime.nodes import LOST_NODES_ENV, NODE_NAME_ENV

GCS_PORT = 6379
DASHBOARD_PORT = 8265
_HEAD_WAIT_S = 120.0
_WATCH_S = 0.5

Spawn = Callable[[list[str], Mapping[str, str], IO[bytes]], "subprocess.Popen[bytes]"]
Reap = Callable[["subprocess.Popen[bytes]"], int]


class RayPodsError(EksflowError):
    """The Ray cluster's pods could not start; the message says which and why."""

    label = "ray pods error"
    exit_code = EXIT_FAILED


@dataclass
class _Running:
    pod: PlacedPod
    group: RayGroup
    proc: subprocess.Popen[bytes]
    log: IO[bytes]


class RayPods:
    """The head and worker pods of one RayJob attempt; `close` ends them."""

    def __init__(
        self,
        cluster: SimulatedCluster,
        job_name: str,
        job: LocalJob,
        *,
        env: Mapping[str, str],
        logs: Path,
        spawn: Spawn,
        reap: Reap,
        changed: Callable[[list[dict[str, str]]], None],
    ) -> None:
        self.cluster = cluster
        self.job_name = job_name
        self.groups = job.ray_groups
        self.base_env = dict(env)
        self.token = secrets.token_hex(32)
        self.logs = logs
        self._spawn = spawn
        self._reap = reap
        self._changed = changed
        self._lock = threading.Lock()
        self._pods: list[_Running] = []
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self.replaced: list[str] = []  # "pod on node -> pod on node" for every worker pod replaced
        self.head: PlacedPod | None = None

    def exec_in_head(self) -> list[str]:
        """The argv prefix that runs a command in the head pod (the entrypoint, as the job's driver)."""
        with self._lock:
            head = next(r for r in self._pods if r.pod is self.head)
        return join(head.proc.pid)

    @property
    def address(self) -> str:
        """The head's GCS address, as RAY_ADDRESS takes it."""
        assert self.head is not None
        return f"{self.head.address}:{GCS_PORT}"

    def env(self, group_env: Mapping[str, str]) -> dict[str, str]:
        """A pod process's environment: the run's, its container's, the job's Ray token and the head's addresses."""
        assert self.head is not None
        return {
            **self.base_env,
            **group_env,
            # the entrypoint runs in the head pod: its node (the downward API's spec.nodeName) and temporary folder
            NODE_NAME_ENV: self.head.node,
            "TMPDIR": str(pod_temp(self.head) / "tmp"),
            LOST_NODES_ENV: str(self.cluster.lost_record),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ADDRESS": self.address,  # as KubeRay sets it in every Ray container: the `ray` CLI finds the head
            # Ray Train's placement-group cleaner polls the state API; without this it looks for a local cluster
            "RAY_API_SERVER_ADDRESS": f"http://{self.head.address}:{DASHBOARD_PORT}",
        }

    def start(self, group_envs: Mapping[str, Mapping[str, str]]) -> None:
        """Start the head, wait until it answers, then start every worker; RayPodsError if the head does not."""
        head_group, *worker_groups = self.groups
        self._group_envs = group_envs
        self.cluster.replace_lost()  # Karpenter: a node for pods a lost one would have taken (an earlier attempt's)
        running = self._start_pod(head_group)
        deadline = time.monotonic() + _HEAD_WAIT_S
        while not _answers(running.pod.address, GCS_PORT):
            if running.proc.poll() is not None or time.monotonic() > deadline:
                raise RayPodsError(
                    f"the Ray head pod {running.pod.name} did not start (see {self.logs / running.pod.name}.log)"
                )
            time.sleep(0.2)
        for group in worker_groups:
            for _ in range(group.replicas):
                self._start_pod(group)
        self._watcher = threading.Thread(target=self._watch, name=f"raypods-{self.job_name}", daemon=True)
        self._watcher.start()
        self.cluster.add_drainer(self._drain)

    def close(self) -> None:
        """End every pod: its processes killed, the pod removed.

        No grace: the job has ended, its checkpoints and outputs are on the shared folder, and `ray start --block`
        stops its processes one by one when asked (about 34 s), where KubeRay's deletion would SIGKILL them too.
        """
        self._closing.set()
        self.cluster.remove_drainer(self._drain)
        if self._watcher is not None:
            self._watcher.join()
        with self._lock:
            pods, self._pods = self._pods, []
        for running in pods:
            if not running.pod.network.exists():  # its sandbox went without the pod ending: its node is gone
                self.cluster.lose(running.pod.node)
            self._end(running)

    def documents(self) -> list[dict[str, str]]:
        """The pods now running, as status.json lists them."""
        with self._lock:
            return [running.pod.document() for running in self._pods]

    def _start_pod(self, group: RayGroup) -> _Running:
        pod = self.cluster.create_pod(self.job_name, group.role, group.requests)
        if group.role == "head":
            self.head = pod
        temp = pod_temp(pod)
        shutil.rmtree(temp, ignore_errors=True)
        (temp / "tmp").mkdir(parents=True)
        argv = [*pod.network.enter(self.cluster.hosts), *self._ray_start(group, pod, temp)]
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{pod.name}.log", "ab")  # noqa: SIM115 (closed when the pod ends)
        try:
            env = {
                **self.env(self._group_envs.get(group.role, {})),
                NODE_NAME_ENV: pod.node,
                # what its processes leave in their temporary folder (multiprocessing's pymp-*) goes with the pod
                "TMPDIR": str(temp / "tmp"),
            }
            proc = self._spawn(argv, env, log)
        except BaseException:
            log.close()
            self.cluster.delete_pod(pod)
            raise
        running = _Running(pod, group, proc, log)
        with self._lock:
            self._pods.append(running)
        self._changed(self.documents())
        return running

    def _ray_start(self, group: RayGroup, pod: PlacedPod, temp: Path) -> list[str]:
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        params = dict(group.start_params)
        if "num-cpus" not in params:  # KubeRay: the container's CPU; here no more than its node has
            params["num-cpus"] = str(max(1, pod.requests.cpu_m // 1000))
        ours = [f"--node-ip-address={pod.address}", f"--temp-dir={temp}", "--disable-usage-stats", "--block"]
        if group.role == "head":
            ours += [
                "--head",
                f"--port={GCS_PORT}",
                f"--dashboard-host={pod.address}",
                f"--dashboard-port={DASHBOARD_PORT}",
            ]
        else:
            ours += [f"--address={self.address}"]
        return [ray, "start", *ours, *(f"--{key}={value}" for key, value in params.items())]

    def _watch(self) -> None:
        """Keep each worker group at its replicas while the job runs, as KubeRay does."""
        while not self._closing.wait(_WATCH_S):
            with self._lock:
                ended = [r for r in self._pods if r.group.role != "head" and r.proc.poll() is not None]
                for running in ended:
                    self._pods.remove(running)
            for running in ended:
                node = running.pod.node
                if not running.pod.network.exists():  # its sandbox went without the pod ending: its node is gone
                    self.cluster.lose(node)
                self._end(running)
                if self._closing.is_set():
                    return
                if self.cluster.is_lost(node):
                    self.cluster.replace_lost()
                replacement = self._start_pod(running.group)
                because = self.cluster.lost_because(node)
                self.replaced.append(
                    f"{running.pod.name} on {node}{f' ({because})' if because else ''} -> {replacement.pod.name} "
                    f"on {replacement.pod.node}"
                )

    def _drain(self, node: str) -> None:
        """A Spot notice for `node`, as Karpenter and kubelet act on it (the cluster's drainer: then the node goes).

        Each pod's preStop hook runs in the pod, then its `ray start` gets SIGTERM, and what is left when the grace
        is over is killed with the node's namespaces and addresses.
        """
        with self._lock:
            pods = [r for r in self._pods if r.pod.node == node]
        deadline = time.monotonic() + max((r.group.grace_s for r in pods), default=0.0)
        for running in pods:
            if running.group.pre_stop:
                with contextlib.suppress(OSError, subprocess.SubprocessError, PodNetworkError):
                    hook = [*join(running.proc.pid), *running.group.pre_stop]
                    subprocess.run(
                        hook, env=self.env(self._group_envs.get(running.group.role, {})), stdout=running.log,
                        stderr=subprocess.STDOUT, timeout=running.group.grace_s, check=False,
                    )  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                running.proc.terminate()
        for running in pods:
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.proc.wait(max(0.0, deadline - time.monotonic()))

    def _end(self, running: _Running) -> None:
        self._reap(running.proc)
        running.log.close()
        self.cluster.delete_pod(running.pod)
        shutil.rmtree(pod_temp(running.pod), ignore_errors=True)
        self._changed(self.documents())


def pod_temp(pod: PlacedPod) -> Path:
    """The pod's own folder: Ray's --temp-dir, and TMPDIR under it (Ray's socket paths must stay under 107 bytes)."""
    return Path(f"/tmp/{pod.network.netns}")


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
