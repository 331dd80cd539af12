"""The serving fleet on this machine: what a workflow's serving objects run as, for the run's lifetime.

A workflow applies a fleet's objects with Argo resource templates (the flagship's: eksflow/llm/serving/objects.py).
Importing this module registers LocalFleet as a run service of the local executor (eksflow/local/services.py) for
their kinds (FLEET_KINDS; eksflow/llm/serving/__init__.py imports it, so every pipeline using the rollout has it): the
executor makes a LocalFleet with each run, hands it each applied object and stops it when the run ends. The fleet
does here what the cluster would do:

- apps/v1 Deployment of vLLM (`python3 -m vllm.entrypoints.openai.api_server ...`): one engine process with the
  interpreter of vLLM's virtualenv (eksflow.llm.engines; $EKSFLOW_VLLM_PYTHON), its args and env, container paths (whole
  values) mapped to the run's volumes, listening on 127.0.0.1 only; it resolves the adapters published to the FSx
  adapter folder by name, as every pod does. One engine whatever spec.replicas says (the cluster's at least 2): every
  pod serves the same adapters from the same folder, so one stands for all. The task succeeds when the engine answers a
  real generation (the pod's readiness probe), as Argo's successCondition waits for an available pod. One engine per
  machine: two stall each other on 2 cores, so a second vLLM Deployment in one run is refused (a base-model change needs
  a cluster).
- apps/v1 Deployment of the LiteLLM proxy (`litellm --config ...`): a proxy process from the proxy's
  virtualenv ($EKSFLOW_LITELLM) in the folder its ConfigMap volume maps to, holding the ConfigMap's files unchanged
  (config.yaml and the routes callback); it routes by the routes file on the run's FSx volume, as every proxy
  pod does, to the engines this fleet runs only ($EKSFLOW_UPSTREAMS: its one engine's address, where the
  cluster's pods admit the pipeline's fleet Services). The proxy is new with the run, so a routes file an
  earlier run left (naming that run's engine) is removed before it starts. Its task succeeds once it answers
  /health/liveliness; it is ready, as its pod's readiness probe would say, once the run routes the public name
  to the engine (serve-champion), and refuses the name (503) until then.
- v1 Service: an address. A whole argv value (`--vllm-url=http://x.ns.svc.cluster.local:8000`, a path after
  it allowed) or env value naming a Service becomes http://127.0.0.1:<port of the process it selects>; free
  text is never rewritten.
- v1 ConfigMap: its files, written where the Deployment that mounts it looks. policy/v1 PodDisruptionBudget:
  nothing to protect.
- networking.k8s.io/v1 NetworkPolicy: recorded (`policies`, and its spec in logs/fleet-<name>.log), not enforced:
  that takes the cluster's CNI. Here every process listens on 127.0.0.1 only, and vLLM asks for its key on every
  route.
- $EKSFLOW_VLLM_URL (an engine already running on this machine, e.g. a test session's): the vLLM Deployment
  adopts it instead of starting a second engine, after checking that it serves the same base model folder; it is
  not stopped with the run. Its API key is $EKSFLOW_VLLM_API_KEY, its adapter folder $EKSFLOW_VLLM_ADAPTERS: the
  run's adapter folder becomes a link to it (adapters already published there move into it first), so what the
  run's steps publish is what the engine resolves.
- Secrets: each key a Deployment reads (env secretKeyRef) gets a random value for the run, written as a file to
  the run volume named after the Secret, which is where a step mounting that Secret (a volume of the same name)
  reads it. The files are deleted when the fleet stops.

Before a run starts anything, the engines its Deployments need are installed where they are missing (once per
machine, eksflow.llm.engines); one that cannot be is one line then, not after training.

Every process runs in its own session, is told to the run's watchdog (it is stopped if the executor dies), and is
stopped (SIGTERM, then SIGKILL) by `stop()`, which the executor calls when the run ends, after the exit handler:
succeeded, failed or interrupted. A resumed run applies the fleet's objects again, with every task after them
(services.restarted). Which process a Deployment's pod is, and its readiness probes: fleet_pods.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eksflow.llm import engines
from eksflow.llm.serving import fleet_pods
from eksflow.llm.serving.fleet_pods import FleetError
from eksflow.llm.serving.objects import MODEL_LABEL
from eksflow.llm.steps.common import vllm_process
from eksflow.llm.steps.common.litellm_proxy import VLLM_KEY_ENV
from eksflow.llm.steps.common.litellm_routes import ROUTES_FILE_ENV, UPSTREAMS_ENV, unrouted
from eksflow.llm.steps.common.vllm import ENGINE_MODULE as VLLM_MODULE
from eksflow.local import register_run_service
from eksflow.local.display import log_tail
from eksflow.local.model import PathRules
from eksflow.local.paths import PathMap, map_argv, map_env
from eksflow.local.process import ProcessTracker
from eksflow.runtime.ports import free_port

FLEET_KINDS = {
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
}
ADOPT_ENV = "EKSFLOW_VLLM_URL"  # an engine already running here that the run uses instead of its own
ADOPT_KEY_ENV = "EKSFLOW_VLLM_API_KEY"
ADOPT_ADAPTERS_ENV = "EKSFLOW_VLLM_ADAPTERS"  # the adopted engine's adapter folder (VLLM_LORA_RESOLVER_CACHE_DIR)
RESOLVER_DIR_ENV = "VLLM_LORA_RESOLVER_CACHE_DIR"
_GRACE_S = 15.0


def check(manifest: Mapping[str, Any], where: str) -> None:
    """Refuse, before the run starts, a Deployment that is neither vLLM nor LiteLLM. Raises FleetError."""
    if manifest.get("kind") == "Deployment":
        fleet_pods.role(fleet_pods.container(manifest, where), where)


def prepare(objects: Sequence[Mapping[str, Any]]) -> None:
    """Install the engines the run's Deployments need where they are missing, before anything runs (EngineError)."""
    deployments = [m for m in objects if m.get("kind") == "Deployment"]
    roles = {fleet_pods.role(fleet_pods.container(m, "Deployment"), "Deployment") for m in deployments}
    if os.environ.get(ADOPT_ENV):
        roles.discard("vllm")  # the adopted engine runs already
    engines.ensure(sorted(roles), say=lambda line: print(line, file=sys.stderr, flush=True))


