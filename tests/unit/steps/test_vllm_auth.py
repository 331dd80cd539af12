"""eksflow.llm.steps.common.vllm_auth: the key on every route of vLLM's ASGI app but GET /health (SE2)."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eksflow.llm import engines
from eksflow.llm.steps.common import vllm, vllm_auth, vllm_process

KEY = "s3cret-key"


def call(scope_overrides, headers=(), key=KEY, monkeypatch=None):
    """(status or close code, whether the wrapped app ran) for one request through RequireKey."""
    ran = []

    async def app(scope, receive, send):
        ran.append(scope["path"] if "path" in scope else scope["type"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    monkeypatch.setenv(vllm_auth.KEY_ENV, key)
    middleware = vllm_auth.RequireKey(app)
    scope = {"type": "http", "method": "POST", "path": "/adapters", "root_path": "", "headers": list(headers)}
    asyncio.run(middleware({**scope, **scope_overrides}, receive, send))
    first = sent[0] if sent else {}
    return first.get("status", first.get("code")), bool(ran)


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ([], False),
        ([(b"authorization", b"Bearer " + KEY.encode())], True),
        ([(b"Authorization", b"bearer " + KEY.encode())], True),  # header names and the scheme: any case
        ([(b"authorization", b"Bearer wrong")], False),
        ([(b"authorization", b"Bearer " + KEY.encode() + b"x")], False),
        ([(b"authorization", KEY.encode())], False),  # no scheme
        ([(b"authorization", b"Basic " + KEY.encode())], False),
        ([(b"authorization", b"Bearer " + KEY.encode())] * 2, False),  # two headers: ambiguous, refused
    ],
    ids=["none", "key", "any-case", "wrong", "longer", "no-scheme", "basic", "twice"],
)
def test_only_the_bearer_key_passes(monkeypatch, headers, allowed):
    status, ran = call({}, headers, monkeypatch=monkeypatch)
    assert ran is allowed and status == (200 if allowed else 401)


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/adapters"), ("DELETE", "/adapters/a"), ("POST", "/invocations"), ("GET", "/openapi.json"),
     ("GET", "/metrics"), ("POST", "/scale_elastic_ep"), ("HEAD", "/health"), ("GET", "/health/"),
     ("GET", "/nonexistent")],
)  # fmt: skip
def test_every_path_but_the_liveness_probe_needs_the_key(monkeypatch, method, path):
    assert call({"method": method, "path": path}, monkeypatch=monkeypatch) == (401, False)


def test_the_liveness_probe_needs_no_key(monkeypatch):
    assert call({"method": "GET", "path": "/health"}, monkeypatch=monkeypatch) == (200, True)
    assert call({"method": "GET", "path": "/api/health", "root_path": "/api"}, monkeypatch=monkeypatch) == (200, True)


def test_a_websocket_without_the_key_is_closed_and_lifespan_passes(monkeypatch):
    assert call({"type": "websocket", "path": "/v1/realtime"}, monkeypatch=monkeypatch) == (1008, False)
    assert call({"type": "lifespan"}, monkeypatch=monkeypatch)[1] is True


def test_without_a_key_the_engine_refuses_to_start(monkeypatch):
    monkeypatch.setenv(vllm_auth.KEY_ENV, "")
    with pytest.raises(vllm_auth.KeyMissingError, match="VLLM_API_KEY is empty"):
        vllm_auth.RequireKey(lambda *a: None)


def test_every_engine_eksflow_starts_loads_the_middleware(tmp_path, monkeypatch):
    args = vllm.engine_args("/models/base", "base", 8000, vllm.EngineSettings())
    assert f"--middleware={vllm_auth.MIDDLEWARE}" in args
    assert not any(a.startswith("--api-key") for a in args)  # the key travels in the environment, never argv
    monkeypatch.setenv(engines.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    # Another interpreter (the engine's virtualenv) finds this eksflow first on its path, and nothing else of ours.
    env = vllm_process.engine_process_env({}, "/engines/vllm/bin/python", str(tmp_path))
    first, *rest = env["PYTHONPATH"].split(os.pathsep)
    assert [p.name for p in Path(first).iterdir()] == ["eksflow"] and rest == ["/elsewhere"]
    assert (Path(first) / "eksflow").resolve() == Path(vllm_auth.__file__).resolve().parents[3]
    found = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path[:0] = [{first!r}]; import {vllm_auth.__name__} as m; "
         "print(m.__file__)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(found.stdout.strip()).resolve() == Path(vllm_auth.__file__).resolve()
    # The interpreter running this one has eksflow already: its path is left as it is.
    assert vllm_process.engine_process_env({}, sys.executable, str(tmp_path))["PYTHONPATH"] == "/elsewhere"
