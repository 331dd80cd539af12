"""The report's Canary section: each step's share vs weight, scores, errors and latency, and where the rollout stopped.

Every page here is written by the report step itself (eksflow.llm.steps.report.step.run, no MLflow) from a flagship run
folder whose analyze tasks left canary-<percent>.json as eksflow.llm.steps.canary.report.write_report writes it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eksflow.llm.steps import canary, report
from eksflow.llm.steps.canary import analysis, traffic
from eksflow.llm.steps.canary import report as canary_report
from eksflow.llm.steps.canary.fleet import FleetNote
from eksflow.llm.steps.common.canary_sizing import live_requests, share_z_limit
from eksflow.llm.steps.common.rollout import RolloutState
from eksflow.llm.steps.common.vllm_client import Answer
from eksflow.llm.steps.report import svg
from eksflow.llm.steps.report.canary import section
from eksflow.llm.steps.report.canary_steps import percent_of
from eksflow.llm.steps.report.collect import canary_tasks, collect
from eksflow.llm.steps.report.step import run
from eksflow.llm.steps.report.workflow import read_local
from eksflow.runtime.rundir import RUN_DIR_ENV
from tests.report_runs import HOSTILE, NAME, make_run, node

SETTINGS = canary.CanarySettings()  # the default rules and tolerance, as the flagship passes them
STEPS = ("analyze-0", "analyze-10", "analyze-50", "analyze-100")
CANDIDATE, CHAMPION = "llama-lora-green", "llama-lora-blue"  # litellm_proxy.slot_id of the two slots
TASK_METRIC = "iso_date"  # the canary's task_metric: what its scores are in
HELD = FleetNote((), [], [])  # the fleet lost no replica while a step measured


def metrics(percent: float, share: float, **changes: float) -> dict[str, float]:
    """What eksflow.llm.steps.canary.analysis.analyse gives a healthy candidate at `percent`, with `changes` applied."""
    n = live_requests(percent / 100, SETTINGS.share_tolerance, share_z_limit(SETTINGS.thresholds)).requests
    found = {
        "served_score": 0.9375,
        "evaluated_score": 0.9375,
        "served_gap": 0.0,
        "error_rate": 0.0,
        "p95_latency_s": 1.25,
        "candidate_share": share if percent else math.nan,
        "share_z": analysis.share_z(share, percent / 100, n) if percent else math.nan,
        "champion_score": 0.875,
        "score_vs_champion": 0.0625,
        "champion_error_rate": 0.0,
    }
    return {**found, **changes}


def write_canary(
    reports: Path,
    percent: float,
    values: dict[str, float],
    reason_prefix: str = "",
    *,
    champion: bool = True,
    fleet: FleetNote = HELD,
) -> bool:
    """canary-<percent>.json and .md by eksflow.llm.steps.canary.report.write_report itself, decided by the analysis's
    own decide; the decision."""
    sizing = live_requests(percent / 100, SETTINGS.share_tolerance, share_z_limit(SETTINGS.thresholds))
    on_candidate = round(sizing.requests * values["candidate_share"]) if percent else 0
    live = [
        Answer(200, "1976-07-04", 1.0, served_by=CANDIDATE if i < on_candidate else CHAMPION)
        for i in range(sizing.requests)
    ]
    state = RolloutState(candidate_version="3", candidate_slot="green", percent=percent)
    if champion:
        state = state.model_copy(update={"champion_version": "2", "champion_slot": "blue"})
    probes = [traffic.Probe(prompt="Date: July 4, 1976", reference="1976-07-04", evaluated=1.0)]
    how = traffic.Asked(sent=16, errors=0) if percent == 0 else traffic.Asked(0, 0, "analyze-0")
    asked = {"candidate": how, **({"champion": how} if champion else {})}
    # decide reads the settings and the percent, write_report the percent and the folder
    args = canary.Args.model_construct(**dict(SETTINGS), percent=percent, report_dir=reports)
    verdict = analysis.decide(args, state, values, TASK_METRIC)
    verdict = replace(verdict, reason=reason_prefix + verdict.reason)
    measured = traffic.Measurement(live, probes, asked, values)
    canary_report.write_report(args, state, TASK_METRIC, verdict, sizing, measured, fleet)
    return verdict.passed


def analysed(percent: float, values: dict[str, float], passed: bool) -> dict[str, Any]:
    """The analyze task's node: a passed one has outputs, a failed one only its exit message (as Argo keeps them)."""
    name = f"analyze-{canary.step_label(percent)}"
    if passed:
        outputs = {"reason": "all thresholds met", "metrics": json.dumps(values), "report": report_path(percent)}
        return node(name, "Succeeded", 17, 18, outputs)
    message = f"exit code 1: error: canary analysis at {percent:g}% failed for v3: see {report_path(percent)}"
    return node(name, "Failed", 17, 18, message=message)


