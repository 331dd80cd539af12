"""A serving Deployment's pod as the local fleet runs it: its process record, and the wait for its readiness.

The pod's readiness probe, polled as the kubelet would: a real generation for vLLM, /health/liveliness for the
proxy (fleet_pods.ready); an adopted engine ($EKSFLOW_VLLM_URL) is first asked which model it serves. A process that
dies before it is ready is named by its log's error line. `stop` ends pods, for the run's end and a delete alike.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from eksflow.llm.serving import adopted_engine, fleet_pods
from eksflow.llm.serving.adopted_engine import ADOPT_ENV
from eksflow.llm.serving.fleet_nodes import Replicas
from eksflow.llm.serving.fleet_pods import FleetError
from eksflow.llm.steps.common.litellm_routes import unrouted


@dataclass
class FleetProcess:
    """A Deployment's pod on this machine: its process (or its replicas on the simulated nodes), address and log."""

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
    replicas: Replicas | None = None  # with simulated nodes: its pods (fleet_nodes.py), and no popen
    log_start: int = 0  # the size of its log when it started: what it wrote comes after

    def alive(self) -> bool:
        """Still running (an adopted engine counts as running: its owner stops it)."""
        if self.replicas is not None:
            return self.replicas.alive()
        return self.popen is None or self.popen.poll() is None


def wait_ready(process: FleetProcess, stop_reason: Callable[[], str], where: str, run_dir: Path) -> str:
    """Poll like the pod's readiness probe: a real generation (vLLM) or /health/liveliness (proxy)."""
    if (replicas := process.replicas) is not None:
        took = replicas.wait_available(stop_reason, where, lambda pod: process.log.with_name(f"fleet-{pod}.log"))
        state = f"started; {_routed(process)}" if process.role == "litellm" else "ready"
        pods = ", ".join(f"{p.pod.name} on {p.pod.node} ({replicas.url(p)})" for p in replicas.pods())
        return f"{process.role} {process.name}: {replicas.count} pod(s) {state} after {took:.0f} s: {pods}"
    base = f"http://127.0.0.1:{process.port}"
    started = time.monotonic()
    while not stop_reason():
        if not process.alive():
            code = process.popen.returncode if process.popen else None
            said = fleet_pods.error_line(fleet_pods.log_since(process.log, process.log_start)) or "(no output)"
            raise FleetError(f"{process.name} exited with code {code} before it was ready: {said}; log {process.log}")
        if process.role == "vllm" and not process.model:  # adopted: which model does it serve?
            process.model = adopted_engine.served_model(base, process.api_key, process.wanted, where)
            ready = False
        else:
            ready = fleet_pods.ready(process.role, base, process.model, process.api_key)
        if ready:
            owner = f"pid {process.popen.pid}" if process.popen else f"adopted from ${ADOPT_ENV}"
            # The proxy's task waits for it to start, not for its readiness: that needs routes, which the
            # rollout's steps write only after this task (objects.proxy_deployment).
            state = f"started; {_routed(process)}" if process.role == "litellm" else "ready"
            return (
                f"{process.role} {process.name} on 127.0.0.1:{process.port} ({owner}) {state} after "
                f"{time.monotonic() - started:.0f} s; log: {process.log.relative_to(run_dir)}"
            )
        time.sleep(1.0)
    raise FleetError(f"{where}: {stop_reason()} while {process.name} was starting")


def stop(stopped: Sequence[FleetProcess], end: Callable[[subprocess.Popen[bytes]], None]) -> None:
    """End each process's pods: SIGTERM, then `end` (SIGKILL after the grace); an adopted engine is its owner's."""
    processes = [p.popen for p in stopped if p.popen is not None]
    for process in stopped:
        if process.replicas is not None:
            process.replicas.close()  # its pods end, are removed from their nodes and leave their Services
    for popen in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
    for popen in processes:  # all told at once: the grace runs for all of them together
        end(popen)  # the watchdog forgets it
    for process in stopped:
        if process.scratch:
            shutil.rmtree(process.scratch, ignore_errors=True)


def _routed(proxy: FleetProcess) -> str:
    """Whether the proxy is ready: its readiness probe's verdict on its routes (steps/common/litellm_routes.py)."""
    why, _ = unrouted(proxy.model, *proxy.routes)
    if not why:
        return f"ready: it routes {proxy.model!r} to this run's engines"
    return f"not ready, and it refuses {proxy.model!r} (503) until the run routes it to its engine ({why})"
