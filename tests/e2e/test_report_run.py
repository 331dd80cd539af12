"""A real local run of a tiny pipeline with the report in its exit handler: the page lands in the run folder with
the DAG as it ran, the task is an Argo output artifact, and `run` prints the page's host path."""

import io
import json
from pathlib import Path

from rich.console import Console

from eksflow import Pipeline, PipelineConfig, name_field, retry, task
from eksflow.llm.steps import alert, champion, report
from eksflow.render import manifest
from eksflow.run import execute
from eksflow.runtime.rundir import report_path

ROOT = Path(__file__).resolve().parents[2]


class TinyConfig(PipelineConfig):
    """No sections of its own: the smallest pipeline there is."""

    name: str = name_field("tiny")


def tiny(fail: bool) -> dict:
    """Two quick tasks (the champion step without a tracking URI touches no registry), one that fails on demand."""
    with Pipeline(TinyConfig(), title="A tiny <b>pipeline</b>") as p:
        first = task(champion, retrain="always", model_name="m", tracking_uri="")
        task(champion, task_name="again", after=first, retrain="always", model_name="m", tracking_uri="")
        if fail:
            task(alert, message="boom <script>alert(1)</script>", after=first, retry_strategy=retry(0))
        with p.on_exit():
            task(report, workflow_name=p.workflow_name, workflow_status=p.workflow_status, report_dir=p.run_dir)
    return manifest(p)


def test_a_local_run_writes_its_report_and_prints_where(tmp_path):
    out = io.StringIO()
    code = execute(tiny(fail=True), tmp_path, None, Console(file=out, width=400), root=ROOT)
    assert code == 1  # the alert task failed the run
    (run_dir,) = (tmp_path / "runs").iterdir()
    nodes = json.loads((run_dir / "status.json").read_text())["status"]["nodes"]
    assert nodes["onExit.report"]["phase"] == "Succeeded", (run_dir / "logs" / "onExit.report.log").read_text()
    page = report_path(run_dir)
    assert page == run_dir / "report.html"
    assert f"report: {page}" in out.getvalue()
    text = page.read_text()
    assert "<header class='Failed'>" in text and "A tiny &lt;b&gt;pipeline&lt;/b&gt;" in text
    phases = {"champion": "Succeeded", "again": "Succeeded", "alert": "Failed", "report": "Running"}
    for name, phase in phases.items():
        assert f"<g class='task' data-phase='{phase}'><title>{name} (eksflow.llm.steps." in text, name
    assert "boom &lt;script&gt;" in text and "<script" not in text
    artifact = run_dir / "tasks" / "onExit.report" / "outputs" / "report.html"
    assert artifact.read_bytes() == page.read_bytes()  # what Argo uploads as the output artifact `report`
