"""The report's renderers: sections for what ran and what did not, hostile text escaped, plots drawn."""

import re

import pytest

from eksflow.llm.steps.report import svg
from eksflow.llm.steps.report.collect import collect, training_tasks
from eksflow.llm.steps.report.html import Evaluation, Page, Validation, render, safe_href
from eksflow.llm.steps.report.runs import EndedRun
from eksflow.llm.steps.report.workflow import read_local
from tests.report_runs import HOSTILE, NOW, curves, make_run, page_of


def test_a_succeeded_run_shows_dag_curves_metrics_samples_validation_and_version(tmp_path):
    text = page_of(tmp_path, "succeeded", runs=[curves()], ended=[EndedRun("r1", "llama-lora-t3st1", "FINISHED")])
    assert text.count("<g class='task'") == 28  # 26 main tasks (7 + the rollout's 19) + finish-rollout and report
    assert "data-phase='Running'" in text  # the exit handler's own task, still running
    assert text.count("<polyline class='series'") == 2  # loss and learning rate
    assert "<svg class='chart bars'" in text and "gate PASSED" in text
    assert "beats champion v2" in text and "1976-07-04" in text
    assert "<td class='num'>0.0625</td><td class='num'>0.8750</td>" in text  # base -> tuned exact match
    assert "href='../../volumes/fsx-claim/runs/llama-lora-t3st1/reports/data_docs/index.html'" in text
    assert "2 of 2 checks passed" in text
    assert "r1</code> llama-lora-t3st1 \u2192 <b>FINISHED" in text
    assert "registered <b><a href='http://mlflow.example.com/#/models/llama-lora/versions/3'>version 3</a>" in text
    assert "<h3>promote" in text
    assert "<script" not in text and "http-equiv='Content-Security-Policy'" in text


def test_a_failed_run_says_what_failed_and_what_never_ran(tmp_path):
    text = page_of(tmp_path, "failed")
    assert "<header class='Failed'>" in text
    assert "no evaluation report: exit code 1: error: MLflow down" in text
    assert text.count("data-phase='Omitted'") == 2  # register, deploy
    assert "no loss or learning-rate history was logged" in text  # no MLflow data given


def test_skipped_training_is_said_not_plotted(tmp_path):
    text = page_of(tmp_path, "skipped")
    assert "training did not run in this workflow" in text
    assert "data unchanged since champion v2 (sha256:d1)" in text and "evaluated" not in text  # the pipeline's words
    assert "<polyline" not in text and "Evaluation" in text and "no evaluation report" in text


def test_invalid_data_shows_the_failed_expectations_from_the_report_the_failed_task_left(tmp_path):
    text = page_of(tmp_path, "invalid-data")
    assert "2 of 3 checks passed" in text and "completion_not_blank" in text and "3 of 64" in text
    assert "Data Docs</a>" in text


def test_a_pipeline_without_training_or_evaluation_still_gets_its_dag_and_outputs(tmp_path):
    workflow = read_local(make_run(tmp_path, "succeeded"))
    templates = workflow["spec"]["templates"]
    main = next(t for t in templates if t["name"] == "main")
    main["dag"]["tasks"] = [t for t in main["dag"]["tasks"] if t["name"] in ("champion", "stage-data")]
    facts = collect(workflow)
    text = render(Page(facts=facts, now=NOW, training_tasks=training_tasks(facts)))
    assert text.count("<g class='task'") == 4  # the two kept + the exit handler's finish-rollout and report
    assert "this pipeline has no training task" in text and "Evaluation" not in text
    assert "dataset_digest" in text and "sha256:d1" in text


def test_hostile_strings_are_escaped_everywhere(tmp_path):
    text = page_of(tmp_path, "succeeded", hostile=True, runs=[curves()])
    failed = page_of(tmp_path / "f", "failed", hostile=True)
    for page in (text, failed):
        assert "<script" not in page and "<img" not in page and "onerror=alert(1)>" not in page
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert text.count(svg.esc(HOSTILE)) >= 4  # parameter, reason, prompt, base answer, deploy answer
    assert svg.esc(HOSTILE) in failed  # a task's message
    # Markup stays balanced: every opened tag the renderers write is closed.
    for tag in ("section", "table", "svg", "details"):
        assert text.count(f"<{tag}") == text.count(f"</{tag}>"), tag


