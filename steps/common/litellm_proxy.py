"""LiteLLM, the proxy in front of vLLM: one public model name, routed by weight across two adapter slots.

The public name (the registered model's name, e.g. `llama-lora`) is what clients ask for. Behind it the proxy
has two deployments, the blue and the green slot; each names an adapter on the vLLM engine by the same id
(`llama-lora-blue`, loaded at run time from the version that holds the slot). A rollout loads the candidate into
the slot the champion does not hold, shifts the weights step by step (the share of requests each slot gets is
weight / sum of weights) and, once promoted, drains and unloads the old champion's slot. Which slot answered is
in the `x-litellm-model-id` response header; the body's `model` is the public name.

How the weights change, and why there are two ways:
- In the cluster, the usual LiteLLM deployment: its Postgres database holds the slot deployments, created with
  POST /model/new and re-weighted with PATCH /model/{id}/update (the management API; models declared in the
  config file cannot be edited there, so the cluster config declares none). Every proxy replica reads them.
- Here, no such database can be set up offline (LiteLLM's Prisma client fetches its engine binaries at generate
  time), and the management API answers "No DB Connected". The measured alternatives were a restart with a new
  config (~8 s during which requests are refused) and a callback that reads the weights from a file at every
  request (5:5 gave 53/47; no restart). The file callback is used: no request to the public name fails during a
  weight change, a change applies from the next request, and the write is one atomic rename. It sets LiteLLM's
  per-request `_router_weights` field, internal to the pinned 1.110.2, so tests/e2e/test_rollout.py measures
  the shares from the responses and fails if an upgrade breaks it. The local fleet
  (pipelines/serving/local_fleet.py) hands the file's path to the proxy and, as EKSFLOW_ROUTES_FILE, to every
  step: a step that has it writes the file; a step without it (the cluster) uses the management API.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from eksflow.runtime.args import StepFailedError, StepInputError
from eksflow.runtime.outputs import atomic_write_text
from steps.common.litellm_routes import ROUTES_FILE_ENV  # set by the local fleet; the proxy's callback reads it

Slot = Literal["blue", "green"]
SLOTS: tuple[Slot, Slot] = ("blue", "green")
PROVIDER = "hosted_vllm"  # LiteLLM's provider for a vLLM OpenAI server (api_base .../v1)
VLLM_KEY_ENV = "VLLM_API_KEY"  # the proxy sends this key to vLLM (os.environ/ reference: never in the config)


class RoutingError(StepFailedError):
    """The proxy refused or failed a routing change; the message says which request and why."""


def slot_id(public_name: str, slot: Slot) -> str:
    """The adapter name on vLLM and the deployment id in LiteLLM of a slot: `llama-lora-blue`."""
    return f"{public_name}-{slot}"


def other_slot(slot: Slot) -> Slot:
    """The slot a candidate goes to when the champion holds `slot`."""
    return SLOTS[1 - SLOTS.index(slot)]


def slot_deployments(public_name: str, vllm_url: str) -> list[dict[str, Any]]:
    """The proxy's deployments of the public name: one per slot, each an adapter on the vLLM Service."""
    return [
        {
            "model_name": public_name,
            "litellm_params": {
                "model": f"{PROVIDER}/{slot_id(public_name, slot)}",
                "api_base": f"{vllm_url}/v1",
                "api_key": f"os.environ/{VLLM_KEY_ENV}",
                "weight": 1 if slot == SLOTS[0] else 0,  # a fresh fleet routes to blue, where the first version goes
            },
            "model_info": {"id": slot_id(public_name, slot)},
        }
        for slot in SLOTS
    ]


def proxy_config(request_timeout_s: int) -> dict[str, Any]:
    """LiteLLM's config for the cluster: keys and database from the environment (Secrets), models in the database."""
    return {
        "model_list": [],  # the slots live in the database (POST /model/new), where they can be re-weighted
        "router_settings": {
            "routing_strategy": "simple-shuffle",  # weighted random choice among the public name's deployments
            "num_retries": 0,  # a failing candidate must show in the analysis, not be retried onto the champion
            "timeout": request_timeout_s,
        },
        "litellm_settings": {"request_timeout": request_timeout_s, "drop_params": True},
        "general_settings": {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            "database_url": "os.environ/DATABASE_URL",
            "store_model_in_db": True,
        },
    }


