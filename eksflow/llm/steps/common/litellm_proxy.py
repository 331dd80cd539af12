"""LiteLLM, the proxy in front of vLLM: one public model name, routed by weight across two slots.

The public name (the registered model's name, e.g. `llama-lora`) is what clients ask for. Behind it the proxy
has two deployments, the blue and the green slot (ids `llama-lora-blue`, `llama-lora-green`). A rollout assigns
the candidate's published adapter (eksflow/llm/steps/common/adapters.py) to the slot the champion does not hold, shifts
the weights step by step (the share of requests each slot gets is weight / sum of weights) and, once promoted, leaves
the old champion's slot at weight 0. Which slot answered is in the `x-litellm-model-id` response header; the
body's `model` is the public name.

One mechanism, here and in the cluster: the routes file. It lives on FSx next to the adapters
(`<fsx>/serving/<model>/routes.json`); every proxy pod mounts FSx read-only and its callback
(eksflow/llm/steps/common/litellm_routes.py) reads the file at each request whose file changed, and the rollout steps
rewrite it with one atomic rename: a request sees the old routes or the new ones, never half of each, and no request to
the public name fails during a change. The file names, per slot, its weight, its adapter and its fleet's address;
a proxy sends requests (with the vLLM key) only to addresses of its own fleets ($EKSFLOW_UPSTREAMS), keeps the
last good routes when the file is damaged, and is ready only once the file routes the public name.
Why not the alternatives: LiteLLM's model-management API needs the proxy's Postgres database, whose Prisma engines
cannot be fetched offline, so it could never run here and would ship untested; a ConfigMap would need the steps to
hold RBAC to write it, and the kubelet propagates a change to mounted pods only after up to a minute; a restart
with a new config refuses requests for ~8 s. FSx is already mounted by every step and engine, and Lustre shows a
rename to every client at once. The canary's analysis measures the shares each step really got all the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eksflow.errors import EXIT_FAILED
from eksflow.llm.steps.common import litellm_routes, vllm_client
from eksflow.runtime.args import StepFailedError
from eksflow.runtime.outputs import atomic_write_text

Slot = Literal["blue", "green"]
SLOTS: tuple[Slot, Slot] = ("blue", "green")
PROVIDER = "hosted_vllm"  # LiteLLM's provider for a vLLM OpenAI server (api_base .../v1)
VLLM_KEY_ENV = "VLLM_API_KEY"  # the proxy sends this key to vLLM (os.environ/ reference: never in the config)
CALLBACK_MODULE = "litellm_routes"  # eksflow/llm/steps/common/litellm_routes.py, shipped beside the proxy's config.yaml
UNASSIGNED = "http://unassigned.invalid/v1"  # a slot's address until the routes file assigns one (never resolves)


class RoutingError(StepFailedError):
    """The routes file cannot be read or would leave the public name without a route; the message says why."""

    label = "routing error"
    exit_code = EXIT_FAILED


def slot_id(public_name: str, slot: Slot) -> str:
    """The deployment id of a slot in LiteLLM: `llama-lora-blue`."""
    return f"{public_name}-{slot}"


def other_slot(slot: Slot) -> Slot:
    """The slot a candidate goes to when the champion holds `slot`."""
    return SLOTS[1 - SLOTS.index(slot)]


def slot_deployments(public_name: str) -> list[dict[str, Any]]:
    """The proxy's deployments of the public name, one per slot; the routes file assigns each its adapter and fleet."""
    return [
        {
            "model_name": public_name,
            "litellm_params": {
                "model": f"{PROVIDER}/{slot_id(public_name, slot)}",
                "api_base": UNASSIGNED,
                "api_key": f"os.environ/{VLLM_KEY_ENV}",
                "weight": 1 if slot == SLOTS[0] else 0,  # overridden by the routes file at every request
            },
            "model_info": {"id": slot_id(public_name, slot)},
        }
        for slot in SLOTS
    ]