def report_path(percent: float) -> str:
    """Where the flagship's --report-dir puts a step's report, as the container sees it."""
    return f"/fsx/runs/{NAME}/reports/canary-{percent:g}.json"


def page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: dict[str, dict[str, Any]], promote: str) -> str:
    """The report step's page for a flagship run whose rollout nodes are `nodes` and whose promote ended `promote`."""
    run_dir = tmp_path / "runs" / NAME
    status = json.loads((run_dir / "status.json").read_text())
    status["status"]["nodes"].update(nodes)
    status["status"]["nodes"]["promote"]["phase"] = promote
    (run_dir / "status.json").write_text(json.dumps(status))
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))
    run(
        report.Args(
            workflow_name=NAME,
            workflow_status="Succeeded" if promote == "Succeeded" else "Failed",
            report_dir=tmp_path / "fsx-run",
            outputs_dir=tmp_path / "outputs",
        )
    )
    return (run_dir / "report.html").read_text()


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    """The run's reports folder on the host (the FSx volume of make_run), with the flagship's other reports."""
    make_run(tmp_path, "succeeded")
    return tmp_path / "volumes" / "fsx-claim" / "runs" / NAME / "reports"


def canary_section(text: str) -> str:
    found = re.search(r"<section><h2>Canary</h2>.*?</section>", text, re.S)
    assert found, "no Canary section"
    return found.group(0)


def not_run(name: str, after: str) -> dict[str, Any]:
    return node(name, "Omitted", None, None, message=f"not run: fail fast after {after} failed")


def test_a_promoted_rollout_shows_every_step_with_its_share_against_its_weight(tmp_path, monkeypatch, reports):
    shares = {0: math.nan, 10: 1 / 24, 50: 29 / 64, 100: 1.0}
    nodes = {}
    for percent, share in shares.items():
        values = metrics(percent, share)
        assert write_canary(reports, percent, values)
        nodes[f"analyze-{percent}"] = analysed(percent, values, passed=True)

    text = canary_section(page(tmp_path, monkeypatch, nodes, "Succeeded"))

    assert "<div class='decision pass'>promoted: candidate v3 passed every canary step</div>" in text
    assert text.count("<svg class='canary'") == 1 and text.count("data-state='passed'") == 4
    for weight, observed in (("10%", "4.17%"), ("50%", "45.3%"), ("100%", "100%")):
        step = f"analyze-{weight.removesuffix('%')}"
        assert f"<title>{step} weight: {weight}</title>" in text
        assert f"<title>{step} observed share: {observed}</title>" in text
    assert "<title>analyze-0 weight: 0%</title>" in text  # pre-traffic: weight 0, no live traffic to observe
    assert "<title>analyze-0 observed share: not measured</title>n/a</text>" in text
    assert "<title>analyze-0 served: 0.938</title>" in text and "<title>analyze-50 champion: 0.875</title>" in text
    assert "<title>analyze-100 candidate: 1.25s</title>" in text  # p95 latency
    assert "class='stopped'" not in text and "class='blank'" not in text
    # The table holds the same numbers, one column per step in order.
    assert [m.group(1) for m in re.finditer(r"<span class='muted mono'>(analyze-\d+)</span>", text)] == list(STEPS)
    assert "<td class='num'>4.2 %</td>" in text and "<td class='num'>45.3 %</td>" in text
    assert "<td class='num'>24</td>" in text  # live requests at 10 %, as sized
    assert "llama-lora-green 1" in text  # which slot served the live traffic