def weights_for(public_name: str, champion: Slot | None, candidate: Slot, candidate_percent: float) -> dict[str, float]:
    """Slot id -> weight when the candidate takes `candidate_percent` of the traffic (all of it without a champion)."""
    share = 100.0 if champion is None else candidate_percent
    weights = {slot_id(public_name, s): 0.0 for s in SLOTS}
    weights[slot_id(public_name, candidate)] = share
    if champion is not None:
        weights[slot_id(public_name, champion)] = 100.0 - share
    return weights


class Routes(Protocol):
    """Where the slot weights of the public name are set."""

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Make the proxy route by `weights` (slot id -> weight) from its next request on."""

    def point(self, deployment_id: str, vllm_url: str) -> None:
        """Send the slot's requests to the fleet at `vllm_url` (a candidate on a new base model has its own)."""

    def describe(self) -> str:
        """One line for logs: what is changed and where."""


@dataclass(frozen=True)
class RoutesFile:
    """Local: the file the proxy's callback reads at every request ({public name: {slot id: weight}})."""

    path: Path
    public_name: str

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Rewrite the file atomically: a request reads the old weights or the new ones, never half of each."""
        if not any(w > 0 for w in weights.values()):
            raise RoutingError(f"refusing weights {dict(weights)}: at least one slot must take traffic")
        current = self.read()
        current[self.public_name] = {k: float(v) for k, v in weights.items()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps(current, sort_keys=True))

    def point(self, deployment_id: str, vllm_url: str) -> None:
        """Nothing to do: the local fleet has one engine, and both slots' deployments address it."""

    def read(self) -> dict[str, dict[str, float]]:
        """The file's weights (empty when it does not exist yet)."""
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise RoutingError(f"routes file {self.path} is unreadable ({err}); delete it to start over") from err
        return loaded if isinstance(loaded, dict) else {}

    def describe(self) -> str:
        """The file, as logs show it."""
        return f"routes file {self.path}"


@dataclass(frozen=True)
class ProxyApi:
    """Cluster: the proxy's model-management API over its database (master key from the mounted Secret)."""

    proxy_url: str
    master_key: str
    public_name: str
    vllm_url: str

    def ensure_slots(self) -> None:
        """Create the slot deployments that the database does not hold yet (POST /model/new)."""
        have = {str(m.get("model_info", {}).get("id")) for m in self._request("GET", "/model/info").get("data", [])}
        for deployment in slot_deployments(self.public_name, self.vllm_url):
            if deployment["model_info"]["id"] not in have:
                self._request("POST", "/model/new", deployment)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """PATCH each slot's weight; the one gaining traffic first, so both are never 0 at once."""
        self.ensure_slots()
        for deployment_id, weight in sorted(weights.items(), key=lambda item: -item[1]):
            self._request("PATCH", f"/model/{deployment_id}/update", {"litellm_params": {"weight": weight}})

    def point(self, deployment_id: str, vllm_url: str) -> None:
        """PATCH the slot's api_base to the fleet that holds its adapter."""
        self.ensure_slots()
        self._request("PATCH", f"/model/{deployment_id}/update", {"litellm_params": {"api_base": f"{vllm_url}/v1"}})

    def describe(self) -> str:
        """The API, as logs show it."""
        return f"LiteLLM management API at {self.proxy_url}"

    def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        import requests

        try:
            response = requests.request(
                method,
                f"{self.proxy_url}{path}",
                json=payload,
                headers={"Authorization": f"Bearer {self.master_key}"},
                timeout=60,
            )
        except requests.RequestException as err:
            raise RoutingError(f"{method} {self.proxy_url}{path} failed: {err}") from err
        if response.status_code != 200:
            raise RoutingError(
                f"{method} {self.proxy_url}{path} answered {response.status_code}: {response.text[:300]}"
            )
        body = response.json()
        return body if isinstance(body, dict) else {"data": body}


def routes(proxy_url: str, master_key: str, public_name: str, vllm_url: str) -> Routes:
    """The routes file when the local fleet named one (EKSFLOW_ROUTES_FILE), else the management API."""
    path = os.environ.get(ROUTES_FILE_ENV)
    if path:
        return RoutesFile(Path(path), public_name)
    if not master_key:
        raise StepInputError(
            "no LiteLLM master key: mount the serving Secret (key litellm-master-key) at --secrets-dir; "
            "the management API refuses unauthenticated changes"
        )
    return ProxyApi(proxy_url, master_key, public_name, vllm_url)


def live(proxy_url: str) -> bool:
    """True if the proxy answers /health/liveliness (it needs no model to be up)."""
    import requests

    try:
        return requests.get(f"{proxy_url}/health/liveliness", timeout=5).status_code == 200
    except requests.RequestException:
        return False