@dataclass
class _Process:
    name: str
    role: str  # vllm | litellm
    popen: subprocess.Popen[bytes] | None  # None: an engine this fleet adopted ($EKSFLOW_VLLM_URL), not its own
    port: int
    labels: dict[str, str]
    log: Path
    model: str = ""  # vLLM: the served base model name, asked by the readiness check; LiteLLM: the public name
    api_key: str = ""  # vLLM: its VLLM_API_KEY
    wanted: str = ""  # an adopted engine: the base model folder it must serve
    routes: tuple[str, str] = ("", "")  # LiteLLM: its routes file and the engines it may route to (its env)
    scratch: str = ""  # vLLM: its temporary folder (vllm_process.scratch_folder), removed once it stopped

    def alive(self) -> bool:
        """Still running (an adopted engine counts as running: its owner stops it)."""
        return self.popen is None or self.popen.poll() is None


@dataclass
class LocalFleet:
    """The serving objects of one run, as local processes and addresses."""

    state_dir: Path
    run_dir: Path
    cwd: Path
    tracker: ProcessTracker | None = None  # the run's watchdog learns of each process (stopped if the executor dies)
    _processes: dict[str, _Process] = field(default_factory=dict)
    _services: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)  # name -> (port, selector)
    _config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)  # NetworkPolicies applied, by name
    _secrets: dict[tuple[str, str], str] = field(default_factory=dict)  # (Secret, key) -> this run's value
    _engine_port: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # -- applying objects ----------------------------------------------------------------------------------

    def apply(self, manifest: Mapping[str, Any], where: str, stop_reason: Callable[[], str]) -> str:
        """Do what applying `manifest` does on a cluster; returns the task's message. Raises FleetError."""
        kind = manifest.get("kind")
        name = str((manifest.get("metadata") or {}).get("name", ""))
        if not name:
            raise FleetError(f"{where}.metadata.name is required", retriable=False)
        with self._lock:
            if kind == "ConfigMap":
                self._config_maps[name] = {str(k): str(v) for k, v in (manifest.get("data") or {}).items()}
                return f"ConfigMap {name}: {len(self._config_maps[name])} key(s) for the Deployments that mount it"
            if kind == "Service":
                spec = manifest.get("spec") or {}
                port = int((spec.get("ports") or [{}])[0].get("port", 0))
                self._services[name] = (port, {str(k): str(v) for k, v in (spec.get("selector") or {}).items()})
                return f"Service {name}:{port}: a local address, http://127.0.0.1:<port of the process it selects>"
            if kind == "PodDisruptionBudget":
                return f"PodDisruptionBudget {name}: no evictions happen on this machine; nothing to protect"
            if kind == "NetworkPolicy":
                self.policies[name] = dict(manifest)
                note = (
                    f"NetworkPolicy {name}: recorded, not enforced here (enforcing it needs the cluster's CNI); "
                    "the fleet listens on 127.0.0.1 only and vLLM asks for its key on every route"
                )
                log = self.run_dir / "logs" / f"fleet-{name}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "a", encoding="utf-8") as out:
                    out.write(f"{note}\n{json.dumps(manifest.get('spec') or {}, sort_keys=True)}\n")
                return note
            if name in self._processes and self._processes[name].alive():
                return f"Deployment {name} is already running here: unchanged"
            process = self._start(manifest, name, where)
        return self._wait_ready(process, stop_reason, where)

    def _start(self, manifest: Mapping[str, Any], name: str, where: str) -> _Process:
        container = fleet_pods.container(manifest, where)
        role = fleet_pods.role(container, where)
        gpus = fleet_pods.gpu_request(container)
        if gpus:
            raise FleetError(
                f"{where}: the Deployment asks for {gpus} nvidia.com/gpu; the local fleet runs vLLM's CPU build "
                "(eksflow.llm.engines): use serving.instance_type=m6i.4xlarge here, or submit to a cluster",
                retriable=False,
            )
        if role == "vllm" and any(p.role == "vllm" and p.alive() for p in self._processes.values()):
            raise FleetError(
                f"{where}: a second vLLM engine would run on this machine; two engines stall each other, so one "
                "fleet (one base model) per local run: a base-model change rolls out on a cluster",
                retriable=False,
            )
        template = (manifest.get("spec") or {}).get("template") or {}
        labels = {str(k): str(v) for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()}
        paths = self._mounts(template.get("spec") or {}, container, name)
        # Every value that is a container path as a whole, alone or after `--flag=` (as the old per-value rule).
        args = map_argv(["", *(str(a) for a in container.get("args") or [])], paths, PathRules(None, None))[1:]
        env = map_env(
            self._env(container, where).items(),
            paths,
            PathRules(None, None),
        )
        log = self.run_dir / "logs" / f"fleet-{name}.log"
        model = next((a.split("=", 1)[1] for a in args if a.startswith("--served-model-name=")), "")
        if role == "vllm" and os.environ.get(ADOPT_ENV):
            _share_adapters(env.get(RESOLVER_DIR_ENV, ""), where)
            process = self._adopt(name, labels, args, log)
            self._processes[name] = process
            return process
        port = self.engine_port() if role == "vllm" else free_port()
        args = [a for a in args if not a.startswith(("--port=", "--host="))] + [f"--port={port}", "--host=127.0.0.1"]
        scratch = ""
        if role == "vllm":
            python = engines.command(engines.ENGINES["vllm"])
            argv = [python, "-m", VLLM_MODULE, *args]
            scratch = vllm_process.scratch_folder()
            env = vllm_process.engine_process_env(env, python, scratch)  # the key middleware, from this eksflow
            cwd = self.cwd
        else:
            cwd = self._proxy_folder(template.get("spec") or {}, name)
            argv = [engines.command(engines.ENGINES["litellm"]), *args]
            # The engines this fleet runs: its one engine (its own or the adopted one), whatever the cluster's
            # pattern of fleet Services says. A routes file left by an earlier run names that run's engine, which
            # is gone or someone else's by now: this proxy is new, so its routes start empty, as a new fleet's.
            env[UPSTREAMS_ENV] = re.escape(f"http://127.0.0.1:{self.engine_port()}")
            model = labels.get(MODEL_LABEL, "")
            _remove_leftover(Path(env.get(ROUTES_FILE_ENV, "")))
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv, cwd=cwd, env={**os.environ, **env, "HF_HUB_OFFLINE": "1"}, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,  # stopped as a group, spared Ctrl-C
            )  # fmt: skip
        if self.tracker is not None:
            self.tracker.started(f"fleet-{name}", popen.pid)
        process = _Process(name, role, popen, port, labels, log, model, env.get("VLLM_API_KEY", ""))
        process.routes = (env.get(ROUTES_FILE_ENV, ""), env.get(UPSTREAMS_ENV, ""))
        process.scratch = scratch
        self._processes[name] = process
        return process

    def _adopt(self, name: str, labels: dict[str, str], args: Sequence[str], log: Path) -> _Process:
        """The engine at $EKSFLOW_VLLM_URL (checked once it answers: `_wait_ready`)."""
        url = os.environ[ADOPT_ENV].rstrip("/")
        wanted = next((a.split("=", 1)[1] for a in args if a.startswith("--model=")), "")
        with self._lock:
            self._engine_port = int(url.rsplit(":", 1)[1])
        return _Process(
            name, "vllm", None, self._engine_port, labels, log, "", os.environ.get(ADOPT_KEY_ENV, ""), wanted
        )

    def _wait_ready(self, process: _Process, stop_reason: Callable[[], str], where: str) -> str:
        """Poll like the pod's readiness probe: a real generation (vLLM) or /health/liveliness (proxy)."""
        base = f"http://127.0.0.1:{process.port}"
        started = time.monotonic()
        while not stop_reason():
            if not process.alive():
                code = process.popen.returncode if process.popen else None
                tail = "\n".join(log_tail(process.log))
                raise FleetError(
                    f"{process.name} exited with code {code} before it was ready; log {process.log}:\n{tail}"
                )
            if process.role == "vllm" and not process.model:  # adopted: which model does it serve?
                self._check_adopted(process, base, where)
                ready = False
            elif process.role == "vllm":
                ready = fleet_pods.generates(base, process.model, process.api_key)
            else:
                ready = fleet_pods.status(f"{base}/health/liveliness") == 200
            if ready:
                owner = f"pid {process.popen.pid}" if process.popen else f"adopted from ${ADOPT_ENV}"
                # The proxy's task waits for it to start, not for its readiness: that needs routes, which the
                # rollout's steps write only after this task (objects.proxy_deployment).
                state = f"started; {_routed(process)}" if process.role == "litellm" else "ready"
                return (
                    f"{process.role} {process.name} on 127.0.0.1:{process.port} ({owner}) {state} after "
                    f"{time.monotonic() - started:.0f} s; log: {process.log.relative_to(self.run_dir)}"
                )
            time.sleep(1.0)
        raise FleetError(f"{where}: {stop_reason()} while {process.name} was starting")

    @staticmethod
    def _check_adopted(process: _Process, base: str, where: str) -> None:
        """Once the adopted engine answers /v1/models: it must serve the Deployment's base model folder."""
        models = fleet_pods.models(base, process.api_key)
        if models is None:
            return  # still starting, like a pod that is not ready yet
        card = next((m for m in models if not m.get("parent")), None)
        served = str((card or {}).get("root", ""))
        if Path(served).resolve() != Path(process.wanted).resolve():
            raise FleetError(
                f"{where}: {ADOPT_ENV}={base} serves {served!r}, the Deployment wants {process.wanted!r}; unset "
                f"{ADOPT_ENV} to start this run's own engine",
                retriable=False,
            )
        process.model = str((card or {}).get("id", ""))

    # -- what steps see ------------------------------------------------------------------------------------

    def engine_port(self) -> int:
        """The port of this run's (single) vLLM engine, chosen before it starts so the proxy can name it first."""
        with self._lock:
            if not self._engine_port:
                self._engine_port = (
                    int(os.environ[ADOPT_ENV].rsplit(":", 1)[1]) if os.environ.get(ADOPT_ENV) else free_port()
                )
            return self._engine_port

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

    def stop(self) -> None:
        """Stop every process the fleet started (SIGTERM, SIGKILL after the grace); delete the run's keys."""
        with self._lock:
            processes = [p for p in self._processes.values() if p.popen is not None]
            self._processes.clear()
        for process in processes:
            assert process.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + _GRACE_S
        for process in processes:
            assert process.popen is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(max(deadline - time.monotonic(), 0.1))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGKILL)  # the engine's core and worker processes too
            process.popen.wait()
            if process.scratch:
                shutil.rmtree(process.scratch, ignore_errors=True)
            if self.tracker is not None:
                self.tracker.ended(process.popen.pid)
        for secret, key in list(self._secrets):
            (self.run_dir / "volumes" / secret / key).unlink(missing_ok=True)

    # -- helpers -------------------------------------------------------------------------------------------

    def _selected_port(self, selector: Mapping[str, str]) -> int | None:
        for process in self._processes.values():
            if selector and all(process.labels.get(k) == v for k, v in selector.items()):
                return process.port
        return None

    def _secret(self, secret: str, key: str, value: str | None = None) -> str:
        """This run's value of a Secret key (random unless given), also written where a step mounts the Secret."""
        if (secret, key) not in self._secrets or value is not None:
            self._secrets[(secret, key)] = secrets.token_urlsafe(32) if value is None else value
            folder = self.run_dir / "volumes" / secret
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / key
            path.write_text(self._secrets[(secret, key)], encoding="utf-8")
            path.chmod(0o600)
        return self._secrets[(secret, key)]

    def _env(self, container: Mapping[str, Any], where: str) -> dict[str, str]:
        env = {}
        adopted = bool(os.environ.get(ADOPT_ENV))
        for i, var in enumerate(container.get("env") or []):
            name = str(var.get("name"))
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref is not None:
                # An adopted engine has its own key: the run's Secret carries it to the steps and the proxy, whichever
                # of the engine's and the proxy's Deployments (both read it as VLLM_API_KEY) is applied first.
                given = os.environ.get(ADOPT_KEY_ENV, "") if adopted and name == VLLM_KEY_ENV else None
                env[name] = self._secret(str(ref.get("name")), str(ref.get("key")), given)
            elif var.get("valueFrom") is not None:
                raise FleetError(f"{where} env[{i}] {name}: only values and secretKeyRef run locally", retriable=False)
            else:
                env[name] = str(var.get("value", ""))
        return env

    def _mounts(self, pod: Mapping[str, Any], container: Mapping[str, Any], name: str) -> PathMap:
        volumes = {str(v.get("name")): v for v in pod.get("volumes") or []}
        pairs = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(str(mount.get("name")), {})
            path = str(mount.get("mountPath", "")).rstrip("/")
            if "persistentVolumeClaim" in volume:
                host = self.state_dir / "volumes" / str(volume["persistentVolumeClaim"]["claimName"])
            elif "configMap" in volume:
                host = self.run_dir / "fleet" / name / "config"
            else:
                continue  # /dev/shm and other pod-scoped memory: the machine's own
            host.mkdir(parents=True, exist_ok=True)
            pairs.append((path, str(host)))
        return PathMap(pairs)

    def _proxy_folder(self, pod: Mapping[str, Any], name: str) -> Path:
        """Write the files of the ConfigMap the proxy mounts into the folder its volume maps to (`_mounts`)."""
        folder = self.run_dir / "fleet" / name / "config"
        mounted = [str((v.get("configMap") or {}).get("name")) for v in pod.get("volumes") or [] if "configMap" in v]
        missing = [m for m in mounted if m not in self._config_maps]
        if not mounted or missing:
            raise FleetError(f"the proxy {name} mounts ConfigMap {missing or '(none)'}, which was not applied first")
        folder.mkdir(parents=True, exist_ok=True)
        for config_map in mounted:
            for file_name, text in self._config_maps[config_map].items():
                (folder / file_name).write_text(text, encoding="utf-8")
        return folder


