"""The report's collectors: a Workflow (local run folder, Argo object, API answer) to tasks, phases and sections."""

import base64
import gzip
import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eksflow.llm.steps.common.kube_api import ApiAccess, KubeApiError
from eksflow.llm.steps.report import collect as c
from eksflow.llm.steps.report.workflow import (
    WorkflowUnavailableError,
    fetch_workflow,
    host_paths,
    normalise,
    read_local,
)
from tests.report_runs import NAME, make_run


def facts_of(tmp_path, scenario, **kw):
    run_dir = make_run(tmp_path, scenario, **kw)
    workflow = read_local(run_dir)
    return workflow, c.collect(workflow)


def phases(facts):
    return {(t.dag, t.name): t.phase for t in facts.tasks}


def test_a_succeeded_local_run_has_every_task_with_its_phase_needs_and_step(tmp_path):
    _, facts = facts_of(tmp_path, "succeeded", run_id="r1")
    assert facts.name == NAME and facts.title.startswith("LoRA fine-tune of")
    # The rollout's other tasks have no node in this made-up run folder: Pending.
    assert {k: v for k, v in phases(facts).items() if v != "Pending"} == {
        **{("main", t): "Succeeded" for t in ("champion", "stage-data", "validate-data", "train", "evaluate")},
        ("main", "register"): "Succeeded",
        ("main", "promote"): "Succeeded",
        ("exit", "report"): "Running",
    }
    tasks = {t.name: t for t in facts.tasks}
    assert tasks["evaluate"].needs == ("stage-data", "train", "champion")  # judged against this run's champion
    assert tasks["register"].step == "eksflow.llm.steps.register" and tasks["report"].step == "eksflow.llm.steps.report"
    assert tasks["train"].duration_s(datetime.now(timezone.utc)) == 360.0
    assert facts.parameters["retrain"] == "always"
    assert c.training_run_ids(facts) == ["r1"] and c.run_ids(facts) == ["r1"]
    assert [t.name for t in c.evaluation_tasks(facts)] == ["evaluate"]
    assert [t.name for t in c.validation_tasks(facts)] == ["validate-data"]
    assert [t.name for t in c.registration_tasks(facts)] == ["register"]
    assert {"serve-champion", "load-candidate", "analyze-10", "promote", "finish-rollout"} <= {
        t.name for t in c.rollout_tasks(facts)
    }


def test_the_exit_handlers_workflow_status_wins_over_the_status_phase(tmp_path):
    workflow, _ = facts_of(tmp_path, "succeeded")
    workflow["status"]["phase"] = "Running"  # what Argo shows while the exit handler runs
    assert c.collect(workflow).phase == "Running"
    assert c.collect(workflow, "Failed").phase == "Failed"


def test_a_failed_run_keeps_failed_and_omitted_tasks_with_their_messages(tmp_path):
    _, facts = facts_of(tmp_path, "failed")
    tasks = {t.name: t for t in facts.tasks}
    assert tasks["evaluate"].phase == "Failed" and "MLflow down" in tasks["evaluate"].message
    assert tasks["evaluate"].outputs == {}
    assert tasks["promote"].phase == "Omitted" and tasks["promote"].started_at is None
    assert facts.phase == "Failed"


def test_skipped_training_reports_no_run_ids(tmp_path):
    _, facts = facts_of(tmp_path, "skipped")
    assert [t.phase for t in c.training_tasks(facts)] == ["Skipped"]
    assert c.run_ids(facts) == []


def test_a_failed_task_s_report_is_found_from_its_report_dir_argument(tmp_path):
    _, facts = facts_of(tmp_path, "invalid-data")
    (validate,) = c.validation_tasks(facts)
    assert validate.phase == "Failed" and "report" not in validate.outputs
    assert c.arg_path(validate, "report-dir", NAME, "validation.json") == f"/fsx/runs/{NAME}/reports/validation.json"
    assert c.arg_path(validate, "no-such-flag", NAME, "x") is None


def test_container_paths_map_to_the_executor_s_host_folders(tmp_path):
    workflow, _ = facts_of(tmp_path, "succeeded")
    to_host = host_paths(workflow, tmp_path / "runs" / NAME)
    assert to_host(f"/fsx/runs/{NAME}/reports/x.json") == str(
        tmp_path / "volumes" / "fsx-claim" / "runs" / NAME / "reports" / "x.json"
    )
    assert to_host("/fsx") == str(tmp_path / "volumes" / "fsx-claim")
    assert to_host("/fsxother/a") == "/fsxother/a"  # a sibling folder is on no volume
    assert to_host("/tmp/outputs/a") == "/tmp/outputs/a"


