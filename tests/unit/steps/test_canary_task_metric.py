"""The canary scores served answers by any task metric evaluate scored the version with, the project's own included.

Before, `canary.task_metric` took only exact_match or contains: a pipeline gated on its own metric could not judge
the served model by it. The analysis here is the real one (canary_step.run) against a real sqlite registry holding
evaluate's report and a small live OpenAI-style engine; the metric is a module of a test project.
"""

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow.errors import ConfigError
from eksflow.llm.steps import canary
from eksflow.llm.steps.canary import step as canary_step
from eksflow.llm.steps.canary import traffic
from eksflow.llm.steps.common import rollout, tracking
from eksflow.llm.steps.evaluate.report import REPORT_ARTIFACT, REPORT_FILE
from eksflow.runtime.args import StepFailedError, StepInputError
from tests.flagship import config, rendered
from tests.unit.steps import test_canary_probes, test_evaluate_custom_metrics

user_package = test_evaluate_custom_metrics.user_package  # a fresh project package: mine.py declares starts_alike
MODEL = "llama-lora"
ANSWER = "abc-served"  # starts as every reference does (starts_alike 1.0), equals none (exact_match 0.0)


class Engine:
    """Alive: /health answers 200, every chat request is answered ANSWER."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(200 if self.path == "/health" else 404, {})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer(200, {"choices": [{"message": {"role": "assistant", "content": ANSWER}}]})

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


@pytest.fixture
def fleet(tmp_path, user_package) -> Iterator[dict]:
    """Versions 1 (the champion) and 2 (the candidate) of MODEL, evaluated with exact_match and the project's metric."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    experiment = client.create_experiment("rollout", artifact_location=(tmp_path / "artifacts").as_uri())
    metric = f"{user_package}.mine:starts_alike"
    rows = [
        {"prompt": f"p{i}", "reference": f"abc-{i}", "answer": f"abc-{i}?", "exact_match": 0.0, metric: 1.0}
        for i in range(4)
    ]
    report = tmp_path / REPORT_FILE
    report.write_text(json.dumps({"task_metrics": ["exact_match", metric], "rows": rows}))
    client.create_registered_model(MODEL)
    for _ in range(2):
        run_id = client.create_run(experiment).info.run_id
        assert tracking.log_files(uri, run_id, [report], REPORT_ARTIFACT)
        client.create_model_version(MODEL, f"runs:/{run_id}/adapter", run_id=run_id)
    engine = Engine()
    state_file = tmp_path / "rollout" / "state.json"
    rollout.write_state(state_file, test_canary_probes.STATE)
    try:
        yield {
            "model_name": MODEL,
            "tracking_uri": uri,
            "vllm_url": engine.url,
            "proxy_url": "http://127.0.0.1:1",  # the pre-traffic analysis sends nothing through the proxy
            "secrets_dir": tmp_path / "secrets",
            "serving_dir": tmp_path / "adapters",
            "routes_file": tmp_path / "routes.json",
            "state_file": state_file,
            "percent": 0,
            "report_dir": tmp_path / "reports",
            "probe_rows": 4,
        }
    finally:
        engine.server.shutdown()


@pytest.mark.parametrize("named", ["short", "full"])
def test_the_analysis_scores_served_answers_with_the_projects_own_metric(fleet, user_package, tmp_path, named):
    metric = f"{user_package}.mine:starts_alike"
    args = canary.Args.model_validate({**fleet, "task_metric": "starts_alike" if named == "short" else metric})
    out = canary_step.run(args)
    assert (out.metrics["served_score"], out.metrics["evaluated_score"], out.metrics["served_gap"]) == (1.0, 1.0, 0.0)
    assert out.metrics["champion_score"] == 1.0  # the champion's answers scored by the same metric
    report = json.loads(Path(out.report).read_text())
    assert [p["candidate_score"] for p in report["probes"]] == [1.0] * 4
    assert (tmp_path / "called").read_text() == "called"  # the project's function scored them, not a built-in


def test_a_built_in_metric_still_scores_the_served_answers(fleet):
    out = canary_step.run(canary.Args.model_validate({**fleet, "task_metric": "exact_match"}))
    assert (out.metrics["served_score"], out.metrics["evaluated_score"]) == (0.0, 0.0)


def test_a_short_name_the_evaluation_did_not_list_is_bad_input_and_imports_nothing(fleet, user_package, tmp_path):
    args = canary.Args.model_validate({**fleet, "task_metric": "starts_alike"})
    with pytest.raises(StepInputError) as refused:
        traffic.served_metric(args.task_metric, ["exact_match"], "2")
    assert str(refused.value) == (
        "--task-metric: 'starts_alike' is not a task metric v2 was evaluated with (exact_match); name one of them"
    )
    assert f"{user_package}.mine" not in sys.modules and not (tmp_path / "called").exists()
    mine, other = f"{user_package}.mine:starts_alike", f"{user_package}.other:starts_alike"
    with pytest.raises(StepInputError, match=f"is the short name of both {mine} and {other}"):
        traffic.served_metric("starts_alike", [mine, other], "2")


