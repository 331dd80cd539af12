"""Serve a registered model with a real OpenAI-compatible server and talk to it like a client would.

Locally the server is `transformers serve <model_dir>` (transformers[serving]); in the cluster it is vLLM. Both
answer the same requests:

    GET  /health                -> 200 {"status": "ok"} once the model is loaded
    GET  /v1/models             -> {"data": [{"id": "<model id>", ...}]}; a server pinned to one model lists it alone
    POST /v1/chat/completions   {"model": "<model id>", "messages": [{"role": "user", "content": "..."}],
                                 "temperature": 0, "max_tokens": 32}
                                -> {"choices": [{"message": {"role": "assistant", "content": "..."},
                                                 "finish_reason": "stop" | "length"}], "usage": {...}, ...}

`transformers serve` pinned to a folder names the model by the path exactly as given on its command line and
answers 400 to any other "model"; the client reads the id from /v1/models instead of guessing it. /health alone
proves little (vLLM is healthy while generation is broken), so readiness is a real chat completion.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eksflow.runtime.args import StepFailedError

LOG_TAIL_LINES = 20
MODEL_MARKER = "config.json"


class ServingError(StepFailedError):
    """The model server failed to start, died, or answered with an error; the message says which and why."""


@dataclass(frozen=True)
class RunningServer:
    """A started, healthy model server."""

    process: subprocess.Popen[bytes]
    base_url: str  # http://host:port
    model: str  # the id the server answers to, from /v1/models
    log_path: Path

    @property
    def chat_url(self) -> str:
        """The OpenAI-style chat completions endpoint."""
        return f"{self.base_url}/v1/chat/completions"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_command(model_dir: Path, host: str, port: int) -> list[str]:
    """`transformers serve` pinned to `model_dir`: the model loads before the server accepts requests."""
    # The console script installed next to this interpreter, so a virtualenv need not be on PATH.
    beside = Path(sys.executable).with_name("transformers")
    cli = str(beside) if beside.is_file() else shutil.which("transformers")
    if cli is None:
        raise ServingError("the `transformers` command is missing; install transformers[serving] (pip install -e .)")
    return [cli, "serve", str(model_dir), "--host", host, "--port", str(port)]


@contextmanager
def model_server(
    model_dir: Path, *, host: str, port: int, startup_timeout_s: float, log_path: Path
) -> Iterator[RunningServer]:
    """Start a server for `model_dir`, wait until it is healthy, yield it, and always stop it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # nothing is ever fetched from a model hub at serve time
    with open(log_path, "ab") as log:
        # Own session: Ctrl-C in a terminal reaches only us, and we stop the server in order.
        process = subprocess.Popen(
            server_command(model_dir, host, port), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        base_url = f"http://{host}:{port}"
        wait_healthy(process, base_url, startup_timeout_s, log_path)
        yield RunningServer(process, base_url, served_model(base_url), log_path)
    finally:
        stop(process)


def wait_healthy(process: subprocess.Popen[bytes], base_url: str, timeout_s: float, log_path: Path) -> None:
    """Poll GET /health until 200; fail early with the log's last lines if the process dies."""
    import requests

    deadline = time.monotonic() + timeout_s
    while True:
        code = process.poll()
        if code is not None:
            raise ServingError(f"model server exited with code {code} before it was healthy; {log_tail(log_path)}")
        try:
            if requests.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass  # not listening yet: the model is still loading
        if time.monotonic() > deadline:
            raise ServingError(
                f"model server at {base_url} not healthy after {timeout_s:.0f} s (startup_timeout_s); "
                f"raise it for larger models; {log_tail(log_path)}"
            )
        time.sleep(0.5)


def served_model(base_url: str) -> str:
    """The model id to put in requests: the first entry of GET /v1/models."""
    body = _json(base_url, "GET", "/v1/models", None, timeout_s=30)
    models = body.get("data") or []
    if not models:
        raise ServingError(f"{base_url}/v1/models lists no model: {body!r}")
    return str(models[0]["id"])


def chat(server: RunningServer, prompt: str, *, max_tokens: int = 32, timeout_s: float = 300) -> str:
    """One greedy (temperature 0) chat completion; returns the assistant's text."""
    request = {
        "model": server.model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    body = _json(server.base_url, "POST", "/v1/chat/completions", request, timeout_s=timeout_s)
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as err:
        raise ServingError(f"unexpected chat completion response from {server.chat_url}: {body!r}") from err
    return str(content or "").strip()


def stop(process: subprocess.Popen[Any], grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: the server never outlives the step."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def download_version(tracking_uri: str, model_name: str, version: str, serve_dir: Path) -> Path:
    """Download the "model" artifact of a registered version into `serve_dir/<name>-v<version>` (once)."""
    import mlflow

    from steps.common import tracking

    target = serve_dir / f"{model_name}-v{version}"
    if (target / MODEL_MARKER).is_file():
        return target  # versions are immutable: a complete earlier download is the same model
    tracking.configure(tracking_uri)
    serve_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=serve_dir))
    try:
        local = Path(
            mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_name}/{version}", dst_path=str(tmp))
        )
        if not (local / MODEL_MARKER).is_file():
            raise ServingError(
                f"models:/{model_name}/{version} holds no {MODEL_MARKER}; was it registered by steps.register "
                "(which logs a merged model as artifact 'model')?"
            )
        shutil.rmtree(target, ignore_errors=True)
        os.replace(local, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a server log, for error messages."""
    try:
        tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"no log at {log_path}"
    return f"last {len(tail)} lines of {log_path}:\n" + "\n".join(tail)


def _json(base_url: str, method: str, path: str, payload: dict[str, Any] | None, *, timeout_s: float) -> dict[str, Any]:
    import requests

    url = f"{base_url}{path}"
    try:
        response = requests.request(method, url, json=payload, timeout=timeout_s)
    except requests.RequestException as err:
        raise ServingError(f"{method} {url} failed: {err}") from err
    if response.status_code != 200:
        raise ServingError(f"{method} {url} answered {response.status_code}: {response.text[:500]}")
    body = response.json()
    if not isinstance(body, dict):
        raise ServingError(f"{method} {url} answered non-object JSON: {body!r}")
    return body
