"""The canary asks a conversation's probe row with the whole history evaluate asked, through /v1/chat/completions
(vLLM renders it with the model's chat template, the one training and evaluate used); a pair's row as one user turn,
as before. The analysis is the real one (canary_step.run) against a real sqlite registry holding evaluate's report
and a small live OpenAI-style server that records each request's messages and answer cap."""

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from eksflow.llm.steps import canary
from eksflow.llm.steps.canary import step as canary_step
from eksflow.llm.steps.canary import traffic
from eksflow.llm.steps.common import rollout, tracking
from eksflow.llm.steps.evaluate.report import REPORT_ARTIFACT, REPORT_FILE
from tests.unit.steps import test_canary_probes
from tests.unit.steps.fake_fleet import json_server

MODEL = "llama-lora"
HISTORY = [
    {"role": "system", "content": "Answer in SQL."},
    {"role": "user", "content": "How many orders are there?"},
    {"role": "assistant", "content": "SELECT count(*) FROM orders"},
    {"role": "user", "content": "And how many did Ada place?"},
]
PAIR = [{"role": "user", "content": "What is 2 + 2?"}]  # a pair's row: its prompt, one user turn
ROWS = [
    {"prompt": "system: Answer in SQL.\nuser: ...", "messages": HISTORY, "reference": "SELECT 1", "exact_match": 1.0},
    {"prompt": "What is 2 + 2?", "reference": "4", "exact_match": 1.0},
]

ANSWERS = {json.dumps(HISTORY): "SELECT 1", json.dumps(PAIR): "4"}
EVALUATED_CAP = 12  # the answer cap evaluate generated under, as its report records it


class Recorder:
    """An OpenAI-style server: /health answers, every chat completion is answered and its messages kept.

    The answer is the reference only for the messages evaluate asked: a history cut short is answered wrong."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[dict]]] = []  # (model, messages) of each chat completion
        self.caps: list[int] = []  # the max_tokens of each
        self.server, self.url = json_server(self._handle)

    def _handle(self, request: BaseHTTPRequestHandler, method: str, body: dict) -> tuple[int, dict, dict[str, str]]:
        if method == "GET":
            return (200 if request.path == "/health" else 404), {}, {}
        messages = body["messages"]
        self.asked.append((body["model"], messages))
        self.caps.append(body["max_tokens"])
        answer = ANSWERS.get(json.dumps(messages), "no idea")  # right only when asked what evaluate asked
        return 200, {"choices": [{"message": {"role": "assistant", "content": answer}}]}, {}


@pytest.fixture
def fleet(tmp_path) -> Iterator[tuple[dict, Recorder, Recorder]]:
    """Versions 1 (the champion) and 2 (the candidate) of MODEL, evaluated on a conversation's row and a pair's."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    experiment = client.create_experiment("rollout", artifact_location=(tmp_path / "artifacts").as_uri())
    report = tmp_path / REPORT_FILE
    report.write_text(json.dumps({"task_metrics": ["exact_match"], "rows": ROWS, "max_new_tokens": EVALUATED_CAP}))
    client.create_registered_model(MODEL)
    for _ in range(2):
        run_id = client.create_run(experiment).info.run_id
        assert tracking.log_files(uri, run_id, [report], REPORT_ARTIFACT)
        client.create_model_version(MODEL, f"runs:/{run_id}/adapter", run_id=run_id)
    engine, proxy = Recorder(), Recorder()
    state_file = tmp_path / "rollout" / "state.json"
    rollout.write_state(state_file, test_canary_probes.STATE)
    values = {
        "model_name": MODEL,
        "tracking_uri": uri,
        "vllm_url": engine.url,
        "proxy_url": proxy.url,
        "secrets_dir": tmp_path / "secrets",
        "serving_dir": tmp_path / "adapters",
        "routes_file": tmp_path / "routes.json",
        "state_file": state_file,
        "percent": 0,
        "report_dir": tmp_path / "reports",
        "probe_rows": 2,
        "task_metric": "exact_match",
    }
    try:
        yield values, engine, proxy
    finally:
        engine.server.shutdown()
        proxy.server.shutdown()


def test_the_served_models_are_asked_with_a_conversations_whole_history_and_a_pairs_prompt(fleet):
    values, engine, proxy = fleet
    out = canary_step.run(canary.Args.model_validate(values))
    candidate, champion = test_canary_probes.STATE.candidate_adapter, test_canary_probes.STATE.champion_adapter
    assert sorted(engine.asked, key=str) == sorted(
        [(candidate, HISTORY), (candidate, PAIR), (champion, HISTORY), (champion, PAIR)], key=str
    )
    report = json.loads(Path(out.report).read_text())
    assert [p["messages"] for p in report["probes"]] == [HISTORY, []]  # the report shows what each row was asked
    assert out.metrics["served_score"] == out.metrics["evaluated_score"] == 1.0
    assert not proxy.asked  # the pre-traffic analysis sends nothing through the proxy


def test_the_probes_are_asked_up_to_the_answer_cap_evaluate_generated_under(fleet):
    """evaluate.max_new_tokens=0 sizes the cap from the references; a model that does not stop early (a DPO-tuned one
    often runs on) would say more under the canary's own cap, and its served score would not be the evaluated one."""
    values, engine, _ = fleet
    canary_step.run(canary.Args.model_validate({**values, "max_new_tokens": 32}))
    assert engine.caps == [EVALUATED_CAP] * 4  # two probes, candidate and champion


def test_live_traffic_through_the_proxy_asks_with_the_whole_history_too(fleet):
    values, _, proxy = fleet
    args = canary.Args.model_validate({**values, "percent": 10})
    probes = traffic.probe_set(ROWS, 2)
    answers = traffic.send_live_traffic(args, [p.asked() for p in probes], 4)
    assert len(answers) == 4 and all(a.ok for a in answers)
    assert sorted(proxy.asked, key=str) == sorted([(MODEL, HISTORY), (MODEL, PAIR)] * 2, key=str)