def _remove_leftover(routes_file: Path) -> None:
    """Remove the routes file an earlier run's proxy routed by (a folder in its place is the hook's to report)."""
    if routes_file.name and (routes_file.is_symlink() or routes_file.is_file()):
        routes_file.unlink()


def _routed(proxy: _Process) -> str:
    """Whether the proxy is ready: its readiness probe's verdict on its routes (steps/common/litellm_routes.py)."""
    why, _ = unrouted(proxy.model, *proxy.routes)
    if not why:
        return f"ready: it routes {proxy.model!r} to this run's engine"
    return f"not ready, and it refuses {proxy.model!r} (503) until the run routes it to its engine ({why})"


def _share_adapters(run_folder: str, where: str) -> None:
    """Make the run's adapter folder a link to the adopted engine's ($EKSFLOW_VLLM_ADAPTERS)."""
    engine_folder = Path(os.environ.get(ADOPT_ADAPTERS_ENV, ""))
    if not run_folder or not os.environ.get(ADOPT_ADAPTERS_ENV) or not engine_folder.is_dir():
        raise FleetError(
            f"{where}: adopting ${ADOPT_ENV} needs ${ADOPT_ADAPTERS_ENV}, the engine's adapter folder "
            f"({RESOLVER_DIR_ENV}), and the Deployment's {RESOLVER_DIR_ENV}; unset {ADOPT_ENV} to start the run's "
            "own engine",
            retriable=False,
        )
    folder = Path(run_folder)
    if folder.is_symlink() and folder.resolve() == engine_folder.resolve():
        return
    if folder.is_dir() and not folder.is_symlink():
        for published in folder.iterdir():
            if not (engine_folder / published.name).exists():
                os.replace(published, engine_folder / published.name)
        shutil.rmtree(folder)
    folder.unlink(missing_ok=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(engine_folder.resolve(), target_is_directory=True)


register_run_service(FLEET_KINDS, LocalFleet, check, prepare)
