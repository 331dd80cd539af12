"""The one way traffic shifts: the routes file, read by the shipped callback in a real LiteLLM proxy.

The proxy runs from its own virtualenv (eksflow.llm.engines) on exactly the files the cluster's ConfigMap ships
(config.yaml and litellm_routes.py, eksflow/llm/serving/objects.py), routing by a routes file written by the steps'
RoutesFile. The engines behind it are two small OpenAI-style servers that answer with the model name they were asked
for: what is under test is LiteLLM (weights per request, and the request sent to the adapter and fleet the file assigns
to the picked slot), measured on hundreds of requests in seconds; the real vLLM engine behind the same proxy is
tests/e2e/test_rollout.py's. These tests fail when a LiteLLM upgrade breaks either hook the callback relies on
(`_router_weights` before routing, the deployment hook after it). The callback sends nothing to an address outside its
fleet (EKSFLOW_UPSTREAMS) and keeps the last good routes when the file is damaged; the proxy a run's local fleet starts
never routes by the routes file an earlier run left, and is not ready until the run routes the name.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from eksflow.llm.engines import ENGINES
from eksflow.llm.engines import command as engine_program
from eksflow.llm.serving import objects
from eksflow.llm.serving.local_fleet import LocalFleet
from eksflow.llm.steps.common import litellm_proxy, litellm_routes, rollout
from eksflow.runtime.ports import free_port
from tests.flagship import config

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-lora"
BLUE, GREEN = litellm_proxy.slot_id(MODEL, "blue"), litellm_proxy.slot_id(MODEL, "green")
TOLERANCE_SE = 4.0  # binomial standard errors, as the canary's share_z rule
pytestmark = pytest.mark.slow


class Engine:
    """An OpenAI-style server answering each chat request with `<engine>:<model asked for>`, recording the asks.

    `requests` records every request that reached it, as (path, Authorization header), before any check.
    """

    def __init__(self, name: str, api_key: str, port: int = 0) -> None:
        self.asked: list[str] = []
        self.requests: list[tuple[str, str]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                engine.requests.append((self.path, self.headers.get("Authorization", "")))
                self.send_error(404)

            def do_POST(self) -> None:
                engine.requests.append((self.path, self.headers.get("Authorization", "")))
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

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
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
            litellm_routes.UPSTREAMS_ENV: "|".join(re.escape(e.url) for e in engines.values()),  # the fleet's
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        self.log = folder / "proxy.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [engine_program(ENGINES["litellm"]), "--config=config.yaml", f"--port={self.port}",
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
        return ask(self.url, self.master_key)

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


def ask(url: str, master_key: str) -> tuple[int, str, str]:
    """(status, the slot that answered, the answer or the error) of one chat request to the public name."""
    response = requests.post(
        f"{url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"Authorization": f"Bearer {master_key}"},
        timeout=60,
    )
    text = response.json()["choices"][0]["message"]["content"] if response.status_code == 200 else response.text
    return response.status_code, response.headers.get("x-litellm-model-id", ""), text


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


DAMAGED = {
    "truncated": '{"llama-lora": {"llama-lora-blue": {"wei',
    "empty": "",
    "list": "[]",
    "null-slot": '{"llama-lora": {"llama-lora-blue": null}}',
    "weight-text": '{"llama-lora": {"llama-lora-blue": {"weight": "abc"}}}',
    "weight-nan": '{"llama-lora": {"llama-lora-blue": {"weight": NaN}}}',
    "weight-negative": '{"llama-lora": {"llama-lora-blue": {"weight": -1}}}',
}


def replace(path: Path, text: str) -> None:
    """Write the routes file in one rename, as the steps do."""
    tmp = path.with_name(".routes.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_a_damaged_routes_file_keeps_the_last_good_routes_with_one_log_line_each(proxy):
    proxy.routes.assign("blue", "llama-lora-v1-aaaaaaaa", proxy.engines["fleet-a"].url)
    proxy.routes.set_weights(litellm_proxy.weights_for(MODEL, "green", "blue", 100))
    good = (200, BLUE, "fleet-a:llama-lora-v1-aaaaaaaa")
    assert proxy.ask() == good
    path, text = proxy.routes.path, proxy.routes.path.read_text()
    for damage in DAMAGED.values():
        replace(path, damage)
        assert [proxy.ask() for _ in range(3)] == [good] * 3, damage
    path.unlink()
    path.mkdir()  # a folder in place of the file
    assert [proxy.ask() for _ in range(3)] == [good] * 3
    path.rmdir()
    replace(path, text)
    assert proxy.ask() == good
    damaged = [line for line in proxy.log.read_text().splitlines() if " is damaged (" in line]
    assert len(damaged) == len(DAMAGED) + 1, damaged  # one line per problem, not one per request
    assert all(line.startswith(f"eksflow routes: routes file {path} is damaged (") for line in damaged), damaged
    assert all(line.endswith("routing by the last good routes") for line in damaged), damaged


def test_a_slot_naming_an_address_outside_the_fleet_gets_no_request_nor_key(proxy):
    stranger = Engine("stranger", "any")  # listening, but not one of the fleet's engines
    try:
        proxy.routes.assign("green", "llama-lora-v2-bbbbbbbb", stranger.url)
        for green_percent in (50, 100):
            proxy.routes.set_weights(litellm_proxy.weights_for(MODEL, "blue", "green", green_percent))
            answers = proxy.ask_many(20)
            assert {a for a in answers if a[0] == 200} <= {(200, BLUE, "fleet-a:llama-lora-v1-aaaaaaaa")}, answers
        assert {status for status, _, _ in answers} == {503}  # nothing routes the name at 100 % to the stranger
        assert stranger.requests == []
    finally:
        stranger.server.shutdown()


def test_a_runs_proxy_never_routes_by_the_routes_file_an_earlier_run_left(tmp_path):
    """The stale routes of every local run: the last run's file names its engine's port, where another process
    listens now. The proxy the run's fleet starts sends it nothing (no key either), refuses the public name and is
    not ready until the run routes the name to its own engine; then it answers from there."""
    cfg = config()
    claim = tmp_path / "state" / "volumes" / cfg.storage.fsx_claim
    routes_file = claim / Path(objects.routes_file(cfg)).relative_to(cfg.storage.fsx_mount)
    listener = Engine("listener", "any")  # on the port the earlier run's engine had
    stale = {"weight": 100.0, "adapter": "llama-lora-v1-aaaaaaaa", "api_base": f"{listener.url}/v1"}
    routes_file.parent.mkdir(parents=True)
    routes_file.write_text(json.dumps({MODEL: {BLUE: stale}}))
    fleet = LocalFleet(tmp_path / "state", tmp_path / "run", ROOT)
    engine: Engine | None = None
    try:
        notes = [fleet.apply(obj, obj["kind"], lambda: "") for obj in objects.proxy_objects(cfg)]
        assert "started; not ready" in notes[1] and "refuses 'llama-lora' (503)" in notes[1], notes[1]
        assert not routes_file.exists()  # the new proxy's routes start empty, as a new fleet's
        replace(routes_file, json.dumps({MODEL: {BLUE: stale}}))  # and a file naming another address is refused
        proxy = fleet._processes[objects.proxy_name(cfg)]
        url = f"http://127.0.0.1:{proxy.port}"
        keys = tmp_path / "run" / "volumes" / cfg.serving.secret
        master_key = (keys / rollout.MASTER_KEY_FILE).read_text()
        vllm_key = (keys / rollout.VLLM_KEY_FILE).read_text()

        def probe() -> subprocess.CompletedProcess[str]:
            """The pod's readiness probe: the shipped callback file run as a script, in the proxy's environment."""
            command = objects.proxy_deployment(cfg)["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
            callback, public, _ = command["exec"]["command"][1:]
            routes, upstreams = proxy.routes
            env = {**os.environ, litellm_routes.ROUTES_FILE_ENV: routes, litellm_routes.UPSTREAMS_ENV: upstreams,
                   "TMPDIR": str(tmp_path)}  # fmt: skip
            script = tmp_path / "run" / "fleet" / objects.proxy_name(cfg) / "config" / Path(callback).name
            argv = [sys.executable, str(script), public, str(proxy.port)]
            return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)

        refused = [ask(url, master_key) for _ in range(10)]
        assert {status for status, _, _ in refused} == {503}, refused
        assert "is not routed to an engine of this fleet" in refused[0][2]
        not_ready = probe()
        assert not_ready.returncode == 1 and "not an engine of this fleet" in not_ready.stderr, not_ready.stderr
        # serve-champion: the champion on this run's engine, with all the traffic; it starts after the proxy, on a
        # port of the run's (engine_ports.py), which the fleet lends it as it does starting an engine.
        engine = Engine("engine", vllm_key, port=fleet._ports.take("llama-lora-vllm", "vllm"))
        routes = litellm_proxy.RoutesFile(routes_file, MODEL)
        routes.assign("blue", "llama-lora-v2-bbbbbbbb", engine.url)
        routes.set_weights(litellm_proxy.weights_for(MODEL, "blue", "green", 0))
        assert [ask(url, master_key) for _ in range(5)] == [(200, BLUE, "engine:llama-lora-v2-bbbbbbbb")] * 5
        assert probe().returncode == 0
        assert listener.requests == []  # not one request, so never the run's vLLM key
        assert all(auth == f"Bearer {vllm_key}" for _, auth in engine.requests)
    finally:
        fleet.stop()
        listener.server.shutdown()
        if engine is not None:
            engine.server.shutdown()
