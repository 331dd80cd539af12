"""The canary analysis's pure parts: settings, probe rows, metrics, routing tolerance, the report table."""

import json
import math
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow.llm.steps import canary
from eksflow.llm.steps.canary import analysis, traffic
from eksflow.llm.steps.canary import report as canary_report
from eksflow.llm.steps.canary import step as canary_step
from eksflow.llm.steps.canary.fleet import FleetNote
from eksflow.llm.steps.common import canary_sizing, litellm_proxy, rollout, vllm_client
from eksflow.llm.steps.common.gate import Threshold, Verdict, gate
from eksflow.llm.steps.common.rollout import RolloutState
from eksflow.llm.steps.common.vllm_client import Answer

SENT = {"candidate": traffic.Asked(sent=4, errors=0), "champion": traffic.Asked(sent=4, errors=0)}


def args(tmp_path: Path, **extra) -> canary.Args:
    return canary.Args.model_validate(
        {
            "model_name": "llama-lora",
            "tracking_uri": "sqlite:///x.db",
            "vllm_url": "http://127.0.0.1:1",
            "proxy_url": "http://127.0.0.1:2",
            "serving_dir": tmp_path,
            "routes_file": tmp_path / "routes.json",
            "state_file": tmp_path / "state.json",
            "percent": 10,
            "report_dir": tmp_path / "reports",
            **extra,
        }
    )


@pytest.mark.parametrize("weights", [(50, 10, 100), (10, 50), (0, 100), (10, 10, 100), (10, 150)])
def test_weights_must_increase_to_100(weights):
    with pytest.raises(ValidationError, match="weights must increase"):
        canary.CanarySettings(weights=weights)


def test_rules_name_known_metrics_only():
    with pytest.raises(ValidationError, match="unknown canary metric 'latency'"):
        canary.CanarySettings(thresholds=(Threshold(metric="latency", op="<=", value=1),))


@pytest.mark.parametrize(
    ("weight", "tolerance", "requests"),
    [
        (0.1, 0.25, 24),  # 4^2 * 0.1 * 0.9 / 0.25^2 = 23.04
        (0.5, 0.25, 64),  # 4^2 * 0.25 / 0.0625, exactly: not 65 from rounding
        (1.0, 0.25, 34),  # ln(6.33e-5) / ln(0.75) = 33.6
        (0.1, 0.3, 20),  # the bound asks 16: the p95 floor
        (0.5, 0.2, 100),
        (1.0, 0.05, 189),
    ],
)
def test_live_requests_follow_from_the_share_bound(weight, tolerance, requests):
    sizing = canary_sizing.live_requests(weight, tolerance, 4.0)
    assert sizing.requests == requests
    if weight < 1:  # a share off by the tolerance reaches the z limit with n requests, not with n - 1
        assert analysis.share_z(weight + tolerance, weight, sizing.requests) >= 4.0 - 1e-9 or requests == 20
        assert analysis.share_z(weight + tolerance, weight, sizing.requests - 1) < 4.0 or requests == 20
    else:  # a router sending the tolerance elsewhere goes unseen no more often than a correct one fails at z = 4
        assert (1 - tolerance) ** sizing.requests <= math.erfc(4 / math.sqrt(2)) < (1 - tolerance) ** (requests - 1)
    assert f"{requests} live requests" in sizing.describe()


def test_default_canary_sizes_each_step_and_says_why():
    settings = canary.CanarySettings()
    z = canary_sizing.share_z_limit(settings.thresholds)
    assert z == 4.0
    sized = [canary_sizing.live_requests(w / 100, settings.share_tolerance, z) for w in settings.weights]
    assert [s.requests for s in sized] == [24, 64, 34]
    assert "n >= 4^2 * 0.1 * 0.9 / 0.25^2 = 23.04" in sized[0].describe()
    assert "(1 - 0.25)^n <= 6.3e-05, the normal tail at 4" in sized[2].describe()


