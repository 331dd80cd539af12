"""The fleet's replicas: every vLLM pod behind the fleet's Service, each addressed on its own by the endpoints.

A request through the fleet's Service reaches one pod (vllm RFC #12174): an adapter loaded or unloaded that way
changes that pod only. So the rollout addresses each replica at its own address, as the Service's endpoints list
them (its EndpointSlices, labelled kubernetes.io/service-name=<fleet>): a version is loaded on every ready replica
before any weight moves to it (load-candidate, serve-champion), checked on every one before it takes all traffic
(promote), and unloaded from every one after a rollback (finish-rollout), each replica checked on its own (GET
/v1/models at its address). The canary reads the same list before and after it measures, to tell a replica the
fleet lost from a candidate that failed (eksflow/llm/steps/canary/fleet.py).

Where the endpoints come from, in one document shape either way (an EndpointSliceList):
- a local run ($EKSFLOW_RUN_DIR): the file the local fleet keeps for each Service, fleet/endpoints/<service>.json in
  the run folder, rewritten whenever a pod starts, becomes ready, ends or goes with its node
  (eksflow/llm/serving/fleet_endpoints.py);
- a pod ($KUBERNETES_SERVICE_HOST): the Kubernetes API with the pod's service account (the pipeline's Role may
  list endpointslices: workflow-templates/cluster-prerequisites.yaml);
- neither, or no Service named (a step run by hand against one engine): the address given, as the one replica.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common import vllm_client
from eksflow.llm.steps.common.kube_api import ApiAccess, KubeApiError, get_json
from eksflow.llm.steps.common.vllm import ServingError
from eksflow.runtime.args import StepFailedError
from eksflow.runtime.rundir import local_run_dir

SERVICE_LABEL = "kubernetes.io/service-name"  # what the endpoints controller labels a Service's EndpointSlices with
SLICES_API = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"


@dataclass(frozen=True)
class Replica:
    """One pod of the fleet as its Service's endpoints list it: its pod, its node, its own address, whether ready."""

    pod: str  # "" when only the address is known (no Service to list)
    node: str
    url: str  # http://<pod address>:<port>
    ready: bool = True

    def describe(self) -> str:
        """`<pod> on node-1 (http://198.18.0.3:8000)`; the address alone when no pod is known."""
        if not self.pod:
            return self.url
        return f"{self.pod}{f' on {self.node}' if self.node else ''} ({self.url})"


def endpoints_file(run_dir: Path, service: str) -> Path:
    """Where the local fleet keeps Service `service`'s endpoints in a local run's folder."""
    return run_dir / "fleet" / "endpoints" / f"{service}.json"


def replicas(service: str, service_url: str) -> list[Replica]:
    """Every replica Service `service` lists, ready or not (by pod name); the address alone when none is named.

    StepFailedError when the endpoints cannot be read (a local run without them, the API refusing or down).
    """
    run_dir = local_run_dir()
    if service and run_dir is not None:
        return from_file(endpoints_file(run_dir, service), service)
    if service and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return from_api(service, ApiAccess.in_cluster())
    return [Replica("", "", service_url.rstrip("/"))]


def from_file(path: Path, service: str) -> list[Replica]:
    """The replicas in the local fleet's list of Service `service`'s endpoints."""
    try:
        return from_slices(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as err:
        raise StepFailedError(
            f"the local fleet lists no endpoints of Service {service} ({path}: {type(err).__name__}); the fleet's "
            "Service is applied before the rollout's steps run"
        ) from err


def from_api(service: str, access: ApiAccess) -> list[Replica]:
    """The replicas in Service `service`'s EndpointSlices, listed by the Kubernetes API in the pod's namespace."""
    selector = urllib.parse.quote(f"{SERVICE_LABEL}={service}", safe="")
    query = SLICES_API.format(namespace=urllib.parse.quote(access.namespace)) + f"?labelSelector={selector}"
    try:
        return from_slices(get_json(access, query))
    except KubeApiError as err:
        hint = (
            "; grant the pipeline's Role `list` on endpointslices (workflow-templates/cluster-prerequisites.yaml)"
            if err.status == 403
            else ""
        )
        raise StepFailedError(f"cannot list the endpoints of Service {service}: {err}{hint}") from err


def from_slices(document: Any) -> list[Replica]:
    """The replicas of an EndpointSliceList (the API's answer, or the local fleet's file), by pod name.

    An endpoint's first address on the slice's port; `ready` unset counts as ready, as the API defines it.
    """
    items = document.get("items") if isinstance(document, Mapping) else None
    found: dict[str, Replica] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping):
            continue
        ports = [p.get("port") for p in item.get("ports") or [] if isinstance(p, Mapping)]
        port = next((p for p in ports if isinstance(p, int) and not isinstance(p, bool)), None)
        for endpoint in item.get("endpoints") or [] if port is not None else []:
            addresses = endpoint.get("addresses") if isinstance(endpoint, Mapping) else None
            if not isinstance(addresses, list) or not addresses or not isinstance(addresses[0], str):
                continue
            host = f"[{addresses[0]}]" if ":" in addresses[0] else addresses[0]
            url = f"http://{host}:{port}"
            conditions = endpoint.get("conditions") or {}
            target = endpoint.get("targetRef") or {}
            found[url] = Replica(
                pod=str(target.get("name") or addresses[0]),
                node=str(endpoint.get("nodeName") or ""),
                url=url,
                ready=conditions.get("ready") is not False,
            )
    return sorted(found.values(), key=lambda r: (r.pod, r.url))