def test_a_step_measured_again_after_the_fleet_lost_a_replica_names_the_pod_and_its_node(
    tmp_path, monkeypatch, reports
):
    lost = (
        "measurement 1 (1 of 32 requests failed): vllm-a on node-1 (http://198.18.0.2:8000) left the fleet's endpoints"
    )
    nodes = {}
    for percent, share in {0: math.nan, 10: 1 / 24, 50: 29 / 64, 100: 1.0}.items():
        values = metrics(percent, share)
        assert write_canary(reports, percent, values, fleet=FleetNote((), [], [lost] if percent == 10 else []))
        nodes[f"analyze-{percent}"] = analysed(percent, values, passed=True)

    text = canary_section(page(tmp_path, monkeypatch, nodes, "Succeeded"))

    assert "<div class='decision pass'>promoted: candidate v3 passed every canary step</div>" in text
    assert f"<td class='text'>not judged, measured again: {lost.replace(chr(39), '&#x27;')}</td>" in text


def test_a_rollout_stopped_at_pre_traffic_names_the_failing_rule_and_greys_out_the_rest(tmp_path, monkeypatch, reports):
    values = metrics(0, math.nan, served_score=0.0, served_gap=0.9375, score_vs_champion=-0.875)
    assert not write_canary(reports, 0, values)
    nodes = {"analyze-0": analysed(0, values, passed=False)}
    nodes |= {name: not_run(name, "analyze-0") for name in STEPS[1:]}

    text = canary_section(page(tmp_path, monkeypatch, nodes, "Omitted"))

    assert (
        "stopped at analyze-0 (pre-traffic 0 %): failing served_gap (iso_date) &lt;= 0.125 (actual 0.9375); "
        "score_vs_champion (iso_date) &gt;= -0.125 (actual -0.875)" in text
    )  # each score named with the task metric it is in
    assert "<b>reason:</b> served_gap (iso_date) = 0.9375 fails served_gap (iso_date) &lt;= 0.125" in text
    assert "not run: analyze-10, analyze-50, analyze-100" in text
    assert text.count("class='stopped'") == 1 and text.count("data-state='not run'") == 3
    assert text.count("class='blank'") == 3 and "promoted" not in text
    assert not re.search(r"<title>analyze-(10|50|100) ", text)  # no bar, no n/a for a step that did not run
    assert text.count("<td class='muted'>not run (Omitted)</td>") == 3
    assert "not run: fail fast after analyze-0 failed" in text
    assert "<td class='num bad'>0.9375</td>" in text  # served_gap failed its rule


def test_metrics_a_step_could_not_measure_show_as_missing_never_as_zero(tmp_path, monkeypatch, reports):
    # The champion answered nothing (no score) and no live request came back timed (no p95): NaN in the report.
    values = metrics(10, 1 / 24, champion_score=math.nan, score_vs_champion=math.nan, p95_latency_s=math.nan)
    assert not write_canary(reports, 10, values)
    healthy = metrics(0, math.nan)
    write_canary(reports, 0, healthy)
    nodes = {"analyze-0": analysed(0, healthy, True), "analyze-10": analysed(10, values, passed=False)}
    nodes |= {name: not_run(name, "analyze-10") for name in STEPS[2:]}

    text = canary_section(page(tmp_path, monkeypatch, nodes, "Omitted"))

    for series in ("champion", "candidate"):  # champion score, p95 latency
        assert f"<title>analyze-10 {series}: not measured</title>n/a</text>" in text
    assert "<title>analyze-10 candidate: 0%</title></rect>" in text  # a measured 0 error rate is a bar
    assert "<title>analyze-10 champion: 0.875" not in text
    assert "failing p95_latency_s &lt;= 60 (not measured); score_vs_champion (iso_date) &gt;= -0.125 (not" in text
    assert "p95_latency_s is missing or NaN" in text  # the report's reason
    assert text.count("<td class='num muted' title='not measured'>\u2013</td>") == 3 + 2  # analyze-0's share, z
    assert "<td class='num'>0.0000</td>" in text  # measured zeros stay numbers