def test_without_a_share_rule_the_floor_alone_sizes_the_traffic():
    rules = (Threshold(metric="share_z", op=">=", value=1.0), Threshold(metric="error_rate", op="<=", value=0))
    assert canary_sizing.share_z_limit(rules) is None
    sizing = canary_sizing.live_requests(0.5, 0.25, None)
    assert sizing.requests == canary_sizing.MIN_LIVE_REQUESTS == 20 and "no share_z rule" in sizing.describe()
    strict = (Threshold(metric="share_z", op="<=", value=4.0), Threshold(metric="share_z", op="<", value=3.0))
    assert canary_sizing.share_z_limit(strict) == 3.0


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"share_tolerance": 0}, "greater than 0"),
        ({"share_tolerance": 1}, "less than 1"),
        ({"share_tolerance": 0.01}, "needs 14400 live requests at the 10% step, more than 10000"),
        ({"thresholds": ({"metric": "share_z", "op": "<=", "value": 40},)}, "needs inf live requests at the 100%"),
        ({"traffic_requests": 40}, "traffic_requests\n  Extra inputs are not permitted"),
    ],
)
def test_canary_traffic_settings_are_validated(settings, match):
    with pytest.raises(ValidationError, match=match):
        canary.CanarySettings.model_validate(settings)


@pytest.mark.parametrize(
    ("share", "weight", "n", "expected"),
    [
        (0.1, 0.1, 100, 0.0),
        (0.22, 0.1, 100, 4.0),
        (1.0, 1.0, 40, 0.0),
        (0.975, 1.0, 40, math.inf),
        (0.5, 0.5, 0, math.nan),
    ],
)
def test_share_z_counts_binomial_standard_errors(share, weight, n, expected):
    z = analysis.share_z(share, weight, n)
    assert (math.isnan(z) and math.isnan(expected)) or z == pytest.approx(expected)


def test_probe_rows_are_the_first_rows_evaluate_scored():
    rows = [{"prompt": f"p{i}", "reference": f"c{i}", "exact_match": float(i % 2)} for i in range(6)]
    rows.insert(1, {"prompt": "old report", "exact_match": 1.0})  # no reference: not a probe
    probes = traffic.probe_set(rows, 3)
    assert [(p.prompt, p.reference, p.evaluated) for p in probes] == [
        ("p0", "c0", 0.0),
        ("p1", "c1", 1.0),
        ("p2", "c2", 0.0),
    ]


def test_a_report_without_per_row_scores_is_bad_input():
    from eksflow.runtime.args import StepInputError

    with pytest.raises(StepInputError, match="no per-row exact_match scores"):
        traffic.probe_set([{"prompt": "a", "reference": "b"}], 4)


def live(served_by: list[str], latency: float = 0.5) -> list[Answer]:
    return [Answer(200, "ok", latency, s) if s else Answer(0, "", 60.0, error="timeout") for s in served_by]


def test_metrics_of_a_healthy_step_pass_the_default_rules(tmp_path):
    a = args(tmp_path)
    state = RolloutState(
        champion_version="1", champion_slot="blue", candidate_version="2", candidate_slot="green", percent=10
    )
    probes = [
        traffic.Probe(prompt=f"p{i}", reference="r", evaluated=1.0, candidate_score=1.0, champion_score=1.0)
        for i in range(4)
    ]
    requests = live(["llama-lora-green"] * 4 + ["llama-lora-blue"] * 36)
    metrics = analysis.analyse(a, state, requests, probes, SENT)
    assert metrics["candidate_share"] == 0.1 and metrics["share_z"] == 0.0
    assert metrics["served_gap"] == 0.0 and metrics["error_rate"] == 0.0 and metrics["score_vs_champion"] == 0.0
    verdict = analysis.decide(a, state, metrics, "exact_match")
    assert verdict.passed and [r.rule.metric for r in verdict.results if r.ok] == [
        *(r.metric for r in a.thresholds),
        *(r.metric for r in a.champion_thresholds),
    ]


def test_served_not_matching_evaluated_fails_naming_the_rule(tmp_path):
    a = args(tmp_path, percent=50)
    state = RolloutState(
        champion_version="1", champion_slot="blue", candidate_version="2", candidate_slot="green", percent=50
    )
    probes = [
        traffic.Probe(prompt=f"p{i}", reference="r", evaluated=1.0, candidate_score=0.0, champion_score=1.0)
        for i in range(4)
    ]
    requests = live(["llama-lora-green", "llama-lora-blue"] * 20 + [""])  # one request timed out
    metrics = analysis.analyse(a, state, requests, probes, SENT)
    verdict = analysis.decide(a, state, metrics, "exact_match")
    reason = verdict.reason
    assert not verdict.passed
    assert {r.rule.metric for r in verdict.results if not r.ok} == {"served_gap", "error_rate", "score_vs_champion"}
    assert "served_gap (exact_match) = 1.0000 fails served_gap (exact_match) <= 0.125" in reason
    assert "error_rate = 0.0222 fails error_rate <= 0" in reason
    assert "score_vs_champion (exact_match) = -1.0000 fails score_vs_champion (exact_match) >= -0.125" in reason


