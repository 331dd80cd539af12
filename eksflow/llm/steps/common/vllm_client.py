"""The HTTP client of a running vLLM engine: chat completions, liveness, readiness, adapters served, metrics.

`chat` and `server_down` also ask the LiteLLM proxy in front of the engines (the same OpenAI API). What the engine
is asked to serve is vllm.py's; how its process lives, and what its log says, vllm_process.py's.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common.vllm import READY_PROMPT, ServingError
from eksflow.llm.steps.common.vllm_process import log_excerpt

# What a model is asked: one user turn (a str), or a whole conversation's history in OpenAI's chat shape.
Prompt = str | Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Answer:
    """One chat completion as a client saw it."""

    status: int  # HTTP status; 0 when no answer came (connection refused, timeout)
    text: str
    latency_s: float
    served_by: str = ""  # the proxy's x-litellm-model-id header: which deployment answered
    error: str = ""

    @property
    def ok(self) -> bool:
        """A 200 with a non-empty answer."""
        return self.status == 200 and bool(self.text.strip())


def chat(
    base_url: str, model: str, prompt: Prompt, *, api_key: str = "", max_tokens: int = 16, timeout_s: float = 120
) -> Answer:
    """One greedy (temperature 0) chat completion of `prompt`; never raises for an HTTP or transport failure.

    A history is sent whole: the server (vLLM) renders it with the model's chat template, the one training used.
    """
    import requests

    request = {
        "model": model,
        "messages": chat_messages(prompt),
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    started = time.monotonic()
    try:
        response = requests.post(
            f"{base_url}/v1/chat/completions", json=request, headers=_auth(api_key), timeout=timeout_s
        )
    except requests.RequestException as err:
        return Answer(0, "", time.monotonic() - started, error=f"{type(err).__name__}: {err}"[:300])
    latency = time.monotonic() - started
    served_by = response.headers.get("x-litellm-model-id", "")
    if response.status_code != 200:
        return Answer(response.status_code, "", latency, served_by, response.text[:300])
    try:
        text = str(response.json()["choices"][0]["message"]["content"] or "").strip()
    except (ValueError, KeyError, IndexError, TypeError) as err:
        return Answer(response.status_code, "", latency, served_by, f"unexpected response: {err!r}")
    return Answer(200, text, latency, served_by)


def chat_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """`prompt` as the messages of a chat completion request: a str is one user turn."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(message) for message in prompt]


def engine_down(base_url: str, timeout_s: float = 5) -> str:
    """Why the engine at `base_url` is not running ("" when its liveness route answers 200)."""
    return server_down("the vLLM engine", base_url, "/health", timeout_s)


def server_down(what: str, base_url: str, liveness: str, timeout_s: float = 5) -> str:
    """Why `what` at `base_url` is not running ("" when its `liveness` route answers 200), in one line naming it."""
    import requests

    try:
        response = requests.get(f"{base_url}{liveness}", timeout=timeout_s)
    except requests.RequestException as err:
        return f"{what} at {base_url} does not answer ({type(err).__name__}): it died or is unreachable"
    if response.status_code != 200:
        return f"{what} at {base_url} is unhealthy ({liveness} answered {response.status_code})"
    return ""


def unload_adapter(base_url: str, name: str, *, api_key: str = "") -> bool:
    """Unload adapter `name`; False if it was not loaded."""
    if name not in loaded_adapters(base_url, api_key=api_key):
        return False
    _post(base_url, "/v1/unload_lora_adapter", {"lora_name": name}, api_key)
    return True


def loaded_adapters(base_url: str, *, api_key: str = "") -> dict[str, str]:
    """Adapter name -> path of every adapter the engine serves (GET /v1/models lists them after the base)."""
    return {str(card["id"]): str(card.get("root", "")) for card in _models(base_url, api_key) if card.get("parent")}


def served_names(base_url: str, *, api_key: str = "") -> set[str]:
    """Every name the engine answers to (GET /v1/models): its model's served name and its adapters'."""
    return {str(card["id"]) for card in _models(base_url, api_key)}


def base_model_card(base_url: str, *, api_key: str = "") -> dict[str, Any] | None:
    """The engine's base model entry of GET /v1/models (id = served name, root = the folder), or None."""
    return next((card for card in _models(base_url, api_key) if not card.get("parent")), None)


def _models(base_url: str, api_key: str) -> list[dict[str, Any]]:
    import requests

    try:
        response = requests.get(f"{base_url}/v1/models", headers=_auth(api_key), timeout=30)
        response.raise_for_status()
        return [dict(card) for card in response.json()["data"]]
    except (requests.RequestException, ValueError, KeyError, TypeError) as err:
        raise ServingError(f"GET {base_url}/v1/models failed: {err}") from err


def metrics_text(base_url: str, *, api_key: str = "") -> str:
    """The engine's Prometheus metrics (GET /metrics), as text."""
    import requests

    try:
        response = requests.get(f"{base_url}/metrics", headers=_auth(api_key), timeout=30)
        response.raise_for_status()
    except requests.RequestException as err:
        raise ServingError(f"GET {base_url}/metrics failed: {err}") from err
    return response.text


def wait_ready(
    base_url: str,
    model: str,
    *,
    api_key: str = "",
    timeout_s: float,
    process: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
    prompt: Prompt = READY_PROMPT,
    max_tokens: int = 2,
) -> Answer:
    """Poll until `model` answers `prompt` with a real generation (not /health); fail early if `process` dies."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise ServingError(
                f"vLLM exited with code {process.returncode} before it answered; {log_excerpt(log_path)}"
            )
        answer = chat(base_url, model, prompt, api_key=api_key, max_tokens=max_tokens, timeout_s=60)
        if answer.ok:
            return answer
        if time.monotonic() > deadline:
            raise ServingError(
                f"vLLM at {base_url} gave no answer for {model!r} within {timeout_s:.0f} s "
                f"(serving.engine.startup_timeout_s); last: {answer.error or answer.status}; {log_excerpt(log_path)}"
            )
        time.sleep(1.0)


def _auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _post(base_url: str, path: str, payload: dict[str, Any], api_key: str) -> None:
    import requests

    try:
        response = requests.post(f"{base_url}{path}", json=payload, headers=_auth(api_key), timeout=120)
    except requests.RequestException as err:
        raise ServingError(f"POST {base_url}{path} failed: {err}") from err
    if response.status_code != 200:
        raise ServingError(f"POST {base_url}{path} answered {response.status_code}: {response.text[:300]}")