def test_hostile_text_in_a_report_is_escaped(tmp_path, monkeypatch, reports):
    values = metrics(0, math.nan, error_rate=0.5)
    assert not write_canary(reports, 0, values, reason_prefix=HOSTILE + "; ")
    data = json.loads((reports / "canary-0.json").read_text())
    data["live_traffic"]["served_by"] = {HOSTILE: 3}
    data["probes_asked"]["candidate"]["reused_from"] = HOSTILE
    (reports / "canary-0.json").write_text(json.dumps(data))
    nodes = {"analyze-0": analysed(0, values, passed=False)}
    nodes |= {name: not_run(name, "analyze-0" + HOSTILE) for name in STEPS[1:]}

    full = page(tmp_path, monkeypatch, nodes, "Omitted")
    text = canary_section(full)

    assert "<script" not in full and "<img" not in full and "onerror=alert(1)>" not in full
    assert text.count(svg.esc(HOSTILE)) >= 5  # reason (verdict, tooltip, table), served by, reused from, messages
    for tag in ("section", "table", "svg", "details", "title", "g", "text"):
        assert text.count(f"<{tag}>") + text.count(f"<{tag} ") == text.count(f"</{tag}>"), tag


def test_a_missing_or_unreadable_report_shows_no_report_and_the_page_still_renders(tmp_path, monkeypatch, reports):
    healthy = metrics(0, math.nan)
    write_canary(reports, 0, healthy)
    (reports / "canary-50.json").write_text('{"passed": tru')  # cut short
    failed_early = node(
        "analyze-10", "Failed", 17, 18, message="exit code 2: error: the evaluation report has no per-row scores"
    )
    nodes = {
        "analyze-0": analysed(0, healthy, True),
        "analyze-10": failed_early,  # failed before writing canary-10.json
        "analyze-50": analysed(50, healthy, passed=False),  # its report is unreadable
        "analyze-100": not_run("analyze-100", "analyze-10"),
    }

    full = page(tmp_path, monkeypatch, nodes, "Omitted")
    text = canary_section(full)

    assert full.rstrip().endswith("</html>") and "Tasks and outputs" in full
    assert "stopped at analyze-10 (10 %)</div>" in text
    assert "<b>reason:</b> no report; exit code 2: error: the evaluation report has no per-row scores; " in text
    assert f"{report_path(10)} could not be read: FileNotFoundError" in text
    assert f"{report_path(50)} could not be read: JSONDecodeError" in text
    assert text.count("<td class='bad'>FAILED, no report</td>") == 2
    assert text.count("class='blank'") == 3  # grey columns: two without a report, one not run
    assert "<title>analyze-0 served: 0.938</title>" in text  # the readable step still drawn


def test_steps_passed_without_a_champion_say_why_they_measured_nothing(tmp_path, monkeypatch, reports):
    why = "no champion served: the candidate already takes all traffic; analyze-100 measures it"
    nodes = {
        f"analyze-{p}": node(f"analyze-{p}", "Succeeded", 17, 18, {"reason": why, "metrics": "{}", "report": ""})
        for p in (0, 10, 50)
    }
    values = metrics(100, 1.0, champion_score=math.nan, score_vs_champion=math.nan, champion_error_rate=math.nan)
    assert write_canary(reports, 100, values, champion=False)
    nodes["analyze-100"] = analysed(100, values, passed=True)

    text = canary_section(page(tmp_path, monkeypatch, nodes, "Succeeded"))

    assert "promoted: candidate v3 passed every canary step" in text
    assert text.count("<td class='good'>passed, no report</td>") == 3 and text.count(why) >= 3
    assert text.count("passed \u00b7 no report</text>") == 3


def test_the_canary_steps_are_found_by_the_step_they_run_and_a_run_without_them_has_no_section(tmp_path):
    facts = collect(read_local(make_run(tmp_path, "succeeded")))
    assert [t.name for t in canary_tasks(facts)] == list(STEPS)  # not evaluate, whose outputs look alike
    assert [percent_of(t) for t in canary_tasks(facts)] == [0.0, 10.0, 50.0, 100.0]
    assert section([], facts.tasks) == ""