@pytest.mark.parametrize("metric", ["exact_match", "contains", "json_match", "rouge_l", "starts_alike"])
def test_any_answer_scoring_metric_is_a_canary_metric(metric):
    assert canary.CanarySettings(task_metric=metric).task_metric == metric


@pytest.mark.parametrize(
    ("metric", "refusal"),
    [
        ("eval_loss", "eval_loss is not a score of an answer"),
        ("os:system", "os is in the standard library"),
        ("no such metric", "unknown task metric 'no such metric'"),
    ],
    ids=["loss", "stdlib", "not-a-name"],
)
def test_what_scores_no_answer_is_refused_as_a_canary_metric(metric, refusal):
    with pytest.raises(ValidationError) as caught:
        canary.CanarySettings(task_metric=metric)
    (error,) = caught.value.errors()
    assert error["loc"] == ("task_metric",) and refusal in error["msg"], error["msg"]


def test_the_flagships_canary_names_a_metric_its_evaluate_scores_by_its_short_name(user_package):
    metric = f"{user_package}.mine:starts_alike"
    overrides = [f'evaluate.task_metrics=["exact_match","{metric}"]', "canary.task_metric=starts_alike"]
    assert config(overrides).canary.task_metric == "starts_alike"
    analyses = [t for t in rendered(overrides)["spec"]["templates"] if t["name"].startswith("analyze-")]
    assert analyses and all("--task-metric=starts_alike" in t["container"]["args"] for t in analyses)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["canary.task_metric=json_match"],
            "canary.task_metric: 'json_match' is none of evaluate.task_metrics (exact_match, contains, rouge_l): the "
            "canary compares its scores of the served answers with evaluate's of the same metric; name one of them "
            "or add it there (got 'json_match'); fix it with --set canary.task_metric=<value> or in the --config file",
        ),
        (
            [
                'evaluate.task_metrics=["{pkg}.mine:starts_alike","{pkg}.other:starts_alike"]',
                "evaluate.champion_metric={pkg}.mine:starts_alike",
                "canary.task_metric=starts_alike",
            ],
            "canary.task_metric: 'starts_alike' is the short name of both {pkg}.mine:starts_alike and "
            "{pkg}.other:starts_alike; name the one you mean in full (got 'starts_alike'); fix it with "
            "--set canary.task_metric=<value> or in the --config file",
        ),
    ],
    ids=["not-evaluated", "two-share-the-short-name"],
)
def test_a_canary_metric_evaluate_does_not_score_fails_the_config_in_one_line(user_package, overrides, line):
    overrides = [o.format(pkg=user_package) for o in overrides]
    with pytest.raises(ConfigError) as refused:
        config([*overrides, 'evaluate.thresholds=[{"metric":"eval_loss","op":"<=","value":9}]'])
    assert str(refused.value) == line.format(pkg=user_package)


def test_a_metric_the_version_was_not_evaluated_with_exits_2_in_one_line(fleet, user_package, capsys):
    argv = [f"--{key.replace('_', '-')}={value}" for key, value in {**fleet, "task_metric": "contains"}.items()]
    assert canary_step.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: --task-metric: 'contains' is not a task metric v2 was evaluated with "
        f"(exact_match, {user_package}.mine:starts_alike); name one of them"
    )  # the whole of stderr: one line, no traceback


def test_the_canary_names_its_metric_wherever_it_shows_a_score(fleet, capsys):
    """Before, canary-*.md/json, the step's log and its failure said served_score but not which metric scored it."""
    rules = [{"metric": "served_score", "op": ">=", "value": 0.5}, {"metric": "error_rate", "op": "<=", "value": 0}]
    args = canary.Args.model_validate({**fleet, "task_metric": "exact_match", "thresholds": rules})
    with pytest.raises(StepFailedError) as failed:
        canary_step.run(args)
    named = "served_score (exact_match) = 0.0000 fails served_score (exact_match) >= 0.5"
    assert named in str(failed.value)
    report = json.loads((tmp := Path(fleet["report_dir"]) / "canary-0.json").read_text())
    assert report["task_metric"] == "exact_match" and report["shown"]["served_gap"] == "served_gap (exact_match)"
    table = tmp.with_suffix(".md").read_text()
    assert "scores: exact_match on the probe rows" in table
    assert "| served_score (exact_match) >= 0.5 | 0.0000 | FAIL |" in table
    assert "evaluated_score (exact_match) = 0.0000" in table and "champion_score (exact_match) = 0.0000" in table
    assert "the scores are exact_match on the probe rows" in capsys.readouterr().err  # the step's log
