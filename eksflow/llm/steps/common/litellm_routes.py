"""LiteLLM proxy callback: route the public model name by the routes file on FSx, to this fleet's engines only.

Every proxy pod runs it (eksflow/llm/serving/objects.py ships this file in the proxy's ConfigMap, beside config.yaml,
whose `litellm_settings.callbacks` names `litellm_routes.handler`; the local fleet writes the same two files). It
runs inside the proxy's own image or virtualenv, where neither eksflow nor steps is installed, so it imports
nothing from them. Two variables of the proxy's environment set it up:

    EKSFLOW_ROUTES_FILE  the routes file on FSx, which the rollout steps rewrite with an atomic rename
                         (eksflow/llm/steps/common/litellm_proxy.py):
        {"<public name>": {"<slot id>": {"weight": 90.0, "adapter": "<published adapter name>",
                                         "api_base": "http://<fleet Service>:8000/v1"}, ...}}
    EKSFLOW_UPSTREAMS    a regular expression the origin (scheme://host:port) of every api_base must match as a
                         whole: the engines of this fleet (in the cluster the pipeline's fleet Services, locally
                         the engines the run's fleet runs). A slot naming any other address is not routed, so
                         no request and no key ever goes there: a routes file an earlier run left behind names
                         that run's engine, which may be gone or replaced by another listener.

The file is read again whenever it changes (`Routes.refresh`), so a change applies from the next request. A
damaged file (not JSON, not routes, a weight that is not a finite number >= 0, a folder in its place) changes
nothing: the proxy keeps routing by the last good routes and logs one line per distinct problem. Two hooks:
- before routing, the weights of the slots it may route go on the request as `_router_weights`, which the pinned
  LiteLLM (1.110.2) uses in place of the deployments' configured weights (a deployment it does not list gets 0);
  a request for a name with no such slot is refused with 503, before anything is sent anywhere;
- once a slot's deployment is picked, the request goes to the adapter and engine the file assigns to the slot
  (the deployment's configured model and api_base are placeholders, never contacted).
`_router_weights` is internal to LiteLLM: tests/e2e/test_proxy_routes.py measures the shares and the adapters a
real proxy sends requests to, and fails when an upgrade breaks either hook.

Run as a script it is the proxy pod's readiness probe, `python3 litellm_routes.py <public name> <port>`: ready
once LiteLLM answers /health/readiness and the routes file routes the public name to this fleet. A new proxy is
not ready, and its Service sends it no client, until a rollout routed the name (serve-champion the champion; with
none, the first canary shift the candidate). This is also the one place ROUTES_FILE_ENV and UPSTREAMS_ENV are
defined: `handler` is made on first access, so importing the module for the names needs no LiteLLM.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROUTES_FILE_ENV = "EKSFLOW_ROUTES_FILE"
UPSTREAMS_ENV = "EKSFLOW_UPSTREAMS"
# An address: http(s)://host[:port] (no user part, no space or backslash), then an optional printable path.
_ADDRESS = re.compile(r"(?P<origin>https?://[^/?#@\\\s]+)(/[!-~]*)?")
_SHOWN = 80  # characters of a value from the file in a log line

RoutesMap = dict[str, dict[str, dict[str, Any]]]


class DamagedRoutesError(ValueError):
    """The routes file is not a routes file as a whole; the message says why, in one line."""


def parse(text: str) -> RoutesMap:
    """The routes file's content, checked: DamagedRoutesError naming the first problem.

    Each slot: `weight` a finite number >= 0; `adapter` and `api_base` (an http(s) address) both set whenever the
    weight is above 0. The writer (litellm_proxy.RoutesFile) and the proxy check with this same function.
    """
    try:
        loaded = json.loads(text)
    except ValueError as err:
        raise DamagedRoutesError(f"not JSON ({err})") from None
    if not isinstance(loaded, dict):
        raise DamagedRoutesError(f"a JSON {_kind(loaded)}, not an object of public names")
    for public, slots in loaded.items():
        if not isinstance(slots, dict):
            raise DamagedRoutesError(f"{_shown(public)} holds a JSON {_kind(slots)}, not an object of slots")
        for slot, route in slots.items():
            where = f"slot {_shown(slot)} of {_shown(public)}"
            if not isinstance(route, dict):
                raise DamagedRoutesError(f"{where} is a JSON {_kind(route)}, not an object")
            weight = route.get("weight")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
                raise DamagedRoutesError(f"{where} has weight {_shown(weight)}; a weight is a finite number >= 0")
            adapter, api_base = route.get("adapter"), route.get("api_base")
            if adapter is not None and not (isinstance(adapter, str) and adapter.strip()):
                raise DamagedRoutesError(f"{where} has adapter {_shown(adapter)}; an adapter is a non-empty name")
            if api_base is not None and not (isinstance(api_base, str) and _ADDRESS.fullmatch(api_base)):
                raise DamagedRoutesError(f"{where} has api_base {_shown(api_base)}; an address is http(s)://host:port")
            if weight > 0 and not (adapter and api_base):
                raise DamagedRoutesError(f"{where} has weight {weight:g} but no adapter and api_base")
    return loaded


def origin(api_base: str) -> str:
    """`scheme://host:port` of an address ("" for anything else)."""
    found = _ADDRESS.fullmatch(api_base)
    return found["origin"] if found else ""


def allowed_upstreams(pattern: str) -> re.Pattern[str] | None:
    """EKSFLOW_UPSTREAMS compiled; None (nothing may be routed) when it is empty or no regular expression."""
    try:
        return re.compile(pattern) if pattern else None
    except re.error:
        return None


class Routing:
    """What the proxy routes by: the slots of this fleet's engines, and the slots it refuses (why, one line each).

    A plain class: LiteLLM executes this file without registering it as a module, which dataclasses need.
    """

    def __init__(
        self,
        weights: dict[str, dict[str, float]] | None = None,
        targets: dict[str, tuple[str, str]] | None = None,
        refused: tuple[str, ...] = (),
    ) -> None:
        self.weights = weights or {}  # public name -> slot id -> weight
        self.targets = targets or {}  # slot id -> (adapter, api_base)
        self.refused = refused


def routing(routes: RoutesMap, allowed: re.Pattern[str] | None) -> Routing:
    """The assigned slots whose engine `allowed` admits; a public name is routed when one of them has weight."""
    weights, targets, refused = {}, {}, []
    for public, slots in routes.items():
        group = {}
        for slot, route in slots.items():
            adapter, api_base = route.get("adapter"), route.get("api_base")
            if not (adapter and api_base):
                continue  # unassigned: weight 0 (parse checked), nothing to send
            if allowed is None or not allowed.fullmatch(origin(api_base)):
                refused.append(f"slot {_shown(slot)} names {_shown(api_base)}, not an engine of this fleet")
                continue
            targets[slot] = (str(adapter), str(api_base))
            group[slot] = float(route["weight"])
        if any(w > 0 for w in group.values()):  # LiteLLM refuses a group whose weights are all zero
            weights[public] = group
    return Routing(weights, targets, tuple(refused))


def _log(line: str) -> None:
    print(f"eksflow routes: {line}", file=sys.stderr, flush=True)


class Routes:
    """The routes a proxy follows: the file read again when it changes, the last good routes kept when it is damaged.

    Each distinct problem (damage, a refused slot, no file) is logged once, not at every request.
    """

    def __init__(self, path: str, upstreams: str, log: Callable[[str], None] = _log) -> None:
        self.path = path
        self._allowed = allowed_upstreams(upstreams)
        self._log = log
        self._stamp: tuple[int, int, int] | None = None  # (inode, mtime ns, size) of the file last read
        self._said: set[str] = set()
        self.current = Routing()
        self.damaged = False  # the last read found the file damaged (the routes in force are older)
        if self._allowed is None:
            self._say(f"{UPSTREAMS_ENV}={upstreams!r} is no regular expression of engine addresses: nothing is routed")

    def refresh(self) -> Routing:
        """The routes by the file as it is now (read only when it changed since the last call)."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self.current, self.damaged = None, Routing(), False  # a fleet before its first rollout
            self._say(
                f"no routes file at {self.path!r} ({ROUTES_FILE_ENV}): nothing is routed until a rollout writes it"
            )
            return self.current
        except OSError as err:
            return self._keep(err.strerror or type(err).__name__)
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return self.current
        self._stamp = stamp  # a damaged file is not read again until it changes
        try:
            with open(self.path, encoding="utf-8") as f:
                routes = parse(f.read())
        except OSError as err:
            return self._keep(err.strerror or type(err).__name__)
        except (UnicodeDecodeError, DamagedRoutesError) as err:
            return self._keep(str(err))
        self.current, self.damaged = routing(routes, self._allowed), False
        self._said.clear()  # a good file: a problem that comes back is news again
        for line in self.current.refused:
            self._say(f"{line} ({UPSTREAMS_ENV}): not routed")
        return self.current

    def _keep(self, why: str) -> Routing:
        """A damaged file: the last good routes stay in force."""
        self.damaged = True
        kept = "the last good routes" if self.current.targets else "nothing (no good routes read yet)"
        self._say(f"routes file {self.path} is damaged ({why}); routing by {kept}")
        return self.current

    def _say(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            self._log(line)


def unrouted(public: str, path: str, upstreams: str) -> tuple[str, bool]:
    """(why the routes file does not route `public` to this fleet's engines, "" when it does; is the file damaged)."""
    said: list[str] = []
    routes = Routes(path, upstreams, said.append)
    if public in routes.refresh().weights:
        return "", False
    return "; ".join(said) or f"no slot of {public!r} on this fleet's engines has weight", routes.damaged


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError):
        return 0


