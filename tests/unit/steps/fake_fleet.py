"""A small fleet for the rollout steps' tests: vLLM-like replicas on their own ports, a proxy, the endpoints list.

Each Replica is a real HTTP server speaking the routes the steps use (/health, /metrics, /v1/models,
/v1/chat/completions, /v1/unload_lora_adapter). Like vLLM's filesystem resolver it loads an adapter the first time
a request names it, if the fleet's adapter folder publishes it, and answers 404 otherwise. The endpoints file is where
the local fleet keeps it (eksflow/llm/serving/fleet_endpoints.py), in the run folder $EKSFLOW_RUN_DIR names.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SERVICE = "llama-lora-vllm-0a1b2c3d"  # the fleet's Service, as prepare-fleet names it


def json_server(handle: Callable[[BaseHTTPRequestHandler, str, dict], tuple[int, dict, dict[str, str]]]) -> tuple:
    """A real HTTP server on 127.0.0.1 answering with `handle`'s (status, JSON body, headers); and its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._reply(*handle(self, "GET", {}))

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._reply(*handle(self, "POST", json.loads(body or b"{}")))

        def _reply(self, status: int, body: dict | str, headers: dict[str, str]) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class Replica:
    """One vLLM pod: the adapters it holds, its finished-request counter; every answer is `answer`."""

    def __init__(self, adapters_dir: Path, answer: str = "ok", loaded: Sequence[str] = ()) -> None:
        self.adapters_dir = adapters_dir
        self.answer = answer
        self.loaded: dict[str, str] = {name: str(adapters_dir / name) for name in loaded}
        self.finished = 0.0
        self.server, self.url = json_server(self._handle)

    def _handle(self, _: BaseHTTPRequestHandler, method: str, body: dict) -> tuple[int, dict | str, dict[str, str]]:
        path = _.path
        if path == "/health":
            return 200, {}, {}
        if path == "/metrics":
            return 200, f'vllm:request_success_total{{finished_reason="stop"}} {self.finished}\n', {}
        if path == "/v1/models":
            cards = [{"id": "base", "root": "/models/base"}]
            cards += [{"id": name, "parent": "base", "root": root} for name, root in self.loaded.items()]
            return 200, {"data": cards}, {}
        if path == "/v1/unload_lora_adapter" and method == "POST":
            self.loaded.pop(str(body.get("lora_name")), None)
            return 200, {}, {}
        if path == "/v1/chat/completions" and method == "POST":
            model = str(body.get("model"))
            if model != "base" and model not in self.loaded:
                if not (self.adapters_dir / model).is_dir():
                    return 404, {"error": f"no adapter {model}"}, {}
                self.loaded[model] = str(self.adapters_dir / model)  # resolved from the shared folder
            self.finished += 1
            return 200, {"choices": [{"message": {"role": "assistant", "content": self.answer}}]}, {}
        return 404, {}, {}

    def stop(self) -> None:
        """The pod is gone: nothing answers at its address any more."""
        self.server.shutdown()
        self.server.server_close()


class Proxy:
    """The public name's proxy: request i is answered from the candidate's slot when i % 10 == 0 (10 %), else the
    champion's; `during(i)` runs before request i is answered, and a True from it fails that request (500)."""

    def __init__(self, candidate: str, champion: str, during: Callable[[int], bool] = lambda i: False) -> None:
        self.count = 0
        self.lock = threading.Lock()
        self.slots = (candidate, champion)
        self.during = during
        self.server, self.url = json_server(self._handle)

    def _handle(self, _: BaseHTTPRequestHandler, method: str, body: dict) -> tuple[int, dict | str, dict[str, str]]:
        if _.path != "/v1/chat/completions":
            return (200, {}, {}) if _.path.startswith("/health") else (404, {}, {})
        with self.lock:
            i, self.count = self.count, self.count + 1
        if self.during(i):
            return 500, {"error": "upstream connection reset"}, {}
        answer = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
        return 200, answer, {"x-litellm-model-id": self.slots[0] if i % 10 == 0 else self.slots[1]}


def list_endpoints(run_dir: Path, pods: Sequence[tuple[str, str, Replica]]) -> None:
    """The fleet Service's endpoints where the local fleet keeps them: (pod, node, replica) each, all ready.

    Written out as the EndpointSliceList the Kubernetes API answers (one slice per port), in one rename.
    """
    items = []
    for pod, node, replica in pods:
        host, port = replica.url.removeprefix("http://").rsplit(":", 1)
        endpoint = {"addresses": [host], "conditions": {"ready": True}, "nodeName": node, "targetRef": {"name": pod}}
        items.append({"ports": [{"name": "http", "port": int(port)}], "endpoints": [endpoint]})
    path = run_dir / "fleet" / "endpoints" / f"{SERVICE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps({"kind": "EndpointSliceList", "items": items}))
    path.with_suffix(".tmp").replace(path)


def registry(root: Path, model: str, rows: int = 4) -> str:
    """A sqlite registry: versions 1 and 2 of `model`, each with evaluate's report (rows answered "ok")."""
    from eksflow.llm.steps.common import tracking

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = tracking.client(uri)
    experiment = client.create_experiment("rollout", artifact_location=(root / "artifacts").as_uri())
    report = root / "eval_report.json"
    report.write_text(
        json.dumps({"rows": [{"prompt": f"p{i}", "reference": "ok", "exact_match": 1.0} for i in range(rows)]})
    )
    client.create_registered_model(model)
    for _ in range(2):
        run_id = client.create_run(experiment).info.run_id
        assert tracking.log_files(uri, run_id, [report], "eval")
        client.create_model_version(model, f"runs:/{run_id}/adapter", run_id=run_id)
    return uri
