"""list / get / logs / retry / resubmit against a real local server speaking the Argo Server REST API.

Request bodies are validated against the official swagger definitions; so are the answers the fake server gives,
so the fixtures are real Argo shapes.
"""

import json
import threading
from datetime import datetime, timezone

import pytest

from eksflow.argo_client import ArgoServer, ArgoServerError, StreamIdleError
from eksflow.argo_server import (
    ParameterError,
    get_workflow,
    list_workflows,
    parse_parameters,
    pod_name,
    resubmit_workflow,
    retry_workflow,
    workflow_logs,
)
from tests.contract.fake_argo import STALL, Reply, start, workflow

NAME = "llama-lora-x7k2p"
WF_PATH = f"/api/v1/workflows/argo/{NAME}"
HANG_GUARD_S = 60  # only a hang reaches it: the read timeout under test is 0.2 s


def _node(node_id, display, node_type, phase, started=None, finished=None, **extra):
    node = {
        "id": node_id,
        "name": f"{NAME}.{display}" if display != NAME else NAME,
        "displayName": display,
        "type": node_type,
        "phase": phase,
        "templateName": display.split("(")[0] if display != NAME else "main",
        **extra,
    }
    if started:
        node["startedAt"] = started
    if finished:
        node["finishedAt"] = finished
    return node


NODES = {
    NAME: _node(NAME, NAME, "DAG", "Failed", "2026-05-01T10:00:00Z", children=[f"{NAME}-1", f"{NAME}-2"]),
    f"{NAME}-1": _node(
        f"{NAME}-1",
        "stage-data",
        "Pod",
        "Succeeded",
        "2026-05-01T10:00:05Z",
        "2026-05-01T10:01:05Z",
        outputs={"parameters": [{"name": "dataset_dir", "value": "/fsx/data/v3"}]},
    ),
    f"{NAME}-2": _node(
        f"{NAME}-2",
        "train",
        "Retry",
        "Failed",
        "2026-05-01T10:01:10Z",
        "2026-05-01T10:05:00Z",
        message="No more retries left",
        children=[f"{NAME}-3", f"{NAME}-4"],
    ),
    f"{NAME}-3": _node(
        f"{NAME}-3", "train(0)", "Pod", "Failed", "2026-05-01T10:01:10Z", "2026-05-01T10:02:00Z", message="OOMKilled"
    ),
    f"{NAME}-4": _node(
        f"{NAME}-4", "train(1)", "Pod", "Failed", "2026-05-01T10:02:30Z", "2026-05-01T10:05:00Z", message="exit code 1"
    ),
    f"{NAME}-5": _node(f"{NAME}-5", "deploy", "Skipped", "Omitted", message="when 'false == true' evaluated false"),
}
FAILED = workflow(NAME, "Failed", finishedAt="2026-05-01T10:05:00Z", message="child failed", nodes=NODES)
TRAIN_POD_0 = pod_name(NAME, f"{NAME}.train(0)", "train")
TRAIN_POD_1 = pod_name(NAME, f"{NAME}.train(1)", "train")
STAGE_POD = pod_name(NAME, f"{NAME}.stage-data", "stage-data")


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("EKSFLOW_ARGO_READ_TIMEOUT", "0.2")
    server, stop = start()
    yield server
    stop()


def connect(fake) -> ArgoServer:
    return ArgoServer.from_env(
        {"ARGO_SERVER": fake.address, "ARGO_SECURE": "false", "EKSFLOW_ARGO_READ_TIMEOUT": "0.2"}
    )