def not_ready(public: str, port: int, path: str, upstreams: str, verdict: Path) -> str:
    """The readiness probe: why the proxy pod must not take clients ("" when it may).

    A damaged file leaves the verdict of the last good read (kept in the file `verdict`): the proxy itself keeps
    routing by the last good routes meanwhile.
    """
    status = _http_status(f"http://127.0.0.1:{port}/health/readiness")
    if status != 200:
        return f"LiteLLM answers /health/readiness with {status or 'nothing'}"
    why, damaged = unrouted(public, path, upstreams)
    if damaged:
        return "" if verdict.is_file() else why
    if why:
        verdict.unlink(missing_ok=True)
    else:
        verdict.touch()
    return why


def main(argv: list[str]) -> int:
    """`python3 litellm_routes.py <public name> <port>`: exit 0 when the proxy pod is ready (see not_ready)."""
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python3 litellm_routes.py <public name> <port>", file=sys.stderr)
        return 2
    public, port = argv[0], int(argv[1])
    verdict = Path(tempfile.gettempdir()) / f"eksflow-routed-{port}"  # this pod's last verdict on a good file
    why = not_ready(public, port, os.environ.get(ROUTES_FILE_ENV, ""), os.environ.get(UPSTREAMS_ENV, ""), verdict)
    if why:
        print(f"not ready: {why}", file=sys.stderr)
        return 1
    return 0


