"""The serving fleet on this machine: what a workflow's serving objects run as, for the run's lifetime.

A workflow applies a fleet's objects with Argo resource templates (the flagship's: eksflow/llm/serving/objects.py).
Importing this module registers LocalFleet as a run service of the local executor (eksflow/local/services.py) for
their kinds (FLEET_KINDS; eksflow/llm/serving/__init__.py imports it, so every pipeline using the rollout has it): the
executor makes a LocalFleet with each run, hands it each applied object and stops it when the run ends. The fleet
does here what the cluster would do:

- apps/v1 Deployment of vLLM (`python3 -m vllm.entrypoints.openai.api_server ...`): the interpreter of vLLM's
  virtualenv (eksflow.llm.engines), its args and env, container paths (whole values) mapped to the run's volumes
  (fleet_inputs.py); it resolves the adapters published to the FSx adapter folder by name, as every pod does. On this
  machine: one engine on 127.0.0.1 whatever spec.replicas says (every pod serves the same adapters from the same
  folder, so one stands for all), on a port of the run's engine ports; a run may run several vLLM Deployments (a
  champion's and a candidate's), up to a cap (engine_ports.py). Or the engine $EKSFLOW_VLLM_URL names, which one
  Deployment adopts (adopted_engine.py). On simulated nodes (`run --nodes N`): spec.replicas
  pods, spread over the nodes (fleet_nodes.py). The task succeeds when the engine answers a real generation (the
  pod's readiness probe), as Argo's successCondition waits for an available Deployment.
- apps/v1 Deployment of the LiteLLM proxy (`litellm --config ...`): the proxy's virtualenv ($EKSFLOW_LITELLM) in
  the folder its ConfigMap volume maps to, holding the ConfigMap's files unchanged (config.yaml and the routes
  callback); it routes by the routes file on the run's FSx volume, as every proxy pod does, to the engines this
  fleet runs only ($EKSFLOW_UPSTREAMS: the run's engine ports, its engines started before or after the proxy). The
  proxy is new with the run, so a routes file an earlier run left (naming that run's engine) is removed first. Its
  task succeeds once it answers /health/liveliness; it is ready, as its pod's readiness probe would say, once the
  run routes the public name to an engine (serve-champion), and refuses the name (503) until then.
- v1 Service: an address. A whole argv value (`--vllm-url=http://x.ns.svc.cluster.local:8000`, a path after it
  allowed) or env value naming a Service becomes http://127.0.0.1:<port of the process it selects>, or on
  simulated nodes the Service's address on the run's bridge (eksflow/local/service_proxy.py); free text is never
  rewritten.
- v1 ConfigMap: its files, written where the Deployment that mounts it looks. v1 Secret keys: the run's random
  values (fleet_inputs.py). policy/v1 PodDisruptionBudget: nothing to protect.
- networking.k8s.io/v1 NetworkPolicy: recorded (`policies`, its spec in logs/networkpolicy-<name>.log), not enforced:
  that takes the cluster's CNI. Every process listens on 127.0.0.1 or its pod's address only, and vLLM asks for
  its key on every route.

A resource template's `delete` of one of these objects does what the cluster does: a Deployment's pods end as
`stop()` ends them (SIGTERM, then SIGKILL; on simulated nodes its pods are removed) and leave the endpoints of its
Services; a Service's address closes, its endpoints list empties; a ConfigMap or NetworkPolicy is forgotten. One the
run does not hold is no error, as Argo's `kubectl delete --ignore-not-found`: the task says it found none.

The engines its Deployments need are made ready beside the run's first tasks, side by side (installed once per
machine where missing, checked against their locks where not: engine_supply.py); one that cannot be stops the run
in one line then, not after training, and a Deployment whose engine is still being installed waits for it. One run
at a time holds a pipeline's fleet in a state folder, and one run at a time runs local vLLM engines on a machine;
another waits, saying which run holds them (fleet_locks.py). A process that dies before it is ready fails its task
with its log's error line.

Every process runs in its own session, is told to the run's watchdog (it is stopped if the executor dies), and is
stopped (SIGTERM, then SIGKILL) by `stop()`, which the executor calls when the run ends, after the exit handler:
succeeded, failed or interrupted. A resumed run applies the fleet's objects again, with every task after them
(services.restarted). Which process a Deployment's pod is, and its readiness probes: fleet_pods.py and
fleet_process.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eksflow.llm.serving import adopted_engine, engine_supply, fleet_endpoints, fleet_pods, fleet_process
from eksflow.llm.serving.adopted_engine import ADOPT_ENV, RESOLVER_DIR_ENV, adopted_url
from eksflow.llm.serving.engine_ports import EnginePorts
from eksflow.llm.serving.fleet_endpoints import Endpoint
from eksflow.llm.serving.fleet_inputs import ContainerInputs
from eksflow.llm.serving.fleet_locks import FleetLocks
from eksflow.llm.serving.fleet_nodes import Replicas
from eksflow.llm.serving.fleet_pods import FleetError
from eksflow.llm.serving.fleet_process import FleetProcess, wait_ready
from eksflow.llm.serving.objects import MODEL_LABEL
from eksflow.llm.steps.common import vllm_process
from eksflow.llm.steps.common.litellm_proxy import VLLM_KEY_ENV
from eksflow.llm.steps.common.litellm_routes import ROUTES_FILE_ENV, UPSTREAMS_ENV
from eksflow.llm.steps.common.vllm import ENGINE_MODULE as VLLM_MODULE
from eksflow.local import (
    NodesContext,
    PathRules,
    PlacedPod,
    ProcessTracker,
    ServiceProxy,
    container_requests,
    map_argv,
    map_env,
    register_run_service,
)
from eksflow.runtime.ports import free_port

FLEET_KINDS = {
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
}
_GRACE_S = 15.0


def check(manifest: Mapping[str, Any], where: str) -> None:
    """Refuse, before the run starts, a Deployment that is neither vLLM nor LiteLLM. Raises FleetError."""
    if manifest.get("kind") == "Deployment":
        fleet_pods.role(fleet_pods.container(manifest, where), where)


@dataclass
class LocalFleet:
    """The serving objects of one run, as local processes and addresses."""

    state_dir: Path
    run_dir: Path
    cwd: Path
    tracker: ProcessTracker | None = None  # the run's watchdog learns of each process (stopped if the executor dies)
    _processes: dict[str, FleetProcess] = field(default_factory=dict)
    # name -> (port, selector, port name)
    _services: dict[str, tuple[int, dict[str, str], str]] = field(default_factory=dict)
    _service_proxies: dict[str, ServiceProxy] = field(default_factory=dict)  # with simulated nodes: name -> address
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)  # NetworkPolicies applied, by name
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self._inputs = ContainerInputs(self.state_dir, self.run_dir)
        self._locks = FleetLocks(self.state_dir, self.run_dir, engine_supply.tell)
        self._ports = EnginePorts()  # reserved when first needed: making a fleet starts nothing

    # -- applying objects ----------------------------------------------------------------------------------

    def apply(
        self,
        manifest: Mapping[str, Any],
        where: str,
        stop_reason: Callable[[], str],
        *,
        nodes: NodesContext | None = None,
    ) -> str:
        """Do what applying `manifest` does on a cluster (on the simulated nodes, given); the task's message.

        Raises FleetError.
        """
        kind = manifest.get("kind")
        name = str((manifest.get("metadata") or {}).get("name", ""))
        if not name:
            raise FleetError(f"{where}.metadata.name is required", retriable=False)
        self._locks.fleet(manifest, where, stop_reason)  # the pipeline's fleet here is this run's (waited for)
        program = self._engine(manifest, where, stop_reason, nodes) if kind == "Deployment" else ""
        with self._lock:
            if kind == "ConfigMap":
                files = self._inputs.config_maps[name] = {
                    str(k): str(v) for k, v in (manifest.get("data") or {}).items()
                }
                return f"ConfigMap {name}: {len(files)} key(s) for the Deployments that mount it"
            if kind == "Service":
                spec = manifest.get("spec") or {}
                first = (spec.get("ports") or [{}])[0]
                selector = {str(k): str(v) for k, v in (spec.get("selector") or {}).items()}
                port = int(first.get("port", 0))
                self._services[name] = (port, selector, str(first.get("name", "")))
                if nodes is None:
                    self._refresh_endpoints()
                    return f"Service {name}:{port}: a local address, http://127.0.0.1:<port of the process it selects>"
                if name not in self._service_proxies:
                    self._service_proxies[name] = ServiceProxy(name, nodes.cluster.network.gateway)
                self._refresh_endpoints()
                return f"Service {name}:{port}: {self._service_proxies[name].url}, to the ready pods it selects"
            if kind == "PodDisruptionBudget":
                return f"PodDisruptionBudget {name}: no evictions happen on this machine; nothing to protect"
            if kind == "NetworkPolicy":
                self.policies[name] = dict(manifest)
                listens = "on its pods' addresses, which only the run's bridge reaches," if nodes else "on 127.0.0.1"
                note = (
                    f"NetworkPolicy {name}: recorded, not enforced here (enforcing it needs the cluster's CNI); "
                    f"the fleet listens {listens} and vLLM asks for its key on every route"
                )
                log = self.run_dir / "logs" / f"networkpolicy-{name}.log"  # not the same-named Deployment's log
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "a", encoding="utf-8") as out:
                    out.write(f"{note}\n{json.dumps(manifest.get('spec') or {}, sort_keys=True)}\n")
                return note
            if name in self._processes and self._processes[name].alive():
                return f"Deployment {name} is already running here: unchanged"
            process = self._start(manifest, name, where, nodes, program)
        note = wait_ready(process, stop_reason, where, self.run_dir)
        self._refresh_endpoints()  # ready: its Services list it (on simulated nodes each pod's readiness did already)
        return note

    def _engine(
        self, manifest: Mapping[str, Any], where: str, stop_reason: Callable[[], str], nodes: NodesContext | None
    ) -> str:
        """The program of the Deployment's engine, waited for outside the fleet's lock (other tasks go on meanwhile).

        A GPU ask and a vLLM engine beyond the cap are refused at once, not after waiting; then a vLLM engine on this
        machine holds the machine's local engines for the run (fleet_locks.py).
        """
        container = fleet_pods.container(manifest, where)
        role = fleet_pods.role(container, where)
        if gpus := fleet_pods.gpu_request(container):
            raise FleetError(
                f"{where}: the Deployment asks for {gpus} nvidia.com/gpu; the local fleet runs vLLM's CPU build "
                "(eksflow.llm.engines): use serving.instance_type=m6i.4xlarge here, or submit to a cluster",
                retriable=False,
            )
        if role == "vllm":
            self._check_room(str(manifest["metadata"]["name"]), where, nodes)
        if role == "vllm" and adopted_url():
            return ""  # it runs already: the fleet adopts it
        if role == "vllm" and nodes is None:
            self._locks.engine(where, stop_reason)
        return engine_supply.program(role, stop_reason, where)

    def _check_room(self, name: str, where: str, nodes: NodesContext | None) -> None:
        """FleetError (not retried) for a vLLM engine this machine cannot add (engine_ports.py: the cap).

        On simulated nodes each Deployment has its own pods, placed by their requests; an adopted engine
        ($EKSFLOW_VLLM_URL) is one engine, so one Deployment adopts it.
        """
        adopter = next((p.name for p in self._processes.values() if p.role == "vllm" and p.name != name), "")
        if nodes is None and not adopted_url():
            self._ports.check(name, where)
        elif nodes is None and adopter:
            raise FleetError(
                f"{where}: ${ADOPT_ENV} names one engine, which Deployment {adopter} adopted; Deployment {name} "
                f"needs its own: unset {ADOPT_ENV} to start each vLLM Deployment's engine",
                retriable=False,
            )

    def _start(
        self, manifest: Mapping[str, Any], name: str, where: str, nodes: NodesContext | None, program: str
    ) -> FleetProcess:
        container = fleet_pods.container(manifest, where)
        role = fleet_pods.role(container, where)
        if role == "vllm":
            self._check_room(name, where, nodes)  # again under the fleet's lock: two tasks may apply engines at once
        template = (manifest.get("spec") or {}).get("template") or {}
        labels = {str(k): str(v) for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()}
        paths = self._inputs.mounts(template.get("spec") or {}, container, name)
        # Every value that is a container path as a whole, alone or after `--flag=` (as the old per-value rule).
        args = map_argv(["", *(str(a) for a in container.get("args") or [])], paths, PathRules(None, None))[1:]
        env = map_env(self._container_env(container, where).items(), paths, PathRules(None, None))
        log = self.run_dir / "logs" / f"fleet-{name}.log"
        model = next((a.split("=", 1)[1] for a in args if a.startswith("--served-model-name=")), "")
        if role == "vllm" and adopted_url():
            if nodes is not None:
                raise FleetError(
                    f"{where}: ${ADOPT_ENV} names an engine of this machine, and on simulated nodes the Deployment's "
                    f"pods run their own: unset {ADOPT_ENV}, or run without --nodes",
                    retriable=False,
                )
            adopted_engine.share_adapters(env.get(RESOLVER_DIR_ENV, ""), where)
            process = self._adopt(name, labels, args, log)
            self._processes[name] = process
            return process
        if nodes is not None:  # the container's port on the pod's own address
            port, host = fleet_pods.container_port(container), "0.0.0.0"  # the pod's own interfaces
        else:
            port, host = (self._ports.take(name, where) if role == "vllm" else free_port()), "127.0.0.1"
        args = [a for a in args if not a.startswith(("--port=", "--host="))] + [f"--port={port}", f"--host={host}"]
        scratch = ""
        if role == "vllm":
            argv = [program, "-m", VLLM_MODULE, *args]
            scratch = vllm_process.scratch_folder()
            env = vllm_process.engine_process_env(env, program, scratch)  # the key middleware, from this eksflow
            cwd = self.cwd
        else:
            cwd = self._inputs.write_config_maps(template.get("spec") or {}, name)
            argv = [program, *args]
            # The engines this fleet runs, whatever the cluster's pattern of fleet Services says: the ports of its
            # engines, started or not yet (engine_ports.py), or the adopted one, or on simulated nodes a Service of
            # this run (only they listen on the run's bridge address, in whatever order the run applies them). A
            # routes file left by an earlier run names that run's engine, which is gone or someone else's by now:
            # this proxy is new, so its routes start empty, as a new fleet's.
            if nodes is not None:
                env[UPSTREAMS_ENV] = re.escape(f"http://{nodes.cluster.network.gateway}:") + "[0-9]+"
            elif adopted_url():
                env[UPSTREAMS_ENV] = re.escape(f"http://127.0.0.1:{adopted_engine.adopted_port()}")
            else:
                env[UPSTREAMS_ENV] = self._ports.upstreams()
            model = labels.get(MODEL_LABEL, "")
            _remove_leftover(Path(env.get(ROUTES_FILE_ENV, "")))
        full_env = {**os.environ, **env, "HF_HUB_OFFLINE": "1"}
        process = FleetProcess(name, role, None, port, labels, log, model, env.get("VLLM_API_KEY", ""))
        process.routes = (env.get(ROUTES_FILE_ENV, ""), env.get(UPSTREAMS_ENV, ""))
        process.scratch = scratch
        self._processes[name] = process
        if nodes is None:
            process.log_start = log.stat().st_size if log.exists() else 0  # a resumed run's process appends
            process.popen = fleet_pods.spawn(argv, cwd, full_env, log, self.tracker)
            return process

        def start_pod(pod: PlacedPod) -> subprocess.Popen[bytes]:
            pod_log = log.with_name(f"fleet-{pod.name}.log")
            return fleet_pods.spawn(
                [*pod.network.enter(nodes.cluster.hosts), *argv], cwd, full_env, pod_log, self.tracker
            )

        def changed() -> None:
            self._refresh_endpoints()
            nodes.pods_changed(replicas.documents())

        replicas = Replicas(
            nodes.cluster, name, role, count=int((manifest.get("spec") or {}).get("replicas", 1)), port=port,
            requests=container_requests(container.get("resources")), start_pod=start_pod, stop_pod=self._end,
            ready=lambda url: fleet_pods.ready(process.role, url, process.model, process.api_key), changed=changed,
        )  # fmt: skip
        process.replicas = replicas
        replicas.start()
        return process

    def _container_env(self, container: Mapping[str, Any], where: str) -> dict[str, str]:
        """The container's env, its Secrets' keys as the run's values."""
        # An adopted engine has its own key: the run's Secret carries it to the steps and the proxy, whichever of the
        # engine's and the proxy's Deployments (both read it as VLLM_API_KEY) is applied first.
        given = {VLLM_KEY_ENV: adopted_engine.adopted_key()} if adopted_url() else {}
        return self._inputs.env(container, where, given)

    def _end(self, popen: subprocess.Popen[bytes]) -> None:
        fleet_pods.end(popen, self.tracker, _GRACE_S)

    def _adopt(self, name: str, labels: dict[str, str], args: Sequence[str], log: Path) -> FleetProcess:
        """The engine at $EKSFLOW_VLLM_URL (checked once it answers: fleet_process.wait_ready)."""
        wanted = next((a.split("=", 1)[1] for a in args if a.startswith("--model=")), "")
        return FleetProcess(
            name, "vllm", None, adopted_engine.adopted_port(), labels, log, "", adopted_engine.adopted_key(), wanted
        )

    # -- what steps see ------------------------------------------------------------------------------------

    def local_value(self, value: str) -> str:
        """`value` with a Service address replaced by the local one, when the whole value is such an address.

        Accepted: http(s)://<service>[.<namespace>[.svc[.cluster.local]]]:<service port>[/path].
        """
        scheme, sep, rest = value.partition("://")
        if scheme not in ("http", "https") or not sep:
            return value
        host, colon, port_and_path = rest.partition(":")
        port_text, slash, path = port_and_path.partition("/")
        name, *domain = host.split(".")
        if not colon or (len(domain) > 1 and domain[1:] not in (["svc"], ["svc", "cluster", "local"])):
            return value
        with self._lock:
            service = self._services.get(name)
            if service is None or port_text != str(service[0]):
                return value
            if name in self._service_proxies:
                return f"{self._service_proxies[name].url}{slash}{path}"
            port = self._selected_port(service[1])
        return value if port is None else f"http://127.0.0.1:{port}{slash}{path}"

    def local_argv(self, argv: Sequence[str]) -> list[str]:
        """Each `--name=<address>` or bare `<address>` item mapped by `local_value`; nothing else touched."""
        mapped = []
        for item in argv:
            flag, sep, value = item.partition("=")
            local = f"{flag}={self.local_value(value)}" if sep and flag.startswith("--") else self.local_value(item)
            mapped.append(local)
        return mapped

    def task_env(self) -> dict[str, str]:
        """Nothing: the steps reach the fleet through their arguments (addresses, the routes file on FSx)."""
        return {}

    def delete(self, manifest: Mapping[str, Any], where: str) -> str:
        """Do what deleting the object `manifest` names does on a cluster (see the module); the task's message."""
        kind = str(manifest.get("kind"))
        name = str((manifest.get("metadata") or {}).get("name", ""))
        process, proxy = None, None
        with self._lock:
            if kind == "Deployment" and (process := self._processes.pop(name, None)) is not None:
                gone = f"Deployment {name}: deleted, its {process.role} pod(s) stopped"
            elif kind == "Service" and (service := self._services.pop(name, None)) is not None:
                proxy = self._service_proxies.pop(name, None)
                fleet_endpoints.write(self.run_dir, name, service[2], [])  # its EndpointSlices go with it
                gone = f"Service {name}: deleted, its address closed"
            elif kind == "ConfigMap" and self._inputs.config_maps.pop(name, None) is not None:
                gone = f"ConfigMap {name}: deleted (the pods that mount it keep their files)"
            elif kind == "NetworkPolicy" and self.policies.pop(name, None) is not None:
                gone = f"NetworkPolicy {name}: deleted"
            elif kind == "PodDisruptionBudget":
                gone = f"PodDisruptionBudget {name}: deleted; no evictions happen here, so it protected nothing"
            else:
                return f"{kind} {name}: not found in this run, nothing to delete (Argo deletes with --ignore-not-found)"
        if proxy is not None:
            proxy.close()
        if process is not None:
            fleet_process.stop([process], self._end)
            self._refresh_endpoints()  # out of the Services that selected it
            lost = self._ports.give_back(name) if process.role == "vllm" else ""  # held for the next engine
            gone = "; ".join(filter(None, [gone, lost]))
        return gone

    def stop(self) -> None:
        """Stop every process the fleet started (SIGTERM, SIGKILL after the grace); delete the run's keys."""
        with self._lock:
            processes = list(self._processes.values())
            self._processes.clear()
            proxies, self._service_proxies = list(self._service_proxies.values()), {}
        for proxy in proxies:
            proxy.close()
        fleet_process.stop(processes, self._end)
        self._ports.close()
        self._inputs.delete_secrets()
        self._locks.release()

    # -- helpers -------------------------------------------------------------------------------------------

    def _refresh_endpoints(self) -> None:
        """Each Service's endpoints: the pods of the Deployments it selects, in the run folder for the steps.

        On the simulated nodes its address sends connections to the ready ones (fleet_endpoints.py: the list).
        """
        with self._lock:
            for name, (_, selector, port_name) in self._services.items():
                endpoints = [
                    endpoint
                    for process in self._processes.values()
                    if _selects(selector, process.labels)
                    for endpoint in _endpoints(process)
                ]
                if name in self._service_proxies:
                    self._service_proxies[name].set_endpoints([(e.address, e.port) for e in endpoints if e.ready])
                fleet_endpoints.write(self.run_dir, name, port_name, endpoints)

    def _selected_port(self, selector: Mapping[str, str]) -> int | None:
        for process in self._processes.values():
            if _selects(selector, process.labels):
                return process.port
        return None


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a Service's selector picks a pod of these labels (an empty one picks none, as for endpoints)."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _endpoints(process: FleetProcess) -> list[Endpoint]:
    """A Deployment's pods as endpoints: each replica on the simulated nodes, else its one process on this machine."""
    if process.replicas is not None:
        return process.replicas.endpoints()
    return [Endpoint(process.name, socket.gethostname(), "127.0.0.1", process.port, process.alive())]


def _remove_leftover(routes_file: Path) -> None:
    """Remove the routes file an earlier run's proxy routed by (a folder in its place is the hook's to report)."""
    if routes_file.name and (routes_file.is_symlink() or routes_file.is_file()):
        routes_file.unlink()


register_run_service(FLEET_KINDS, LocalFleet, check, engine_supply.prepare)
