"""The report task as the cluster gets it: in the flagship's exit handler, an unarchived HTML output artifact the
Argo UI can show, and a Role that lets its pod read its own Workflow."""

from pathlib import Path

import yaml

from eksflow.llm.steps import report
from eksflow.runtime.rundir import REPORT_FILE
from eksflow.templates import OUTPUTS_DIR
from tests.flagship import rendered

ROOT = Path(__file__).resolve().parents[2]


def test_the_flagship_reports_from_its_exit_handler_with_the_workflow_outcome():
    spec = rendered()["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    # After the rollout's exit task, whatever its outcome, so the page shows a rollback.
    exit_tasks = {t["name"]: t for t in templates[spec["onExit"]]["dag"]["tasks"]}
    assert list(exit_tasks) == ["finish-rollout", "report"]
    assert exit_tasks["report"]["depends"].startswith("(finish-rollout.Succeeded || finish-rollout.Skipped ||")
    args = templates["report"]["container"]["args"]
    assert "--workflow-status={{workflow.status}}" in args and "--workflow-name={{workflow.name}}" in args
    assert templates["report"]["container"]["command"] == ["python", "-m", "eksflow.llm.steps.report"]


def test_the_page_is_an_unarchived_output_artifact():
    (template,) = [t for t in rendered()["spec"]["templates"] if t["name"] == "report"]
    assert template["outputs"]["artifacts"] == [
        {"name": "report", "path": f"{OUTPUTS_DIR}/{REPORT_FILE}", "archive": {"none": {}}, "optional": True}
    ]
    assert report.ARTIFACTS == {"report": report.REPORT_FILE} and report.REPORT_FILE == REPORT_FILE


def test_the_pipeline_role_may_get_workflows():
    documents = yaml.safe_load_all((ROOT / "workflow-templates" / "cluster-prerequisites.yaml").read_text())
    (role,) = [d for d in documents if d["kind"] == "Role"]
    rules = [r for r in role["rules"] if "argoproj.io" in r["apiGroups"] and "workflows" in r["resources"]]
    assert rules and "get" in rules[0]["verbs"]