def _kind(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[: _SHOWN - 3]}..."


def __getattr__(name: str) -> Any:
    """`handler`, the callback instance the proxy's config names, made (with LiteLLM) when the proxy asks for it."""
    if name != "handler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    handler = _routes_from_file()
    globals()["handler"] = handler  # made once: later lookups find it without this function
    return handler


def _routes_from_file() -> Any:
    """A LiteLLM CustomLogger that routes each request by the routes file."""
    from fastapi import HTTPException  # only the proxy's environment has LiteLLM and its server
    from litellm.integrations.custom_logger import CustomLogger

    class RoutesFromFile(CustomLogger):  # type: ignore[misc]  # LiteLLM is not installed in the main environment
        """Weights before routing, the slot's adapter and engine after it, from the routes file."""

        def __init__(self) -> None:
            super().__init__()
            self.routes = Routes(os.environ.get(ROUTES_FILE_ENV, ""), os.environ.get(UPSTREAMS_ENV, ""))

        async def async_pre_call_hook(
            self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: str
        ) -> dict[str, Any]:
            """Attach the file's weights for the requested name, or refuse it (503) when nothing routes it."""
            weights = self.routes.refresh().weights
            model = data.get("model")
            if model not in weights:
                raise HTTPException(
                    status_code=503,
                    detail=f"model {model!r} is not routed to an engine of this fleet (yet): no rollout routed it",
                )
            data["_router_weights"] = {model: weights[model]}
            return data

        async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
            """Send the picked slot's request to the adapter and engine the file assigns to that slot, or refuse."""
            slot = str((kwargs.get("model_info") or {}).get("id", ""))
            target = self.routes.refresh().targets.get(slot)
            if target is None:  # never the placeholder address, never an engine of another fleet
                raise HTTPException(status_code=503, detail=f"slot {slot!r} is not routed to an engine of this fleet")
            provider = str(kwargs.get("model", "")).partition("/")[0]
            return {**kwargs, "model": f"{provider}/{target[0]}", "api_base": target[1]}

    return RoutesFromFile()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