def in_thread(action):
    """Run `action` with a hang guard; return its result or raise its exception."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = action()
        except Exception as err:
            outcome["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "the call hung"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_the_fixtures_are_argo_workflows(swagger_validator):
    validator = swagger_validator("io.argoproj.workflow.v1alpha1.Workflow")
    assert [e.message for e in validator.iter_errors(FAILED)] == []


# --- list -----------------------------------------------------------------------------------------------------------


def test_list_filters_by_pipeline_pages_and_sorts_newest_first(fake, swagger_validator):
    older = workflow("llama-lora-aaaaa", "Succeeded", finishedAt="2026-05-01T10:30:00Z")
    newer = workflow("llama-lora-bbbbb", "Running")
    newer["status"]["startedAt"] = "2026-05-02T08:00:00Z"
    first = {"metadata": {"continue": "page-2"}, "items": [older]}
    second = {"metadata": {}, "items": [newer]}
    validator = swagger_validator("io.argoproj.workflow.v1alpha1.WorkflowList")
    assert [e.message for page in (first, second) for e in validator.iter_errors(page)] == []
    fake.route("GET", "/api/v1/workflows/argo", Reply(200, first), Reply(200, second))

    runs = list_workflows(connect(fake), pipeline="llama-lora")

    assert [r.name for r in runs] == ["llama-lora-bbbbb", "llama-lora-aaaaa"]
    assert (runs[1].phase, runs[1].duration_s, runs[1].pipeline) == ("Succeeded", 1800.0, "llama-lora")
    assert runs[1].started == datetime(2026, 5, 1, 10, tzinfo=timezone.utc)
    assert runs[0].finished is None and runs[0].duration_s is not None  # running: counted up to now
    first_query, second_query = (r.query for r in fake.requests)
    assert first_query["listOptions.labelSelector"] == "eksflow.dev/pipeline=llama-lora"
    assert "items.status.phase" in first_query["fields"].split(",")
    assert "listOptions.continue" not in first_query and second_query["listOptions.continue"] == "page-2"


def test_an_empty_namespace_lists_nothing(fake):
    fake.route("GET", "/api/v1/workflows/argo", Reply(200, {"metadata": {}, "items": None}))
    assert list_workflows(connect(fake)) == []
    assert "listOptions.labelSelector" not in fake.requests[0].query


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(200, b"<html>Sign in with SSO</html>", "text/html"), "answered 200 with HTML"),
        (Reply(200, {}), "not a list"),
        (Reply(200, {"metadata": {}, "items": [{"kind": "Pod"}]}), "not a Workflow"),
        (Reply(403, {"code": 7, "message": "forbidden"}), "HTTP 403"),
        (Reply(hang=True), "did not answer within 0.2 s"),
    ],
    ids=["html", "{}", "foreign-item", "403", "hang"],
)
def test_list_failures_are_one_line(fake, reply, expected):
    fake.route("GET", "/api/v1/workflows/argo", reply)
    with pytest.raises(ArgoServerError) as caught:
        in_thread(lambda: list_workflows(connect(fake)))
    assert expected in str(caught.value) and "\n" not in str(caught.value)


# --- get ------------------------------------------------------------------------------------------------------------


def test_get_shows_tasks_attempts_outputs_and_messages(fake):
    fake.route("GET", WF_PATH, Reply(200, FAILED))
    detail = get_workflow(connect(fake), NAME)
    assert (detail.summary.phase, detail.summary.message, detail.summary.duration_s) == ("Failed", "child failed", 300)
    assert detail.parameters == {"base_model": "smollm2"}
    rows = [(t.name, t.type, t.phase, t.attempt_of) for t in detail.tasks]
    assert rows == [
        ("stage-data", "Pod", "Succeeded", ""),
        ("train", "Retry", "Failed", ""),
        ("train(0)", "Pod", "Failed", "train"),
        ("train(1)", "Pod", "Failed", "train"),
        ("deploy", "Skipped", "Omitted", ""),  # never started: listed last
    ]
    stage, _, first, second, _ = detail.tasks
    assert stage.outputs == {"dataset_dir": "/fsx/data/v3"} and stage.pod_name == STAGE_POD
    assert (first.message, first.pod_name, second.pod_name) == ("OOMKilled", TRAIN_POD_0, TRAIN_POD_1)
    assert first.finished == datetime(2026, 5, 1, 10, 2, tzinfo=timezone.utc)


def test_get_of_a_missing_workflow_is_one_line(fake):
    fake.route("GET", "/api/v1/workflows/argo/nope", Reply(404, {"code": 5, "message": 'workflows "nope" not found'}))
    with pytest.raises(ArgoServerError, match=r'HTTP 404 .*: workflows "nope" not found; no such workflow'):
        get_workflow(connect(fake), "nope")


def test_pod_names_follow_argo_v2_naming():
    # FNV-1a 32-bit test vectors: "" -> 2166136261, "a" -> 0xe40c292c, "foobar" -> 0xbf9cf968
    assert pod_name("wf", "a", "tpl") == f"wf-tpl-{0xE40C292C}"
    assert pod_name("wf", "foobar", "") == f"wf-{0xBF9CF968}"
    assert pod_name("wf", "wf", "main") == "wf"  # the workflow's own node
    long = pod_name("w" * 200, "foobar", "t" * 100)
    assert long == "w" * 200 + "-" + "t" * 41 + f"-{0xBF9CF968}"  # prefix cut at 253 - 10 - 1 characters


def test_v1_pod_names_are_node_ids(fake):
    v1 = json.loads(json.dumps(FAILED))
    v1["metadata"]["annotations"] = {"workflows.argoproj.io/pod-name-format": "v1"}
    fake.route("GET", WF_PATH, Reply(200, v1))
    pods = [t.pod_name for t in get_workflow(connect(fake), NAME).tasks if t.pod_name]
    assert pods == [f"{NAME}-1", f"{NAME}-3", f"{NAME}-4"]


# --- logs -----------------------------------------------------------------------------------------------------------


def entry(pod, content, sse=False):
    line = json.dumps({"result": {"podName": pod, "content": content}})
    return f"data: {line}\n\n".encode() if sse else f"{line}\n".encode()


@pytest.mark.parametrize("sse", [False, True], ids=["json-lines", "server-sent-events"])
def test_logs_of_a_whole_run_name_each_task(fake, sse):
    fake.route("GET", WF_PATH, Reply(200, FAILED))
    fake.route(
        "GET",
        f"{WF_PATH}/log",
        Reply(chunks=[entry(STAGE_POD, "staged 2 files", sse), entry(TRAIN_POD_0, "step 1 loss 2.3", sse)]),
    )
    lines = list(workflow_logs(connect(fake), NAME))
    assert [(line.task, line.content) for line in lines] == [
        ("stage-data", "staged 2 files"),
        ("train(0)", "step 1 loss 2.3"),
    ]
    query = fake.requests[-1].query
    assert query == {"logOptions.container": "main"}  # every pod, not followed


def test_logs_of_one_task_read_each_attempt(fake):
    fake.route("GET", WF_PATH, Reply(200, FAILED))
    fake.route("GET", f"{WF_PATH}/log", lambda r: Reply(chunks=[entry(r.query["podName"], f"in {r.query['podName']}")]))
    lines = list(workflow_logs(connect(fake), NAME, "train"))
    assert [line.content for line in lines] == [f"in {TRAIN_POD_0}", f"in {TRAIN_POD_1}"]
    assert [r.query.get("podName") for r in fake.requests[1:]] == [TRAIN_POD_0, TRAIN_POD_1]


def test_logs_of_an_unknown_task_name_the_known_ones(fake):
    fake.route("GET", WF_PATH, Reply(200, FAILED))
    with pytest.raises(
        ArgoServerError, match=r"no task 'evaluate' that ran a pod; tasks with logs: stage-data, train$"
    ):
        list(workflow_logs(connect(fake), NAME, "evaluate"))


def test_follow_resumes_a_quiet_stream_without_repeating_lines(fake):
    running = workflow(NAME, "Running", nodes={k: v for k, v in NODES.items() if k in (NAME, f"{NAME}-1")})
    fake.route("GET", WF_PATH, Reply(200, running))
    stamp = "2026-05-01T10:00:0{}.{}Z "

    def logs(request):
        if "logOptions.sinceTime.seconds" not in request.query:
            return Reply(
                chunks=[
                    entry(STAGE_POD, stamp.format(0, 1) + "a"),
                    entry(STAGE_POD, stamp.format(1, 1) + "b"),
                    entry(STAGE_POD, stamp.format(1, 2) + "b"),  # the same text twice in one second: both shown
                    STALL,  # quiet for longer than the read timeout
                ]
            )
        assert request.query["logOptions.sinceTime.seconds"] == str(
            int(datetime(2026, 5, 1, 10, 0, 1, tzinfo=timezone.utc).timestamp())
        )
        # the server replays the whole second it resumes from
        return Reply(
            chunks=[
                entry(STAGE_POD, stamp.format(1, 1) + "b"),
                entry(STAGE_POD, stamp.format(1, 2) + "b"),
                entry(STAGE_POD, stamp.format(2, 1) + "c"),
            ]
        )

    fake.route("GET", f"{WF_PATH}/log", logs)
    lines = in_thread(lambda: list(workflow_logs(connect(fake), NAME, "stage-data", follow=True)))
    assert [line.content for line in lines] == ["a", "b", "b", "c"]
    log_requests = [r for r in fake.requests if r.path.endswith("/log")]
    assert len(log_requests) == 2
    assert log_requests[0].query["logOptions.follow"] == "true"
    assert log_requests[0].query["logOptions.timestamps"] == "true"


def test_follow_ends_when_a_quiet_run_has_finished(fake):
    fake.route("GET", WF_PATH, Reply(200, workflow(NAME, "Running", nodes=NODES)), Reply(200, FAILED))
    fake.route("GET", f"{WF_PATH}/log", Reply(chunks=[entry(TRAIN_POD_1, "2026-05-01T10:04:00Z last words"), STALL]))
    lines = in_thread(lambda: list(workflow_logs(connect(fake), NAME, "train(1)", follow=True)))
    assert [(line.task, line.content) for line in lines] == [("train(1)", "last words")]
    assert len([r for r in fake.requests if r.path.endswith("/log")]) == 1


def test_a_quiet_stream_without_follow_is_one_line(fake):
    fake.route("GET", WF_PATH, Reply(200, FAILED))
    fake.route("GET", f"{WF_PATH}/log", Reply(chunks=[entry(STAGE_POD, "a"), STALL]))
    with pytest.raises(StreamIdleError, match=r"sent nothing for 0.2 s"):
        in_thread(lambda: list(workflow_logs(connect(fake), NAME)))


def test_an_error_in_the_stream_is_one_line(fake):
    fake.route("GET", WF_PATH, Reply(200, FAILED))
    error = {"error": {"grpc_code": 5, "http_code": 404, "message": 'pods "x" not found', "http_status": "Not Found"}}
    fake.route("GET", f"{WF_PATH}/log", Reply(chunks=[(json.dumps(error) + "\n").encode()]))
    with pytest.raises(ArgoServerError, match=r'the log stream from .* failed: pods "x" not found$'):
        list(workflow_logs(connect(fake), NAME))


# --- retry and resubmit ---------------------------------------------------------------------------------------------


def test_retry_sends_argo_retry_with_parameter_overrides(fake, swagger_validator):
    fake.route("PUT", f"{WF_PATH}/retry", Reply(200, workflow(NAME, "Running")))
    run = retry_workflow(connect(fake), NAME, parse_parameters(["train_max_steps=80", "note=a=b"]))
    assert (run.name, run.phase) == (NAME, "Running")
    (request,) = fake.requests
    body = request.json()
    validator = swagger_validator("io.argoproj.workflow.v1alpha1.WorkflowRetryRequest")
    assert [e.message for e in validator.iter_errors(body)] == []
    assert body == {
        "name": NAME,
        "namespace": "argo",
        "restartSuccessful": False,
        "parameters": ["train_max_steps=80", "note=a=b"],
    }
    assert request.headers["Content-Type"] == "application/json"


def test_resubmit_returns_the_new_run(fake, swagger_validator, monkeypatch):
    monkeypatch.setenv("ARGO_TOKEN", "s3cr3t")
    fake.route("PUT", f"{WF_PATH}/resubmit", Reply(200, workflow("llama-lora-9qz4m", "Pending")))
    server = ArgoServer.from_env({"ARGO_SERVER": fake.address, "ARGO_SECURE": "false", "ARGO_TOKEN": "s3cr3t"})
    run = resubmit_workflow(server, NAME, {"base_model": "s3://models/llama"}, memoized=True)
    assert (run.name, run.phase) == ("llama-lora-9qz4m", "Pending")
    (request,) = fake.requests
    validator = swagger_validator("io.argoproj.workflow.v1alpha1.WorkflowResubmitRequest")
    assert [e.message for e in validator.iter_errors(request.json())] == []
    assert request.json() == {
        "name": NAME,
        "namespace": "argo",
        "memoized": True,
        "parameters": ["base_model=s3://models/llama"],
    }
    assert request.headers["Authorization"] == "Bearer s3cr3t"


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(500, {"code": 13, "message": "workflow must be Failed/Error to retry"}), "must be Failed/Error"),
        (Reply(200, {}), "answered the retry with {}, not a Workflow"),
        (Reply(200, b"<html/>", "text/html"), "answered 200 with HTML"),
    ],
    ids=["refused", "{}", "html"],
)
def test_retry_failures_are_one_line(fake, reply, expected):
    fake.route("PUT", f"{WF_PATH}/retry", reply)
    with pytest.raises(ArgoServerError) as caught:
        retry_workflow(connect(fake), NAME)
    assert expected in str(caught.value)


@pytest.mark.parametrize("item", ["novalue", "=x", "bad name=x", "a.b=1"])
def test_a_malformed_parameter_is_bad_input(item):
    with pytest.raises(ParameterError, match="expected NAME=VALUE"):
        parse_parameters([item])


def test_a_workflow_name_cannot_reach_another_path(fake):
    with pytest.raises(ArgoServerError, match="is not a workflow name"):
        retry_workflow(connect(fake), "../other")
    assert fake.requests == []


# `data_source` is declared from `data.source` and taken whole by stage_data's --source: what the config refuses,
# `-p` is refused too, checked against the run's own Workflow before the server is asked to start anything.
HOSTILE_SOURCES = {
    "no-bucket": (
        "s3://",
        "-p data_source='s3://': eksflow.llm.steps.stage_data --source: Value error, names no valid bucket",
    ),
    "empty": ("", "-p data_source='': eksflow.llm.steps.stage_data --source: Value error, is empty"),
    "relative-file-uri": (
        "file://../../etc",
        "eksflow.llm.steps.stage_data --source: Value error, is not file:///absolute/path",
    ),
    "argo-expression": ("{{workflow.name}}", "-p data_source: holds '{{', which Argo would evaluate"),
    "too-long": ("a" * 70_000, "-p data_source: 70000 bytes of text; at most 65536"),
}


def flagship_run(stored: bool) -> dict:
    """A failed run of the flagship: its spec inline (submitted), or stored from its WorkflowTemplate (scheduled)."""
    from eksflow.config import load_config
    from eksflow.render import manifest
    from pipelines.llama_lora import LlamaLoraConfig, build

    spec = manifest(build(load_config(LlamaLoraConfig)))["spec"]
    run = workflow(NAME, "Failed")
    if stored:
        run["spec"] = {"workflowTemplateRef": {"name": "llama-lora"}}
        run["status"]["storedWorkflowTemplateSpec"] = spec
    else:
        run["spec"] = spec
    return run


def cli_verb(fake, capsys, monkeypatch, *argv: str) -> tuple[int, str]:
    from eksflow.cli import main
    from pipelines.llama_lora import build

    monkeypatch.setenv("ARGO_SERVER", fake.address)
    monkeypatch.setenv("ARGO_SECURE", "false")
    with pytest.raises(SystemExit) as exit_info:
        main(build, list(argv))
    return int(exit_info.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("stored", [False, True], ids=["submitted", "scheduled"])
@pytest.mark.parametrize("command", ["retry", "resubmit"])
@pytest.mark.parametrize("source", HOSTILE_SOURCES, ids=HOSTILE_SOURCES)
def test_a_parameter_the_config_refuses_is_refused_before_the_server_starts_a_run(
    fake, capsys, monkeypatch, swagger_validator, stored, command, source
):
    run = flagship_run(stored)
    assert [e.message for e in swagger_validator("io.argoproj.workflow.v1alpha1.Workflow").iter_errors(run)] == []
    fake.route("GET", WF_PATH, Reply(200, run))
    fake.route("PUT", f"{WF_PATH}/{command}", Reply(200, workflow(NAME, "Running")))
    value, why = HOSTILE_SOURCES[source]
    code, err = cli_verb(fake, capsys, monkeypatch, command, NAME, "-p", f"data_source={value}")
    assert code == 2
    assert err.startswith("config error: -p data_source") and why in err, err
    assert len(err.strip().splitlines()) == 1 and len(err) < 400
    assert [r.method for r in fake.requests] == ["GET"]  # nothing was retried or resubmitted


def test_a_parameter_within_the_rules_is_sent(fake, capsys, monkeypatch):
    fake.route("GET", WF_PATH, Reply(200, flagship_run(stored=False)))
    fake.route("PUT", f"{WF_PATH}/resubmit", Reply(200, workflow("llama-lora-9qz4m", "Pending")))
    code, err = cli_verb(fake, capsys, monkeypatch, "resubmit", NAME, "-p", "data_source=s3://datasets/dates")
    assert code == 0, err
    assert fake.requests[-1].json()["parameters"] == ["data_source=s3://datasets/dates"]