def proxy_config(public_name: str, request_timeout_s: int) -> dict[str, Any]:
    """LiteLLM's config.yaml: the two slots, routed by the routes-file callback; the master key from the Secret."""
    return {
        "model_list": slot_deployments(public_name),
        "router_settings": {
            "routing_strategy": "simple-shuffle",  # weighted random choice among the public name's deployments
            "num_retries": 0,  # a failing candidate must show in the analysis, not be retried onto the champion
            "timeout": request_timeout_s,
        },
        "litellm_settings": {
            "request_timeout": request_timeout_s,
            "drop_params": True,
            "callbacks": [f"{CALLBACK_MODULE}.handler"],
        },
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


def weights_for(public_name: str, champion: Slot | None, candidate: Slot, candidate_percent: float) -> dict[str, float]:
    """Slot id -> weight when the candidate takes `candidate_percent` of the traffic (all of it without a champion)."""
    share = 100.0 if champion is None else candidate_percent
    weights = {slot_id(public_name, s): 0.0 for s in SLOTS}
    weights[slot_id(public_name, candidate)] = share
    if champion is not None:
        weights[slot_id(public_name, champion)] = 100.0 - share
    return weights


@dataclass(frozen=True)
class RoutesFile:
    """The routes file on FSx that every proxy pod reads: {public name: {slot id: weight, adapter, api_base}}.

    What it writes is checked as the proxies check it (litellm_routes.parse): a weight is a finite number >= 0,
    and a slot takes traffic only once an adapter and an engine are assigned to it.
    """

    path: Path
    public_name: str

    def assign(self, slot: Slot, adapter: str, vllm_url: str) -> None:
        """Send the slot's requests to `adapter` on the fleet at `vllm_url`.

        The slot keeps its weight only when it already named this adapter on this fleet (serve-champion again on
        a serving fleet); a new assignment starts at weight 0 and takes traffic once a step gives it weight: a
        weight left by an earlier rollout never sends users to an adapter that was not analysed.
        """
        api_base = f"{vllm_url.rstrip('/')}/v1"
        if not adapter.strip() or not litellm_routes.origin(api_base):
            raise RoutingError(f"refusing to route {slot} to adapter {adapter!r} at {vllm_url!r}: no http(s) address")
        routes = self.read()
        group = routes.setdefault(self.public_name, {})
        current = group.get(slot_id(self.public_name, slot), {})
        same = current.get("adapter") == adapter and current.get("api_base") == api_base
        group[slot_id(self.public_name, slot)] = {
            "weight": float(current.get("weight", 0.0)) if same else 0.0,
            "adapter": adapter,
            "api_base": api_base,
        }
        self._write(routes)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Route by `weights` (slot id -> weight) from the next request on; only assigned slots may take traffic."""
        known = {slot_id(self.public_name, s) for s in SLOTS}
        for deployment_id, weight in weights.items():
            if deployment_id not in known:
                raise RoutingError(
                    f"refusing weights for {deployment_id!r}: the slots of {self.public_name} are {sorted(known)}"
                )
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight < math.inf:
                raise RoutingError(f"refusing weight {weight!r} for {deployment_id}: a weight is a finite number >= 0")
        if not any(w > 0 for w in weights.values()):
            raise RoutingError(f"refusing weights {dict(weights)}: at least one slot must take traffic")
        self._update(weights)

    def withdraw(self, slot: Slot) -> None:
        """The slot takes no more traffic (weight 0), even when that leaves the public name without a route."""
        if slot_id(self.public_name, slot) in self.read().get(self.public_name, {}):
            self._update({slot_id(self.public_name, slot): 0.0})

    def read(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The whole file (every public name it routes; empty when it does not exist yet)."""
        try:
            return litellm_routes.parse(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as err:
            raise RoutingError(f"routes file {self.path} is unreadable ({err}); delete it to start over") from err
        except litellm_routes.DamagedRoutesError as err:
            raise RoutingError(
                f"routes file {self.path} is damaged ({err}); the proxies keep routing by the last good routes: "
                "delete it to start over"
            ) from err

    def describe(self) -> str:
        """The file, as logs show it."""
        return f"routes file {self.path}"

    def _update(self, weights: Mapping[str, float]) -> None:
        routes = self.read()
        group = routes.setdefault(self.public_name, {})
        for deployment_id, weight in weights.items():
            if weight > 0 and not group.get(deployment_id, {}).get("adapter"):
                raise RoutingError(f"refusing weight {weight:g} for {deployment_id}: no adapter is assigned to it")
            group.setdefault(deployment_id, {})["weight"] = float(weight)
        self._write(routes)

    def _write(self, routes: dict[str, dict[str, dict[str, Any]]]) -> None:
        text = json.dumps(routes, indent=2, sort_keys=True)
        litellm_routes.parse(text)  # what every proxy will accept, or a bug here: never a file they keep refusing
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, text)


def proxy_down(base_url: str, timeout_s: float = 5) -> str:
    """Why the LiteLLM proxy at `base_url` is not running ("" when its liveness route answers 200)."""
    return vllm_client.server_down("the LiteLLM proxy", base_url, "/health/liveliness", timeout_s)
