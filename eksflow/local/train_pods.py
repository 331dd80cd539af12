"""A TrainJob's pods as the Trainer's JobSet runs them: one per node, torchrun in each, node 0's hosting the rendezvous.

Without simulated nodes every pod is a process on this host: PET_MASTER_ADDR is 127.0.0.1 and PET_MASTER_PORT a
free port (node 0's pod name and the Trainer's port 29500 exist only on the cluster). On simulated nodes
(`run --nodes N`) each pod goes to a node of its own (the default spread: fewest pods of the job first), within
one domain of the topology level its template asks for (topology_domains.py: a required level no domain holds
keeps the job Pending, with the reason), in its own network namespace with its node's address; the run's
/etc/hosts gives it its name and its FQDN under the JobSet's headless Service, `<trainjob>-node-0-<i>.<trainjob>`,
so PET_MASTER_ADDR resolves to node 0's pod, where torchrun's agent hosts the rendezvous store on port 29500 and the
others meet it.
Each pod gets NODE_NAME and the run's record of lost nodes, as a RayJob's do (eksflow.runtime.nodes).

Node 0's pod runs as the task's own process: its output is the task's log (the other pods' are in the task's
pods/ folder), and the step's rank 0, which writes the checkpoints and the outputs on the shared volume, is there
(torchrun gives node 0 the first ranks).

Failure is the JobSet's: the torch-distributed runtime gives it no failurePolicy, so the first of its node Jobs to
fail fails the JobSet (maxRestarts 0), the JobSet controller deletes the other pods, and the Trainer marks the
TrainJob Failed; Argo's retry then creates a new TrainJob, which resumes from the newest checkpoint. Here a pod
that ends with an error, or whose node is lost, fails the attempt at once and every other pod is deleted with it:
a lost node's peers would otherwise wait in a collective for packets that never come. The retry's pods go to the
nodes left and a replacement for the lost one (as Karpenter adds one for pods left Pending). Not modelled: a node
Job's own pod restarts before it fails (its backoffLimit), which a static torchrun rendezvous does not survive
anyway.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from eksflow.errors import EXIT_FAILED, EksflowError
from eksflow.local.ray_pods import Reap, Spawn
from eksflow.local.resources import TrainLayout
from eksflow.local.sim_nodes import PlacedPod, SimulatedCluster
from eksflow.local.trainjob import MASTER_PORT
from eksflow.runtime.nodes import LOST_NODES_ENV, NODE_NAME_ENV
from eksflow.runtime.ports import free_port

_WATCH_S = 0.5
_PEER_END_S = 60.0  # how long the other pods get to end once node 0's has succeeded
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
ROLE = "node"  # every pod's role in status.json: the replicated job's name


class TrainPodsError(EksflowError):
    """The TrainJob's pods could not start; the message says which and why."""

    label = "train pods error"
    exit_code = EXIT_FAILED


@dataclass
class _Pod:
    rank: int  # PET_NODE_RANK: its Job's completion index
    placed: PlacedPod | None  # its place on a simulated node; None: a process on this host
    proc: subprocess.Popen[bytes] | None = None  # None for node 0's, which the task runs itself
    log: IO[bytes] | None = None
    deleted: bool = False  # deleted with the TrainJob's failure: its sandbox gone, its node still there


