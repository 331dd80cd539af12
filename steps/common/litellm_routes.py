"""LiteLLM proxy callback (local fleet only): route the public model name by the weights in a file.

The local fleet (pipelines/serving/local_fleet.py) copies this file next to the proxy's config and registers
`litellm_routes.handler` in `litellm_settings.callbacks`; it runs inside the LiteLLM virtualenv, where neither
eksflow nor steps is installed, so it imports nothing from them. Before every request is routed it reads
$EKSFLOW_ROUTES_FILE ({"<public name>": {"<deployment id>": weight, ...}}; re-read only when its modification time
changes) and puts those weights on the request as `_router_weights`, which the pinned LiteLLM (1.110.2) uses in
place of the deployments' configured weights (a deployment it does not list gets 0). Steps rewrite the file with an
atomic rename, so a request sees either the old weights or the new ones. Why a file and not the management API:
see steps/common/litellm_proxy.py.

This is also the one place ROUTES_FILE_ENV is defined (the fleet sets it, litellm_proxy.py reads it): `handler` is
made on first access, so importing the module for the name needs no LiteLLM.
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
    """A LiteLLM CustomLogger that sets `_router_weights` on each request from the routes file."""
    from litellm.integrations.custom_logger import CustomLogger  # only the proxy's virtualenv has LiteLLM

    class RoutesFromFile(CustomLogger):  # type: ignore[misc]  # LiteLLM is not installed in the main environment
        """Sets `_router_weights` on each request from the routes file."""

        def __init__(self) -> None:
            super().__init__()
            self._path = os.environ.get(ROUTES_FILE_ENV, "")
            self._stamp: int | None = None
            self._weights: dict[str, dict[str, float]] = {}

        def _current(self) -> dict[str, dict[str, float]]:
            try:
                stamp = os.stat(self._path).st_mtime_ns
            except OSError:
                return {}  # no file yet: the configured weights apply
            if stamp != self._stamp:
                with open(self._path, encoding="utf-8") as f:
                    loaded = json.load(f)
                # Only groups with a positive weight: LiteLLM refuses a group whose weights are all zero.
                self._weights = {
                    group: {str(k): float(v) for k, v in weights.items()}
                    for group, weights in loaded.items()
                    if isinstance(weights, dict) and any(float(v) > 0 for v in weights.values())
                }
                self._stamp = stamp
            return self._weights

        async def async_pre_call_hook(
            self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: str
        ) -> dict[str, Any]:
            """Attach the file's weights for the requested model group (before the router picks a deployment)."""
            weights = self._current()
            if data.get("model") in weights:
                data["_router_weights"] = {data["model"]: weights[data["model"]]}
            return data

    return RoutesFromFile()
