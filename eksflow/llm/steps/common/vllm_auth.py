"""The API key on every route of vLLM's server: an ASGI middleware the engine loads with `--middleware`.

    python -m vllm.entrypoints.openai.api_server ... --middleware=eksflow.llm.steps.common.vllm_auth.RequireKey
    VLLM_API_KEY=<key>                     # from the environment (a secretKeyRef in the cluster), never argv

vLLM 0.32's own `--api-key` check guards paths under /v1, /v2, /inference and /cohere only: POST /adapters
loads an adapter, DELETE /adapters/{name} unloads one, POST /invocations generates, and /tokenize,
/scale_elastic_ep, /metrics and /openapi.json answer anyone. `RequireKey` asks for `Authorization: Bearer <key>`
on every request, whatever its path, except GET /health: the pod's liveness probe (the readiness probe,
eksflow.llm.steps.ready, sends the key). vLLM adds `--middleware` classes after its own, so this one is the outermost
layer of the app: a route vLLM adds in a later release is guarded too. Without a key the engine refuses to start
(the middleware is built with the app): runtime LoRA loading is never on without the key guarding it.

Stdlib only: the engine's interpreter (eksflow.llm.engines' virtualenv, the serve images) imports it beside vLLM;
of eksflow only the packages above it, whose `__init__` modules load nothing of eksflow until asked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KEY_ENV = "VLLM_API_KEY"
MIDDLEWARE = f"{__name__}.RequireKey"  # the value of vLLM's --middleware
OPEN_ROUTES = frozenset({("GET", "/health")})  # the liveness probe: the kubelet sends no key

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class KeyMissingError(RuntimeError):
    """The engine was asked to serve without a key: it would answer every route to anyone."""


class RequireKey:
    """401 for every HTTP request without `Authorization: Bearer $VLLM_API_KEY`; websockets are closed."""

    def __init__(self, app: App) -> None:
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise KeyMissingError(
                f"{KEY_ENV} is empty, so every route of this vLLM server would answer anyone: set it in the "
                "engine's environment (in the cluster: the serving Secret's vllm-api-key; make serve and the local "
                "fleet make one)"
            )
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass keyed requests (and lifespan events) to the app; refuse the rest before any route runs."""
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation; the handshake gets 403
        else:
            body = json.dumps({"error": f"Unauthorized: send 'Authorization: Bearer <{KEY_ENV}>'"}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    def _allowed(self, scope: Scope) -> bool:
        path = str(scope.get("path", "")).removeprefix(str(scope.get("root_path", "")))
        if (scope.get("method"), path) in OPEN_ROUTES:
            return True
        values = [v for k, v in scope.get("headers") or [] if k.lower() == b"authorization"]
        if len(values) != 1:  # none, or two that a proxy in front might read differently
            return False
        scheme, _, token = bytes(values[0]).partition(b" ")
        # Digests of equal length: the comparison takes the same time whatever the token's length or content.
        offered = hashlib.sha256(token.strip()).digest()
        return scheme.lower() == b"bearer" and hmac.compare_digest(offered, self._digest)
