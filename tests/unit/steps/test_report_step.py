"""The report step on run folders with a real MLflow (sqlite): the page, its artifact copy, every run ended."""

import os
import time
from pathlib import Path

import pytest

from eksflow.llm.steps import report
from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.report.step import main, run
from eksflow.runtime.rundir import RUN_DIR_ENV, report_path
from tests.report_runs import make_run


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def train_run(uri: str, workflow: str, *, tag: str = tracking.WORKFLOW_TAG, points: int = 5) -> str:
    """A run as the train step leaves it: RUNNING, tagged with its workflow, loss and LR every 5 steps."""
    run_id = tracking.start_run(uri, "eksflow", workflow, {"eksflow.step": "train", tag: workflow})
    for n in range(points):
        tracking.log_metrics(uri, run_id, {"loss": 2.5 - 0.4 * n, "learning_rate": 1e-3 / (n + 1)}, step=5 * n)
    return run_id


def status_of(uri: str, run_id: str) -> str:
    return tracking.client(uri).get_run(run_id).info.status


def args(tmp_path: Path, name: str, uri: str, status: str) -> report.Args:
    return report.Args(
        workflow_name=name,
        workflow_status=status,
        report_dir=tmp_path / "fsx-run",
        tracking_uri=uri,
        outputs_dir=tmp_path / "outputs",
    )


def test_a_succeeded_run_gets_its_page_logged_and_every_open_run_finished(tmp_path, uri, monkeypatch):
    name = "wf-succeeded"
    trained = train_run(uri, name)
    own_run = train_run(uri, name, tag="workflow_name", points=0)  # register's own run, found by its tag
    other = train_run(uri, "another-workflow", points=0)
    run_dir = make_run(tmp_path, "succeeded", run_id=trained, name=name)
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))

    outputs = run(args(tmp_path, name, uri, "Succeeded"))

    page = run_dir / "report.html"
    assert outputs.report == str(page) and report_path(run_dir) == page
    assert sorted(outputs.ended_runs) == sorted([trained, own_run])
    assert (status_of(uri, trained), status_of(uri, own_run), status_of(uri, other)) == ("FINISHED",) * 2 + ("RUNNING",)
    text = page.read_text()
    assert text.count("<polyline class='series'") == 2 and "gate PASSED" in text
    assert f"{trained}</code> {name} \u2192 <b>FINISHED" in text
    assert f"{name} (FINISHED)" in text  # the training section reads the run after ending it
    assert (tmp_path / "outputs" / "report.html").read_bytes() == page.read_bytes()  # the Argo artifact
    assert not (tmp_path / "fsx-run").exists()  # a local run's page lives in the run folder only
    logged = [a.path for a in tracking.client(uri).list_artifacts(trained, "report")]
    assert logged == ["report/report.html"]


def test_a_failed_run_ends_the_run_its_failed_train_task_never_named(tmp_path, uri, monkeypatch):
    name = "wf-failed"
    orphan = train_run(uri, name)  # the train task failed before writing its mlflow_run_id output
    run_dir = make_run(tmp_path, "failed", run_id="", name=name)
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))

    outputs = run(args(tmp_path, name, uri, "Failed"))

    assert outputs.ended_runs == [orphan] and status_of(uri, orphan) == "FAILED"
    text = Path(outputs.report).read_text()
    assert "<header class='Failed'>" in text and text.count("<polyline class='series'") == 2  # curve up to the failure


def test_a_resumed_workflows_report_finishes_the_run_its_failed_try_ended_and_says_succeeded(
    tmp_path, uri, monkeypatch
):
    name = "wf-resumed"
    trained = train_run(uri, name)  # its train task succeeded on the first try and is kept by the resume
    attempt = train_run(uri, name, points=0)  # a failed attempt's run: no output names it
    run_dir = make_run(tmp_path, "succeeded", run_id=trained, name=name)
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))
    first = run(args(tmp_path, name, uri, "Failed"))  # a later task failed: the first try's exit handler
    assert sorted(first.ended_runs) == sorted([trained, attempt]) and status_of(uri, trained) == "FAILED"

    again = run(args(tmp_path, name, uri, "Succeeded"))  # resumed, it succeeded: the exit handler runs again

    assert again.ended_runs == [trained]
    assert (status_of(uri, trained), status_of(uri, attempt)) == ("FINISHED", "FAILED")
    text = Path(again.report).read_text()
    assert "<header class='Succeeded'>" in text and f"{trained}</code> {name} \u2192 <b>FINISHED" in text


def test_runs_of_a_workflow_still_running_are_left_alone(tmp_path, uri, monkeypatch):
    name = "wf-running"
    trained = train_run(uri, name, points=1)
    run_dir = make_run(tmp_path, "succeeded", run_id=trained, name=name)
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))
    (run_dir / "status.json").write_text((run_dir / "status.json").read_text().replace('"Succeeded"', '"Running"', 1))

    outputs = run(args(tmp_path, name, uri, ""))

    assert outputs.ended_runs == [] and status_of(uri, trained) == "RUNNING"
    assert "the workflow is Running: its MLflow runs were left as they are" in Path(outputs.report).read_text()


def test_without_mlflow_the_page_is_still_written(tmp_path, monkeypatch):
    run_dir = make_run(tmp_path, "skipped")
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))
    outputs = run(args(tmp_path, "x", "", "Succeeded"))
    assert outputs.ended_runs == [] and "training did not run" in Path(outputs.report).read_text()


def test_without_a_workflow_to_read_it_still_ends_the_runs_then_fails_retryably(tmp_path, uri, monkeypatch):
    name = "wf-unreadable"
    orphan = train_run(uri, name, points=0)
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    argv = [f"--workflow-name={name}", "--workflow-status=Error", f"--report-dir={tmp_path}", f"--tracking-uri={uri}"]
    assert main([*argv, f"--outputs-dir={tmp_path / 'out'}"]) == 1  # exit 1: Argo retries it
    assert status_of(uri, orphan) == "FAILED"
    assert not os.path.exists(tmp_path / "report.html")


def test_a_resumed_trainings_curve_has_each_step_once_with_the_value_logged_last(uri):
    """Killed after logging step 10, the trainer resumed from its checkpoint of step 8 and logged 9 and 10 again: the
    report plots the resumed run's values, what the adapter carries on from, once per step."""
    from eksflow.llm.steps.report.runs import read_training_runs

    run_id = tracking.start_run(uri, "eksflow", "wf-resumed", {"eksflow.step": "train"})
    for step in range(1, 11):
        tracking.log_metrics(uri, run_id, {"loss": 3.0 - 0.1 * step}, step=step)
    time.sleep(0.01)  # MLflow's timestamps are milliseconds: the retry logs later
    for step in (9, 10):
        tracking.log_metrics(uri, run_id, {"loss": 1.0}, step=step)
    (training,), problems = read_training_runs(uri, "", [run_id])
    assert problems == []
    steps = [step for step, _ in training.history["loss"]]
    assert steps == list(range(1, 11))
    assert dict(training.history["loss"])[9.0] == dict(training.history["loss"])[10.0] == 1.0