@pytest.mark.parametrize(
    ("target", "kept"),
    [
        ("http://mlflow.example.com/#/models/m/versions/3", True),
        ("../../volumes/fsx-claim/runs/x/reports/data_docs/index.html", True),
        ("javascript:alert(1)", False),
        ("JavaScript:alert(1)", False),
        ("data:text/html,<script>x</script>", False),
        ("//evil.example.com/x", False),
        ("/etc/passwd", False),
        ("", False),
    ],
)
def test_only_http_and_relative_links_are_kept(target, kept):
    assert bool(safe_href(target)) == kept


def test_the_dag_is_laid_out_by_dependency_depth():
    boxes = [
        svg.Box("a", "Succeeded", "", ""),
        svg.Box("b", "Succeeded", "", "", ("a",)),
        svg.Box("c", "Failed", "", "", ("a", "b")),
        svg.Box("d", "Pending", "", "", ("d", "x")),  # itself and an unknown task: depth 0
    ]
    assert svg.depths(boxes) == {"a": 0, "b": 1, "c": 2, "d": 0}
    drawn = svg.dag([("main", boxes)])
    corners = [(float(x), float(y)) for x, y in re.findall(r"<rect x='(\d+)' y='(\d+)'", drawn)]
    assert [x for x, _ in corners] == [16, 206, 396, 16]  # columns a | b | c, d beside a
    assert corners[3][1] > corners[0][1]  # d: a second row in a's column
    assert drawn.count("class='edge'") == 3


def test_round_ticks_cover_the_data():
    assert svg.nice_ticks(0, 24) == [0, 5, 10, 15, 20, 25]
    assert svg.nice_ticks(1e-4, 1e-3)[0] <= 1e-4 and svg.nice_ticks(1e-4, 1e-3)[-1] >= 1e-3
    assert svg.nice_ticks(2.0, 2.0)[0] < 2.0 < svg.nice_ticks(2.0, 2.0)[-1]  # a flat line still gets an axis
    assert svg.nice_ticks(0, float("nan")) == []


def test_a_chart_without_finite_points_says_so():
    drawn = svg.line_chart("loss", [svg.Series("r", ((0.0, float("nan")), (1.0, float("inf"))))])
    assert "no data logged" in drawn and "<polyline" not in drawn


def test_several_runs_get_a_legend():
    drawn = svg.line_chart("loss", [svg.Series("a<b", ((0.0, 1.0), (1.0, 0.5))), svg.Series("c", ((0.0, 2.0),))])
    assert drawn.count("<polyline") == 2 and "a&lt;b" in drawn


def test_sections_read_an_evaluation_report_of_unknown_metrics():
    from tests.report_runs import eval_report

    report = eval_report(False)
    report["metrics"] = {"rouge_l": 0.5, "base_rouge_l": 0.25, "json_field_match": 1.0}
    report["thresholds"] = [{"metric": "rouge_l", "op": ">=", "value": 0.4, "actual": 0.5, "ok": True}, "junk"]
    facts_task = collect(
        {
            "spec": {
                "entrypoint": "main",
                "templates": [{"name": "main", "dag": {"tasks": [{"name": "score", "template": "score"}]}}],
            }
        }
    )
    page = Page(facts=facts_task, now=NOW, evaluations=[Evaluation(facts_task.tasks[0], report)])
    text = render(page)
    assert "rouge_l" in text and "json_field_match" in text and "+0.2500" in text
    assert "<td class='good'>pass</td>" in text


def test_validation_without_a_report_says_why():
    facts = collect(
        {
            "spec": {
                "entrypoint": "main",
                "templates": [{"name": "main", "dag": {"tasks": [{"name": "v", "template": "v"}]}}],
            }
        }
    )
    text = render(Page(facts=facts, now=NOW, validations=[Validation(facts.tasks[0], None, problem="gone <b>")]))
    assert "no validation report: gone &lt;b&gt;" in text
