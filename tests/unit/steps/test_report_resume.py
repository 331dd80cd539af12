"""A failed run, fixed and resumed, ends Succeeded: its exit handler's report and alert say so, and its MLflow run
ends FINISHED (the report and alert steps as they are, run by the local executor, against a real MLflow on sqlite)."""

from pathlib import Path

from eksflow.llm.steps.common import tracking
from eksflow.local import resume_workflow, run_workflow
from tests.unit.local.manifests import WRITE_OUTPUT, container, dag, outputs, task, workflow

REPO = Path(__file__).resolve().parents[3]
NAME = "report-resume"
BROKEN_UNTIL_FIXED = "import os, sys; sys.exit(1 if os.path.exists(sys.argv[1]) else 0)"


def step(name: str, module: str, *args: str, **extra) -> dict:
    return {
        "name": name,
        "container": {"image": "steps:1", "command": ["python", "-m", module], "args": list(args)},
        **extra,
    }


def manifest(tmp_path: Path, uri: str, run_id: str) -> dict:
    report = step(
        "report",
        "eksflow.llm.steps.report",
        "--workflow-name={{workflow.name}}",
        "--workflow-status={{workflow.status}}",
        f"--report-dir={tmp_path / 'reports'}",
        f"--tracking-uri={uri}",
        "--outputs-dir=/tmp/outputs",
        outputs=outputs("report", "ended_runs"),
    )
    alert = step("alert", "eksflow.llm.steps.alert", "--message=workflow {{workflow.name}} is {{workflow.status}}")
    exit_handler = dag(
        "exit-handler",
        [task("report", "report"), task("alert", "alert", "report", when="{{workflow.status}} != Succeeded")],
    )
    trained = container("train", WRITE_OUTPUT, "/tmp/outputs/mlflow_run_id", run_id, outputs=outputs("mlflow_run_id"))
    check = container("check", BROKEN_UNTIL_FIXED, str(tmp_path / "broken"))
    built = workflow(
        [task("train", "train"), task("check", "check", "train")],
        [trained, check, report, alert, exit_handler],
        onExit="exit-handler",
    )
    built["metadata"] = {"name": NAME}
    return built


def test_a_resumed_run_that_succeeds_gets_a_succeeded_report_no_alert_and_a_finished_mlflow_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "eksflow", NAME, {tracking.WORKFLOW_TAG: NAME})  # as the train step leaves it
    (tmp_path / "broken").touch()  # one bad data row, say
    settings = {"cwd": REPO, "env": {"PYTHONPATH": str(REPO)}}

    first = run_workflow(manifest(tmp_path, uri, run_id), tmp_path / "state", **settings)
    assert first.phase == "Failed"
    assert first.nodes["onExit.alert"].message.endswith(f"workflow {NAME} is Failed")
    page = first.run_dir / "report.html"
    assert "<header class='Failed'>" in page.read_text()
    assert tracking.client(uri).get_run(run_id).info.status == "FAILED"

    (tmp_path / "broken").unlink()  # fixed
    again = resume_workflow(first.run_dir, **settings)

    assert again.phase == "Succeeded", again.message
    assert again.nodes["onExit.report"].outputs["ended_runs"] == f'["{run_id}"]'
    assert again.nodes["onExit.alert"].phase == "Skipped"
    text = page.read_text()
    assert "<header class='Succeeded'>" in text and "<header class='Failed'>" not in text
    assert tracking.client(uri).get_run(run_id).info.status == "FINISHED"
