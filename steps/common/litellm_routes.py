"""LiteLLM proxy callback: route the public model name by the routes file on FSx, to the adapters it names.

Every proxy pod runs it (pipelines/serving/objects.py ships this file in the proxy's ConfigMap, beside config.yaml,
whose `litellm_settings.callbacks` names `litellm_routes.handler`; the local fleet writes the same two files). It
runs inside the proxy's own image or virtualenv, where neither eksflow nor steps is installed, so it imports
nothing from them. $EKSFLOW_ROUTES_FILE is the routes file on FSx, which the rollout steps rewrite with an atomic
rename (steps/common/litellm_proxy.py):

    {"<public name>": {"<slot id>": {"weight": 90.0, "adapter": "<published adapter name>",
                                     "api_base": "http://<fleet Service>:8000/v1"}, ...}}

It is read again whenever its modification time changes, so a change applies from the next request. Two hooks:
- before routing, the slots' weights go on the request as `_router_weights`, which the pinned LiteLLM (1.110.2)
  uses in place of the deployments' configured weights (a deployment it does not list gets 0);
- once a slot's deployment is picked, the request goes to the adapter and fleet the file assigns to the slot
  (the deployment's configured model and api_base are placeholders).
`_router_weights` is internal to LiteLLM: tests/e2e/test_proxy_routes.py measures the shares and the adapters a
real proxy sends requests to, and fails when an upgrade breaks either hook.

This is also the one place ROUTES_FILE_ENV is defined: `handler` is made on first access, so importing the module
for the name needs no LiteLLM.
"""

from __future__ import annotations

import json
import os
from typing import Any

ROUTES_FILE_ENV = "EKSFLOW_ROUTES_FILE"


def __getattr__(name: str) -> Any:
    """`handler`, the callback instance the proxy's config names, made (with LiteLLM) when the proxy asks for it."""
    if name != "handler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    handler = _routes_from_file()
    globals()["handler"] = handler  # made once: later lookups find it without this function
    return handler


def _routes_from_file() -> Any:
    """A LiteLLM CustomLogger that routes each request by the routes file."""
    from litellm.integrations.custom_logger import CustomLogger  # only the proxy's environment has LiteLLM

    class RoutesFromFile(CustomLogger):  # type: ignore[misc]  # LiteLLM is not installed in the main environment
        """Weights before routing, the slot's adapter and fleet after it, from the routes file."""

        def __init__(self) -> None:
            super().__init__()
            self._path = os.environ.get(ROUTES_FILE_ENV, "")
            self._stamp: int | None = None
            self._weights: dict[str, dict[str, float]] = {}  # public name -> slot id -> weight
            self._targets: dict[str, tuple[str, str]] = {}  # slot id -> (adapter, api_base)

        def _refresh(self) -> None:
            try:
                stamp = os.stat(self._path).st_mtime_ns
            except OSError:
                self._stamp, self._weights, self._targets = None, {}, {}  # no file: nothing is assigned
                return
            if stamp == self._stamp:
                return
            with open(self._path, encoding="utf-8") as f:
                loaded = json.load(f)
            weights, targets = {}, {}
            for public, slots in loaded.items():
                group = {str(slot): float(route.get("weight", 0)) for slot, route in slots.items()}
                if any(w > 0 for w in group.values()):  # LiteLLM refuses a group whose weights are all zero
                    weights[str(public)] = group
                for slot, route in slots.items():
                    if route.get("adapter") and str(route.get("api_base", "")).startswith(("http://", "https://")):
                        targets[str(slot)] = (str(route["adapter"]), str(route["api_base"]))
            self._weights, self._targets, self._stamp = weights, targets, stamp

        async def async_pre_call_hook(
            self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: str
        ) -> dict[str, Any]:
            """Attach the file's weights for the requested model group (before the router picks a deployment)."""
            self._refresh()
            if data.get("model") in self._weights:
                data["_router_weights"] = {data["model"]: self._weights[data["model"]]}
            return data

        async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
            """Send the picked slot's request to the adapter and fleet the file assigns to that slot."""
            self._refresh()
            target = self._targets.get(str((kwargs.get("model_info") or {}).get("id", "")))
            if target is None:
                return None
            provider = str(kwargs.get("model", "")).partition("/")[0]
            return {**kwargs, "model": f"{provider}/{target[0]}", "api_base": target[1]}

    return RoutesFromFile()
