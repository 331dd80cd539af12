"""The one way traffic shifts: the routes file, read by the shipped callback in a real LiteLLM proxy.

The proxy runs from .venv-litellm on exactly the files the cluster's ConfigMap ships (config.yaml and
litellm_routes.py, pipelines/serving/objects.py), routing by a routes file written by the steps' RoutesFile. The
engines behind it are two small OpenAI-style servers that answer with the model name they were asked for: what is
under test is LiteLLM (weights per request, and the request sent to the adapter and fleet the file assigns to the
picked slot), measured on hundreds of requests in seconds; the real vLLM engine behind the same proxy is
tests/e2e/test_rollout.py's. These tests fail when a LiteLLM upgrade breaks either hook the callback relies on
(`_router_weights` before routing, the deployment hook after it).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from pipelines.serving import objects
from steps.common import litellm_proxy, litellm_routes
from tests.e2e.processes import free_port
from tests.flagship import config

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-lora"
BLUE, GREEN = litellm_proxy.slot_id(MODEL, "blue"), litellm_proxy.slot_id(MODEL, "green")
TOLERANCE_SE = 4.0  # binomial standard errors, as the canary's share_z rule
pytestmark = pytest.mark.slow


class Engine:
    """An OpenAI-style server answering each chat request with `<engine>:<model asked for>`, recording the asks."""

    def __init__(self, name: str, api_key: str) -> None:
        self.asked: list[str] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.headers.get("Authorization") != f"Bearer {api_key}":
                    self.send_error(401)
                    return
                engine.asked.append(body["model"])
                answer = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": f"{name}:{body['model']}"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Proxy:
    """LiteLLM on the shipped ConfigMap files, routing by `routes`."""

    def __init__(self, folder: Path, engines: dict[str, Engine], vllm_key: str) -> None:
        self.master_key = f"sk-{secrets.token_urlsafe(16)}"
        self.engines = engines
        self.routes = litellm_proxy.RoutesFile(folder / "fsx" / "routes.json", MODEL)
        for name, text in objects.proxy_config_map(config())["data"].items():
            (folder / name).write_text(text)
        self.port = free_port()
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": self.master_key,
            litellm_proxy.VLLM_KEY_ENV: vllm_key,
            litellm_routes.ROUTES_FILE_ENV: str(self.routes.path),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        self.log = folder / "proxy.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [str(ROOT / ".venv-litellm/bin/litellm"), "--config=config.yaml", f"--port={self.port}",
                 "--host=127.0.0.1", "--num_workers=1"],
                cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 300
        while not self._live():
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.5)

    def _live(self) -> bool:
        try:
            return requests.get(f"{self.url}/health/liveliness", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def ask(self) -> tuple[int, str, str]:
        """(status, the slot that answered, the answer) of one chat request to the public name."""
        response = requests.post(
            f"{self.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {self.master_key}"},
            timeout=60,
        )
        text = response.json()["choices"][0]["message"]["content"] if response.status_code == 200 else response.text
        return response.status_code, response.headers.get("x-litellm-model-id", ""), text

    def ask_many(self, count: int) -> list[tuple[int, str, str]]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda _: self.ask(), range(count)))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory) -> Iterator[Proxy]:
    vllm_key = secrets.token_urlsafe(16)
    engines = {name: Engine(name, vllm_key) for name in ("fleet-a", "fleet-b")}
    started = Proxy(tmp_path_factory.mktemp("proxy"), engines, vllm_key)
    try:
        yield started
    finally:
        started.stop()
        for engine in engines.values():
            engine.server.shutdown()


def test_shares_follow_the_weights_and_each_slot_reaches_its_assigned_adapter(proxy):
    fleet = proxy.engines["fleet-a"]
    proxy.routes.assign("blue", "llama-lora-v1-aaaaaaaa", fleet.url)
    proxy.routes.assign("green", "llama-lora-v2-bbbbbbbb", fleet.url)
    for green_percent, count in ((25, 400), (50, 200)):
        proxy.routes.set_weights(litellm_proxy.weights_for(MODEL, "blue", "green", green_percent))
        answers = proxy.ask_many(count)
        assert {status for status, _, _ in answers} == {200}, answers[:3]
        slots = Counter(slot for _, slot, _ in answers)
        share, weight = slots[GREEN] / count, green_percent / 100
        assert abs(share - weight) <= TOLERANCE_SE * math.sqrt(weight * (1 - weight) / count), slots
        # Every request went to the adapter its slot names, never to the slot's placeholder name.
        expected = {BLUE: "fleet-a:llama-lora-v1-aaaaaaaa", GREEN: "fleet-a:llama-lora-v2-bbbbbbbb"}
        assert all(text == expected[slot] for _, slot, text in answers), Counter(answers)


def test_a_change_applies_from_the_next_request_and_a_slot_can_move_to_another_fleet(proxy):
    proxy.routes.assign("green", "llama-lora-v3-cccccccc", proxy.engines["fleet-b"].url)
    proxy.routes.set_weights(litellm_proxy.weights_for(MODEL, "blue", "green", 100))
    assert proxy.ask() == (200, GREEN, "fleet-b:llama-lora-v3-cccccccc")
    proxy.routes.set_weights(litellm_proxy.weights_for(MODEL, "green", "blue", 100))
    assert {proxy.ask() for _ in range(20)} == {(200, BLUE, "fleet-a:llama-lora-v1-aaaaaaaa")}
