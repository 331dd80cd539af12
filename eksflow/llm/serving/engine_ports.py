"""The ports of a run's local vLLM engines: reserved together, before any is known to be needed, and capped.

One run may run several vLLM Deployments on this machine (a champion's and a candidate's, or a candidate on a new
base model), each its own engine on its own port of 127.0.0.1. The proxy must be able to route to each of them and
to nothing else: its EKSFLOW_UPSTREAMS (steps/common/litellm_routes.py) is fixed when it starts, which may be before
a candidate's engine exists. So the first time the run needs an engine port (the proxy's start or an engine's), it
reserves a pool of MAX_ENGINES ports, and the proxy's UPSTREAMS lists exactly those: every address it may send a
request or the engines' key to is one of this run's.

Why that is safe: each port of the pool is held by a socket of this process, listening on 127.0.0.1 (SO_REUSEADDR,
so a port an engine just left in TIME_WAIT can be held again), from the reservation until an engine is started on
it, and again from the moment a deleted engine has ended until the run ends. While it is held no other process can
listen there, so no stranger can stand behind an address the proxy admits. The one gap is an engine's own start:
the hold ends just before its process starts and vLLM binds the port after its imports (seconds); a process of
this machine that took the port then would make the engine fail to start (its log's error line fails the task),
and the routes the rollout writes name an engine only once it answered a real generation with the run's key. A
held port takes connections into its backlog and never answers them: only a stranger would connect there.

The cap is a fixed MAX_ENGINES = 2, not a memory model: what a rollout needs at once is a champion's engine and a
candidate's (promote retires the old before the next candidate comes), and the figures a memory model would add up
are not this machine's: a Deployment's memory request is sized for the cluster's instance profile (m6i.4xlarge),
and vLLM's own resident memory beside its weights and VLLM_CPU_KVCACHE_SPACE was measured for one model only
(SmolLM2-135M with 1 GiB of KV cache: ~2.8 GiB an engine, its EngineCore 2.1 GiB and API server 0.65 GiB, two
engines in one run here). A third engine is refused in one line naming its Deployment; deleting one
(resource(..., action="delete")) frees its port.
"""

from __future__ import annotations

import re
import socket
import threading

from eksflow.llm.serving.fleet_pods import FleetError

MAX_ENGINES = 2  # a champion's engine and a candidate's, at once
LOOPBACK = "127.0.0.1"


class EnginePorts:
    """A run's engine ports: each held by this process, or lent to the Deployment whose engine runs on it."""

    def __init__(self, count: int = MAX_ENGINES) -> None:
        self._count = count
        self._held: dict[int, socket.socket] = {}  # port -> the socket holding it while no engine does
        self._lent: dict[int, str] = {}  # port -> the Deployment whose engine runs there
        self._ports: list[int] = []  # the pool, in reservation order, less a port lost to another process
        self._reserved = False  # the pool is reserved once, when first needed: the proxy's list never changes
        self._lock = threading.Lock()

    def upstreams(self) -> str:
        """EKSFLOW_UPSTREAMS for the run's proxy: the origin of every port of the pool, and nothing else."""
        ports = "|".join(str(port) for port in self._pool())
        return re.escape(f"http://{LOOPBACK}:") + f"(?:{ports})"

    def check(self, deployment: str, where: str) -> None:
        """FleetError (not retried) when the Deployment's engine would be one beyond the cap."""
        with self._lock:
            self._refuse_beyond_cap(deployment, where)

    def take(self, deployment: str, where: str) -> int:
        """The port the Deployment's engine starts on, no longer held (its own again when it is applied again)."""
        self._pool()
        with self._lock:
            self._refuse_beyond_cap(deployment, where)
            mine = [p for p, owner in self._lent.items() if owner == deployment]
            port = (mine or [p for p in self._ports if p not in self._lent])[0]
            self._lent[port] = deployment
            if (holder := self._held.pop(port, None)) is not None:
                holder.close()
            return port

    def give_back(self, deployment: str) -> str:
        """The Deployment's engine has ended: hold its port again for the next one; a line if it could not be held.

        A port another process took in the moment between the engine's end and the hold is never lent again.
        """
        with self._lock:
            port = next((p for p, owner in self._lent.items() if owner == deployment), None)
            if port is None:
                return ""
            del self._lent[port]
            try:
                self._held[port] = _hold(port)
            except OSError as err:
                self._ports.remove(port)
                return f"port {port} could not be held again ({err.strerror}): no engine of this run gets it"
            return ""

    def close(self) -> None:
        """Let every held port go (the run's end)."""
        with self._lock:
            for holder in self._held.values():
                holder.close()
            self._held.clear()

    def _pool(self) -> list[int]:
        with self._lock:
            if not self._reserved:
                self._reserved = True
                for _ in range(self._count):
                    holder = _hold(0)
                    port = int(holder.getsockname()[1])
                    self._held[port] = holder
                    self._ports.append(port)
            return list(self._ports)

    def _refuse_beyond_cap(self, deployment: str, where: str) -> None:
        cap = len(self._ports) if self._reserved else self._count  # a port lost to another process is not lent again
        if deployment in self._lent.values() or len(self._lent) < cap:
            return
        raise FleetError(
            f"{where}: Deployment {deployment} would be vLLM engine {len(self._lent) + 1} of this run; this machine "
            f"runs at most {cap} at once ({', '.join(sorted(self._lent.values()))} run): delete one first "
            '(resource(..., action="delete")) or roll this out on a cluster',
            retriable=False,
        )


def _hold(port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` (0: any free one), so no other process can listen there."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((LOOPBACK, port))
        holder.listen(1)
    except OSError:
        holder.close()
        raise
    return holder