def test_without_a_champion_there_are_no_champion_metrics(tmp_path):
    state = RolloutState(candidate_version="1", candidate_slot="blue", percent=100)
    probes = [traffic.Probe(prompt="p", reference="r", evaluated=1.0, candidate_score=1.0)]
    metrics = analysis.analyse(
        args(tmp_path, percent=100), state, live(["llama-lora-blue"] * 3), probes, {"candidate": traffic.Asked(1, 0)}
    )
    assert "champion_score" not in metrics and metrics["share_z"] == 0.0


def test_report_table_names_every_rule_and_the_split(tmp_path):
    state = RolloutState(champion_version="1", champion_slot="blue", candidate_version="2", candidate_slot="green")
    rules = [Threshold(metric="error_rate", op="<=", value=0.0)]
    metrics = {"error_rate": 0.5, "p95_latency_s": 1.0}
    verdict = replace(gate(metrics, rules), reason="x")
    table = canary_report.render_table(10, state, "exact_match", metrics, verdict, {"a": 3})
    assert "| error_rate <= 0 | 0.5000 | FAIL |" in table and "live traffic served by: a 3" in table
    assert table.endswith("analysis: FAILED (x)")


@pytest.mark.parametrize(
    ("champion", "percent", "expected"),
    [("blue", 10, {"m-blue": 90.0, "m-green": 10.0}), (None, 10, {"m-blue": 0.0, "m-green": 100.0})],
)
def test_weights_for_a_step(champion, percent, expected):
    assert litellm_proxy.weights_for("m", champion, "green", percent) == expected


def test_routes_file_is_replaced_whole_and_refuses_all_zero(tmp_path):
    routes = litellm_proxy.RoutesFile(tmp_path / "routes.json", "m")
    routes.assign("blue", "m-v1-aaaaaaaa", "http://v:8000")
    routes.assign("green", "m-v2-bbbbbbbb", "http://v:8000/")
    routes.set_weights({"m-blue": 90, "m-green": 10})
    assert routes.read() == {
        "m": {
            "m-blue": {"weight": 90.0, "adapter": "m-v1-aaaaaaaa", "api_base": "http://v:8000/v1"},
            "m-green": {"weight": 10.0, "adapter": "m-v2-bbbbbbbb", "api_base": "http://v:8000/v1"},
        }
    }
    routes.assign("green", "m-v3-cccccccc", "http://v:8000")  # a new candidate in the slot: no traffic until a step
    assert routes.read()["m"]["m-green"] == {"weight": 0.0, "adapter": "m-v3-cccccccc", "api_base": "http://v:8000/v1"}
    with pytest.raises(litellm_proxy.RoutingError, match="at least one slot"):
        routes.set_weights({"m-blue": 0, "m-green": 0})
    assert not list(tmp_path.glob(".*tmp"))  # no half-written file left behind


def test_a_slot_without_an_adapter_takes_no_traffic(tmp_path):
    routes = litellm_proxy.RoutesFile(tmp_path / "routes.json", "m")
    routes.assign("blue", "m-v1-aaaaaaaa", "http://v:8000")
    with pytest.raises(litellm_proxy.RoutingError, match="no adapter is assigned to it"):
        routes.set_weights({"m-blue": 0, "m-green": 100})
    routes.set_weights({"m-blue": 100, "m-green": 0})
    assert routes.read()["m"]["m-green"] == {"weight": 0.0}


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"m": {"m-blue": 5}}'])
def test_a_damaged_routes_file_is_refused_with_the_way_out(tmp_path, text):
    (tmp_path / "routes.json").write_text(text)
    with pytest.raises(litellm_proxy.RoutingError, match="delete it to start over"):
        litellm_proxy.RoutesFile(tmp_path / "routes.json", "m").set_weights({"m-blue": 100})


def test_metrics_from_probes_that_all_errored_are_missing_and_fail_closed(tmp_path):
    a = args(tmp_path)
    state = RolloutState(
        champion_version="1", champion_slot="blue", candidate_version="2", candidate_slot="green", percent=10
    )
    probes = [
        traffic.Probe(prompt=f"p{i}", reference="r", evaluated=1.0, candidate_score=math.nan, champion_score=math.nan)
        for i in range(4)
    ]
    failed = {"candidate": traffic.Asked(sent=4, errors=4), "champion": traffic.Asked(sent=4, errors=4)}
    metrics = analysis.analyse(a, state, live([""] * 8), probes, failed)
    for name in ("served_score", "served_gap", "champion_score", "score_vs_champion", "candidate_share"):
        assert math.isnan(metrics[name]), name  # nothing answered: no score, not a 0 that passes
    verdict = analysis.decide(a, state, metrics, "exact_match")
    assert not verdict.passed and "score_vs_champion" in verdict.reason and "served_gap" in verdict.reason