def argo_workflow() -> dict:
    """A Workflow object as the API returns it: from a WorkflowTemplate, a retried task, compressed nodes."""
    spec = {
        "entrypoint": "main",
        "onExit": "exit-handler",
        "templates": [
            {
                "name": "main",
                "dag": {
                    "tasks": [
                        {"name": "a", "template": "a"},
                        {"name": "b", "template": "b", "depends": "a.Succeeded && (a.Failed || a.Errored)"},
                        {"name": "sweep", "template": "sweep", "depends": "a"},
                    ]
                },
            },
            {"name": "exit-handler", "dag": {"tasks": [{"name": "report", "template": "report"}]}},
            {
                "name": "a",
                "container": {
                    "image": "x",
                    "command": ["python", "-m", "eksflow.llm.steps.train"],
                    "args": ["--run-name=wf"],
                },
            },
            {
                "name": "b",
                "resource": {"action": "create", "manifest": "entrypoint: python -m eksflow.llm.steps.evaluate --x=1"},
            },
            {"name": "report", "container": {"image": "x", "command": ["python", "-m", "eksflow.llm.steps.report"]}},
        ],
    }
    nodes = {
        "wf": {"id": "wf", "displayName": "wf", "type": "DAG", "phase": "Running"},
        "wf-1": {
            "displayName": "a",
            "type": "Retry",
            "boundaryID": "wf",
            "phase": "Succeeded",
            "startedAt": "2026-05-01T10:00:00Z",
            "finishedAt": "2026-05-01T10:05:00Z",
            "outputs": {
                "parameters": [{"name": "mlflow_run_id", "value": "r9"}, {"name": "final_loss", "value": "0.5"}]
            },
        },
        "wf-2": {"displayName": "a(0)", "type": "Pod", "boundaryID": "wf", "phase": "Failed", "message": "OOMKilled"},
        "wf-3": {"displayName": "a(1)", "type": "Pod", "boundaryID": "wf", "phase": "Succeeded"},
        "wf-4": {"displayName": "b", "type": "Skipped", "boundaryID": "wf", "phase": "Omitted"},
        "wf-5": {
            "displayName": "sweep",
            "type": "TaskGroup",
            "boundaryID": "wf",
            "phase": "Succeeded",
            "outputs": {"parameters": [{"name": "mlflow_run_id", "value": '["r10", "r11"]'}]},
        },
        "wf-6": {"displayName": "sweep(0:x)", "boundaryID": "wf", "phase": "Succeeded"},
        "wf-7": {"displayName": "sweep(1:y)", "boundaryID": "wf", "phase": "Succeeded"},
        "wf-8": {"displayName": "a", "boundaryID": "wf-6", "phase": "Succeeded"},  # a fan-out body's task
        "wf-9": {"displayName": "wf.onExit", "type": "DAG", "boundaryID": "wf", "phase": "Running"},
        "wf-10": {"displayName": "report", "type": "Pod", "boundaryID": "wf-9", "phase": "Running"},
    }
    packed = base64.b64encode(gzip.compress(json.dumps(nodes).encode())).decode()
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "wf", "annotations": {"workflows.argoproj.io/title": "T"}},
        "spec": {"workflowTemplateRef": {"name": "t"}, "arguments": {"parameters": [{"name": "p", "value": "1"}]}},
        "status": {"phase": "Running", "storedWorkflowTemplateSpec": spec, "compressedNodes": packed},
    }


def test_an_argo_workflow_object_reads_like_a_local_run():
    facts = c.collect(normalise(argo_workflow()), "Succeeded")
    assert phases(facts) == {
        ("main", "a"): "Succeeded",  # the Retry node, not its first (failed) pod
        ("main", "b"): "Omitted",
        ("main", "sweep"): "Succeeded",
        ("exit", "report"): "Running",
    }
    tasks = {t.name: t for t in facts.tasks}
    assert tasks["b"].needs == ("a",) and tasks["b"].step == "eksflow.llm.steps.evaluate"
    assert tasks["sweep"].items == 2 and tasks["a"].items == 0  # a retry's pods are not fan-out items
    assert tasks["a"].args == ("--run-name=wf",)
    assert facts.parameters == {"p": "1"} and facts.title == "T" and facts.phase == "Succeeded"
    assert c.run_ids(facts) == ["r9", "r10", "r11"] and c.training_run_ids(facts) == ["r9"]


def test_offloaded_node_status_is_said_not_guessed():
    workflow = argo_workflow()
    workflow["status"] = {
        "phase": "Running",
        "offloadNodeStatusVersion": "abc",
        "storedWorkflowTemplateSpec": workflow["status"]["storedWorkflowTemplateSpec"],
    }
    facts = c.collect(normalise(workflow))
    assert {t.phase for t in facts.tasks} == {"Pending"} and "offloaded" in facts.nodes_missing


class _Api(BaseHTTPRequestHandler):
    seen: list = []
    answer: tuple[int, bytes] = (200, b"{}")

    def do_GET(self):
        _Api.seen.append((self.path, self.headers.get("Authorization")))
        code, body = _Api.answer
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Api.seen = []
    yield ApiAccess(f"http://127.0.0.1:{server.server_port}", "tok3n", "argo")
    server.shutdown()
    server.server_close()


def test_the_workflow_is_read_from_the_kubernetes_api_with_the_service_account_token(api):
    _Api.answer = (200, json.dumps(argo_workflow()).encode())
    workflow = fetch_workflow("wf", api)
    assert _Api.seen == [("/apis/argoproj.io/v1alpha1/namespaces/argo/workflows/wf", "Bearer tok3n")]
    assert workflow["spec"]["entrypoint"] == "main" and "a" in {
        n["displayName"] for n in workflow["status"]["nodes"].values()
    }


def test_a_forbidden_answer_names_the_missing_permission(api):
    _Api.answer = (403, b'{"kind":"Status"}')
    with pytest.raises(WorkflowUnavailableError, match="HTTP 403; grant the pipeline's Role `get` on workflows"):
        fetch_workflow("wf", api)


def test_outside_a_pod_and_a_local_run_there_is_no_workflow_to_read(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeApiError, match="neither"):
        ApiAccess.in_cluster()


def test_the_in_cluster_account_is_read_from_its_files(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    (tmp_path / "token").write_text("t0k\n")
    (tmp_path / "namespace").write_text("argo")
    access = ApiAccess.in_cluster(tmp_path)
    assert access == ApiAccess("https://[fd00::1]:6443", "t0k", "argo", str(tmp_path / "ca.crt"))
