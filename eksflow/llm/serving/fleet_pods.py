"""A serving Deployment's pod as this machine runs it: which process, how it starts and ends, its readiness probes.

The readiness checks speak plain HTTP (urllib) rather than use the steps' clients: of the steps, the fleet imports
only constants (the readiness prompt, the resolver's variable) and the engine's process (vllm_process).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eksflow.errors import EXIT_FAILED
from eksflow.llm.steps.common.vllm import ENGINE_MODULE as VLLM_MODULE
from eksflow.llm.steps.common.vllm import READY_PROMPT
from eksflow.local import ProcessTracker, RunServiceError

_ERROR = re.compile(r"(?:^|[\s:])[\w.]*(?:Error|Exception)\b|\bERROR\b|\berror:")  # what `error_line` looks for
_TAIL_BYTES = 65536


class FleetError(RunServiceError):
    """An object the local fleet cannot run, or a process that failed; `retriable` False for manifest errors."""

    label = "fleet error"
    exit_code = EXIT_FAILED


def container(manifest: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The Deployment's one container (a pod of several cannot run here)."""
    pod = (((manifest.get("spec") or {}).get("template") or {}).get("spec")) or {}
    containers = pod.get("containers") or []
    if len(containers) != 1:
        raise FleetError(f"{where}: a Deployment runs locally with exactly one container", retriable=False)
    return dict(containers[0])


def role(container: Mapping[str, Any], where: str) -> str:
    """What the container runs, by its command: "vllm" or "litellm"; anything else is refused."""
    command = [str(c) for c in container.get("command") or []]
    if command[-2:] == ["-m", VLLM_MODULE]:
        return "vllm"
    if command and os.path.basename(command[0]) == "litellm":
        return "litellm"
    raise FleetError(
        f"{where}: a Deployment runs locally only as a vLLM engine (python3 -m {VLLM_MODULE}) or a LiteLLM proxy "
        f"(litellm), got command {command}; submit this workflow to a cluster",
        retriable=False,
    )


def gpu_request(container: Mapping[str, Any]) -> int:
    """The NVIDIA GPUs the container asks for (requests or limits)."""
    resources = container.get("resources") or {}
    return max(int(str((resources.get(k) or {}).get("nvidia.com/gpu", 0))) for k in ("requests", "limits"))


def container_port(container: Mapping[str, Any]) -> int:
    """The port the container listens on (its first containerPort; vLLM's 8000 where it names none)."""
    ports = container.get("ports") or [{}]
    return int(ports[0].get("containerPort", 8000))


def request(url: str, api_key: str = "", payload: object = None, timeout_s: float = 60) -> tuple[int, bytes]:
    """(status, body) of one HTTP request; status 0 when nothing answered."""
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as err:
        return err.code, b""
    except (OSError, ValueError):
        return 0, b""


def status(url: str) -> int:
    """The HTTP status of GET `url` within 5 s; 0 when nothing answered."""
    return request(url, timeout_s=5)[0]


def models(base: str, api_key: str) -> list[dict[str, Any]] | None:
    """GET /v1/models: the base model's card and the adapters', or None while the engine does not answer."""
    answered, body = request(f"{base}/v1/models", api_key, timeout_s=30)
    try:
        return [dict(card) for card in json.loads(body)["data"]] if answered == 200 else None
    except (ValueError, KeyError, TypeError):
        return None


def generates(base: str, model: str, api_key: str) -> bool:
    """The readiness probe's check: a real (greedy, 2-token) chat completion with a non-empty answer."""
    chat = {"model": model, "messages": [{"role": "user", "content": READY_PROMPT}], "temperature": 0}
    answered, body = request(f"{base}/v1/chat/completions", api_key, {**chat, "max_tokens": 2}, timeout_s=120)
    try:
        return answered == 200 and bool(str(json.loads(body)["choices"][0]["message"]["content"] or "").strip())
    except (ValueError, KeyError, IndexError, TypeError):
        return False


def ready(role: str, base: str, model: str, api_key: str) -> bool:
    """A pod's readiness probe: a real generation (vLLM) or /health/liveliness (the proxy)."""
    if role == "vllm":
        return generates(base, model, api_key)
    return status(f"{base}/health/liveliness") == 200


def error_line(lines: Sequence[str]) -> str:
    """The line of a process's output that says why it ended: its last error line, else its last line ("" if none).

    An error line: a Python exception (`ImportError: ...`), an `ERROR` log line or an `error:` message.
    """
    said = [line.strip() for line in lines if line.strip()]
    return next((line for line in reversed(said) if _ERROR.search(line)), said[-1] if said else "")


def log_since(log: Path, start: int) -> list[str]:
    """The lines a process wrote to `log` after its first `start` bytes (the last 64 KiB of them at most)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(start, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []


def spawn(
    argv: list[str], cwd: Path, env: Mapping[str, str], log: Path, tracker: ProcessTracker | None
) -> subprocess.Popen[bytes]:
    """Start a fleet process in its own session (stopped as a group, spared Ctrl-C), told to the run's watchdog."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            argv, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    if tracker is not None:
        tracker.started(log.stem, popen.pid)
    return popen


def end(popen: subprocess.Popen[bytes], tracker: ProcessTracker | None, grace_s: float) -> None:
    """Wait up to `grace_s` for a process told to stop, then kill what is left of its group (engine workers too)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()
    if tracker is not None:
        tracker.ended(popen.pid)
