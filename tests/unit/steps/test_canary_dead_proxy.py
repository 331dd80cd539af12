"""A LiteLLM proxy that dies during a canary is named as the cause, as a dead engine is: in the failing analysis and
in the exit handler's line, with the engine said to be up. A real sqlite registry, a small live OpenAI-style engine
and a port nothing listens on as the proxy."""

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eksflow.llm.steps import canary, finish_rollout
from eksflow.llm.steps.canary import step as canary_step
from eksflow.llm.steps.canary import traffic
from eksflow.llm.steps.common import litellm_proxy, rollout, tracking
from eksflow.runtime.args import StepFailedError
from tests.unit.steps import test_canary_probes

MODEL = "llama-lora"
STATE = test_canary_probes.STATE.model_copy(update={"percent": 10, "stage": "shift-10"})


class Engine:
    """Alive: /health answers 200, every chat request is answered "ok" (the probes' reference)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(200 if self.path == "/health" else 404, {})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/chat/completions":
                    self._answer(404, {})
                    return
                self._answer(200, {"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> str:
    """Versions 1 and 2, each with evaluate's report (four rows answered "ok")."""
    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = tracking.client(uri)
    experiment = client.create_experiment("rollout", artifact_location=(root / "artifacts").as_uri())
    report = root / "eval_report.json"
    report.write_text(
        json.dumps({"rows": [{"prompt": f"p{i}", "reference": "ok", "exact_match": 1.0} for i in range(4)]})
    )
    client.create_registered_model(MODEL)
    for _ in range(2):
        run_id = client.create_run(experiment).info.run_id
        assert tracking.log_files(uri, run_id, [report], "eval")
        client.create_model_version(MODEL, f"runs:/{run_id}/adapter", run_id=run_id)
    return uri


@pytest.fixture
def fleet(tmp_path, registry) -> Iterator[dict]:
    """The fleet's arguments: a live engine, a dead proxy (nothing listens on its port), the routes assigned."""
    engine = Engine()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    values = {
        "model_name": MODEL,
        "tracking_uri": registry,
        "vllm_url": engine.url,
        "proxy_url": dead,
        "secrets_dir": tmp_path / "secrets",
        "serving_dir": tmp_path / "adapters",
        "routes_file": tmp_path / "routes.json",
        "state_file": tmp_path / "rollout" / "state.json",
    }
    routes = litellm_proxy.RoutesFile(values["routes_file"], MODEL)
    routes.assign("blue", STATE.champion_adapter, engine.url)
    routes.assign("green", STATE.candidate_adapter, engine.url)
    routes.set_weights(litellm_proxy.weights_for(MODEL, "blue", "green", 10))
    rollout.write_state(values["state_file"], STATE)
    try:
        yield values
    finally:
        engine.server.shutdown()


def test_the_failing_analysis_names_the_dead_proxy_first(fleet, tmp_path):
    args = canary.Args.model_validate({**fleet, "percent": 10, "report_dir": tmp_path / "reports", "probe_rows": 4})
    with pytest.raises(StepFailedError) as failed:
        canary_step.run(args)
    message = str(failed.value)
    proxy = f"the LiteLLM proxy at {fleet['proxy_url']} does not answer"
    assert message.startswith(f"canary analysis at 10% failed for v2: {proxy}"), message
    assert "vLLM engine" not in message and "error_rate" in message  # the effects follow the cause
    assert proxy in rollout.read_state(args.state_file).failure  # what the exit handler tags the version with


def test_the_pre_traffic_analysis_sends_nothing_through_the_proxy_so_never_blames_it(fleet, tmp_path):
    args = canary.Args.model_validate({**fleet, "percent": 0, "report_dir": tmp_path / "reports"})
    assert traffic.component_down(args) == ""


def test_the_exit_handler_says_the_proxy_died_and_the_engine_is_up(fleet, capsys):
    args = finish_rollout.Args.model_validate({**fleet, "workflow_status": "Failed"})
    out = finish_rollout.run(args)
    assert out.phase == "Degraded" and out.champion_serving == "false"
    line = next(x for x in capsys.readouterr().err.splitlines() if "NOT serving" in x)
    assert f"(the LiteLLM proxy at {fleet['proxy_url']} does not answer" in line, line
    assert "the engine is up" in line and "restarts the engine" not in line, line


def test_without_a_champion_the_failed_candidate_loses_the_public_names_traffic(fleet, capsys):
    rollout.write_state(fleet["state_file"], STATE.model_copy(update={"champion_slot": None, "champion_version": ""}))
    routes = litellm_proxy.RoutesFile(Path(fleet["routes_file"]), MODEL)
    routes.set_weights(litellm_proxy.weights_for(MODEL, None, "green", 100))
    finish_rollout.run(finish_rollout.Args.model_validate({**fleet, "workflow_status": "Failed"}))
    assert {slot: route["weight"] for slot, route in routes.read()[MODEL].items()} == {
        "llama-lora-blue": 0.0,
        "llama-lora-green": 0.0,
    }
    assert "no champion to serve" in capsys.readouterr().err


def test_waiting_for_the_route_through_a_dead_proxy_names_the_proxy(fleet):
    args = rollout.FleetArgs.model_validate(fleet)
    with pytest.raises(StepFailedError) as failed:
        rollout.wait_routed(args, "blue", timeout_s=0)
    assert str(failed.value).startswith(
        f"the public name 'llama-lora' is not answered from llama-lora-blue through the proxy after 0 s "
        f"(the LiteLLM proxy at {fleet['proxy_url']} does not answer (ConnectionError)"
    ), failed.value