class TrainPods:
    """The node pods of one TrainJob attempt; `close` ends them and says which one failed the TrainJob, if any."""

    def __init__(
        self,
        layout: TrainLayout,
        cluster: SimulatedCluster | None,
        *,
        logs: Path,
        spawn: Spawn,
        reap: Reap,
        changed: Callable[[list[dict[str, str]]], None],
        pod_env: Callable[[str], Mapping[str, str]] = lambda pod: {},
    ) -> None:
        if not _DNS_LABEL.fullmatch(layout.name) or len(layout.name) > 50:
            raise TrainPodsError(
                f"the TrainJob's name {layout.name[:80]!r} is not a DNS label its pods' names can start"
            )
        self.layout = layout
        self.cluster = cluster
        self.logs = logs
        self._spawn = spawn
        self._reap = reap
        self._changed = changed
        self._pod_env = pod_env  # by pod name: what else the Trainer injects (its status endpoint's variables)
        self._lock = threading.Lock()
        self._pods: list[_Pod] = []
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self.failure = ""  # the pod that failed the TrainJob, and how ("" while none has)

    def start(self, argv: list[str], env: Mapping[str, str]) -> list[str]:
        """Create every pod (within the job's topology domain, if confined) and start those of nodes 1..; node 0's argv.

        `env` is the trainer container's environment (what a pod process starts from); node 0's own PET_* are in
        `node_env(0)`.
        """
        name = self.layout.name
        self._port = MASTER_PORT if self.cluster is not None else free_port()
        for rank in range(self.layout.nodes):
            host = self.pod_name(rank)
            placed = None
            if self.cluster is not None:
                placed = self.cluster.create_pod(name, ROLE, self.layout.requests, host, (f"{host}.{name}",))
            pod = _Pod(rank, placed)
            with self._lock:
                self._pods.append(pod)
            if rank:
                self.logs.mkdir(parents=True, exist_ok=True)
                pod.log = open(self.logs / f"{host}.log", "ab")  # noqa: SIM115 (closed when the pod ends)
                pod.proc = self._spawn([*self._enter(pod), *argv], {**env, **self.node_env(rank)}, pod.log)
        self._changed(self.documents())
        self._watcher = threading.Thread(target=self._watch, name=f"trainpods-{name}", daemon=True)
        self._watcher.start()
        return [*self._enter(self._pods[0]), *argv]

    def pod_name(self, rank: int) -> str:
        """Pod `rank`'s name and host name, as the JobSet names it: `<job>-node-0-<rank>` (replicated job 0)."""
        return f"{self.layout.name}-{ROLE}-0-{rank}"

    def node_env(self, rank: int) -> dict[str, str]:
        """What the Trainer (torch plugin, `pod_env`) and, on simulated nodes, the downward API set in pod `rank`."""
        pod = self._pods[rank]
        name = self.layout.name
        env = {
            **self._pod_env(self.pod_name(rank)),
            "PET_NNODES": str(self.layout.nodes),
            "PET_NPROC_PER_NODE": self.layout.procs_per_node,
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": f"{self.pod_name(0)}.{name}" if pod.placed else "127.0.0.1",
            "PET_MASTER_PORT": str(self._port),
        }
        if pod.placed is not None and self.cluster is not None:
            env.update({NODE_NAME_ENV: pod.placed.node, LOST_NODES_ENV: str(self.cluster.lost_record)})
        return env

    def documents(self) -> list[dict[str, str]]:
        """The pods now on simulated nodes, node 0's first, as status.json lists them."""
        with self._lock:
            return [pod.placed.document() for pod in self._pods if pod.placed is not None]

    def close(self, succeeded: bool) -> str:
        """End every pod once node 0's task process has ended; why another pod failed the TrainJob ("" if none did).

        After node 0's success (`succeeded`) the others get their time to end their own way; after its failure the
        JobSet fails and deletes them at once.
        """
        self._closing.set()
        if self._watcher is not None:
            self._watcher.join()
        with self._lock:
            pods, self._pods = self._pods, []
        for pod in pods[1:]:
            if pod.proc is not None and succeeded and not self.failure:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pod.proc.wait(_PEER_END_S)  # their agents' exit barrier and teardown
                self._check(pod)
        for pod in pods:
            if pod.placed is not None and self.cluster is not None:
                if not pod.deleted and not pod.placed.network.exists():  # its sandbox went on its own: its node did
                    self.cluster.lose(pod.placed.node)
                self.cluster.delete_pod(pod.placed)
            if pod.proc is not None:
                self._reap(pod.proc)
            if pod.log is not None:
                pod.log.close()
        self._changed(self.documents())
        return self.failure

    def _enter(self, pod: _Pod) -> list[str]:
        if pod.placed is None or self.cluster is None:
            return []
        return pod.placed.network.enter(self.cluster.hosts)

    def _watch(self) -> None:
        """Fail the TrainJob at the first pod that fails, as the JobSet does: every pod is deleted with it."""
        while not self._closing.wait(_WATCH_S):
            with self._lock:
                pods = list(self._pods)
            if any(self._check(pod) for pod in pods):
                for pod in pods:
                    if pod.placed is not None and self.cluster is not None and pod.placed.network.exists():
                        pod.deleted = True
                        self.cluster.delete_pod(pod.placed)  # node 0's task process goes with its pod
                return

    def _check(self, pod: _Pod) -> bool:
        """Whether `pod` has failed (its process ended with an error, or its node is lost); the first sets failure."""
        host = self.pod_name(pod.rank)
        how = ""
        if pod.placed is not None and not pod.placed.network.exists():
            how = "its node was lost"
        elif pod.proc is not None and pod.proc.poll() not in (None, 0):
            how = f"exit code {pod.proc.returncode} (see {self.logs / host}.log)"
        if how and not self.failure:
            where = f" on {pod.placed.node}" if pod.placed else ""
            self.failure = f"the TrainJob failed: pod {host}{where}: {how}"
        return bool(how)