def load_on_every_replica(
    fleet: Sequence[Replica],
    adapter: str,
    *,
    api_key: str,
    prompt: vllm_client.Prompt,
    max_tokens: int,
    timeout_s: float,
) -> list[tuple[Replica, vllm_client.Answer]]:
    """Each ready replica answers `prompt` from `adapter` (its resolver loads it from the shared folder), then lists it.

    Every replica is asked at once, on its own address. StepFailedError naming each replica that did not answer or
    does not list the adapter after answering; and when no replica is ready.
    """
    ready = [r for r in fleet if r.ready]
    if not ready:
        raise StepFailedError(
            f"no replica of the fleet is ready to load {adapter} (endpoints: "
            f"{', '.join(r.describe() for r in fleet) or 'none'})"
        )

    def load(replica: Replica) -> tuple[Replica, vllm_client.Answer | str]:
        try:
            answer = vllm_client.wait_ready(
                replica.url, adapter, api_key=api_key, timeout_s=timeout_s, prompt=prompt, max_tokens=max_tokens
            )
        except ServingError as err:
            return replica, str(err)
        return replica, answer

    with ThreadPoolExecutor(len(ready)) as pool:
        loaded = list(pool.map(load, ready))
    problems = [f"{r.describe()}: {outcome}" for r, outcome in loaded if isinstance(outcome, str)]
    holding, unasked = holders([r for r, outcome in loaded if not isinstance(outcome, str)], adapter, api_key=api_key)
    problems += [f"{r.describe()}: {why}" for r, why in unasked.items()]
    problems += [
        f"{r.describe()}: answered from {adapter} but does not list it in /v1/models"
        for r, outcome in loaded
        if not isinstance(outcome, str) and r not in holding and r not in unasked
    ]
    if problems:
        raise StepFailedError(f"{adapter} is not loaded on every ready replica: {'; '.join(problems)}")
    return [(r, outcome) for r, outcome in loaded if not isinstance(outcome, str)]


def unload_from_every_replica(
    fleet: Sequence[Replica], adapter: str, *, api_key: str
) -> tuple[list[Replica], dict[Replica, str]]:
    """Unload `adapter` from each replica (ready or not) that holds it, then check each again on its own address.

    Returns the replicas that still hold it, and those that could not be asked (why). Unpublish the adapter first,
    or a replica's resolver loads it again at the next request that names it.
    """

    def unload(replica: Replica) -> str:
        try:
            vllm_client.unload_adapter(replica.url, adapter, api_key=api_key)
        except ServingError as err:
            return str(err)
        return ""

    with ThreadPoolExecutor(max(len(fleet), 1)) as pool:
        failed = dict(zip(fleet, pool.map(unload, fleet), strict=True))
    holding, unasked = holders(fleet, adapter, api_key=api_key)
    return holding, {r: unasked.get(r) or failed[r] for r in unasked}


def holders(fleet: Sequence[Replica], adapter: str, *, api_key: str) -> tuple[list[Replica], dict[Replica, str]]:
    """The replicas whose /v1/models lists `adapter` (or a whole model served so), and those not asked (why)."""

    def listed(replica: Replica) -> bool | str:
        try:
            return adapter in vllm_client.served_names(replica.url, api_key=api_key)
        except ServingError as err:
            return str(err)

    with ThreadPoolExecutor(max(len(fleet), 1)) as pool:
        found = dict(zip(fleet, pool.map(listed, fleet), strict=True))
    return [r for r, v in found.items() if v is True], {r: v for r, v in found.items() if isinstance(v, str)}


def described(fleet: Sequence[Replica]) -> str:
    """`a on node-1 (http://...), b on node-2 (http://...)`: the replicas, for a log line."""
    return ", ".join(r.describe() for r in fleet) or "no replica"