def test_a_dead_engine_is_named(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert vllm_client.engine_down(closed).startswith(f"the vLLM engine at {closed} does not answer")


def test_a_champion_is_serving_only_once_it_answers_its_probe_set_from_its_slot(tmp_path, monkeypatch):
    rows = [{"prompt": f"p{i}", "reference": "r"} for i in range(20)]
    monkeypatch.setattr(rollout, "evaluated_rows", lambda uri, model, version: rows)
    asked: list[str] = []

    def proxy(served_by: str):
        def chat(url, model, prompt, **kwargs):
            asked.append(prompt)
            return Answer(200, "ok", 0.1, served_by)

        return chat

    monkeypatch.setattr(vllm_client, "chat", proxy("llama-lora-blue"))
    assert rollout.not_answering(args(tmp_path), "1", "blue") == ""
    assert asked == [f"p{i}" for i in range(rollout.PROBE_ROWS)]  # the probe set, through the proxy
    monkeypatch.setattr(vllm_client, "chat", proxy("llama-lora-green"))
    assert "answered by llama-lora-green, not llama-lora-blue" in rollout.not_answering(args(tmp_path), "1", "blue")
    monkeypatch.undo()
    monkeypatch.setattr(rollout, "evaluated_rows", lambda uri, model, version: rows)
    assert "probe row 0 got no answer" in rollout.not_answering(args(tmp_path), "1", "blue", timeout_s=5)


def test_the_report_states_the_evidence_sized_and_how_the_probes_came(tmp_path, capsys):
    a = args(tmp_path, percent=50)
    state = RolloutState(
        champion_version="1", champion_slot="blue", candidate_version="2", candidate_slot="green", percent=50
    )
    sizing = canary_sizing.live_requests(0.5, a.share_tolerance, 4.0)
    asked = {"candidate": traffic.Asked(0, 0, "analyze-10"), "champion": traffic.Asked(16, 1)}
    metrics = {"error_rate": 0.0}
    verdict = Verdict(passed=True, reason="ok")
    measured = traffic.Measurement(live(["llama-lora-green"]), [], asked, metrics)
    path = canary_report.write_report(a, state, "exact_match", verdict, sizing, measured, FleetNote((), [], []))
    report = json.loads(path.read_text())
    assert report["live_traffic"]["sized"].startswith("64 live requests: a share off by 0.25 from 50% reaches")
    assert report["probes_asked"]["candidate"] == {"sent": 0, "errors": 0, "reused_from": "analyze-10"}
    table = path.with_suffix(".md").read_text()
    assert "live traffic: 64 live requests" in table
    assert "probes: candidate reused from analyze-10, champion 16 sent (1 failed)" in table


def test_without_a_champion_a_step_below_100_leaves_the_one_analysis_to_the_last_step(tmp_path):
    """No champion: the shift gave the candidate all traffic, so analyze-10 sends nothing (the addresses are closed
    ports) and writes no report; it records its stage and says why."""
    from eksflow.llm.steps.common import rollout

    a = args(tmp_path, percent=10)
    rollout.write_state(a.state_file, RolloutState(candidate_version="1", candidate_slot="blue", percent=100))
    out = canary_step.run(a)
    assert out.reason == "no champion served: the candidate already takes all traffic; analyze-100 measures it"
    assert out.metrics == {} and out.report == ""
    assert not a.report_dir.exists()
    assert rollout.read_state(a.state_file).stage == "analyze-10"


def test_the_pre_traffic_step_sends_no_live_request_and_says_why():
    sizing = canary_sizing.live_requests(0.0, 0.25, 4.0)
    assert sizing.requests == 0
    assert sizing.describe().startswith("0 live requests: the pre-traffic step, before the candidate takes any")
    assert set(canary.ROUTING_METRICS) <= set(canary.CANARY_METRICS)
    with pytest.raises(ValueError, match=r"weight must be in \[0, 1\]"):
        canary_sizing.live_requests(-0.1, 0.25, 4.0)
