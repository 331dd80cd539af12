"""The Trainer's status endpoint as the local executor serves it to a TrainJob attempt (trainer_status_server.py).

The sender is eksflow.runtime.trainer_status, the client the train step runs under a TrainJob: its requests reach
this server, are checked as the Trainer's server checks them, and what they carry is what `get` shows.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import stat
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from eksflow.local.trainer_status_server import (
    BODY_MAX,
    TrainerStatusServer,
    read_status,
    status_path,
    trainer_status_line,
)
from eksflow.runtime.trainer_status import ENV_CA_CERT, ENV_TOKEN, ENV_URL, Endpoint, TrainerStatusReporter, status_body
from tests.unit.local.test_resources import phases, resource, run, workflow
from tests.unit.local.test_trainjob_handler import trainjob

OBSERVED = datetime(2026, 12, 7, 9, 0, 0, tzinfo=timezone.utc)
POD = "run-x-train-node-0-0"


@pytest.fixture
def server(tmp_path: Path):
    running = TrainerStatusServer(tmp_path, "local", "run-x-train", "127.0.0.1")
    yield running
    running.close()


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory):
    """One server for the tests of what it refuses (its certificates cost a few openssl runs): it never keeps one."""
    running = TrainerStatusServer(tmp_path_factory.mktemp("refusing"), "local", "run-x-train", "127.0.0.1")
    yield running
    running.close()


def endpoint(server: TrainerStatusServer, pod: str = POD) -> Endpoint:
    env = server.pod_env(pod)
    return Endpoint(env[ENV_URL], env[ENV_CA_CERT], env[ENV_TOKEN])


def request(
    server: TrainerStatusServer, body: bytes, *, method: str = "POST", path: str = "", token: str | None = None
) -> tuple[int, dict]:
    """One request over TLS verified against the attempt's CA; the status code and the JSON answer."""
    sent = endpoint(server)
    token = Path(sent.token_file).read_text().strip() if token is None else token
    port = int(server.url.split(":")[2].split("/")[0])
    context = ssl.create_default_context(cafile=sent.ca_file)
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        connection.request(method, path or server.path, body, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def good_body(done: int = 3) -> bytes:
    return json.dumps(status_body(done, 4, 12.0, {"loss": 1.25}, OBSERVED)).encode()


def test_the_train_steps_client_reports_and_the_task_keeps_its_latest_trainer_status(server, tmp_path, capfd):
    with TrainerStatusReporter(endpoint(server), 4, clock=lambda: 0.0, now=lambda: OBSERVED) as status:
        status.update(4, {"loss": 1.25})
    kept = read_status(tmp_path)
    assert kept is not None and kept["progressPercentage"] == 100
    assert {"name": "loss", "value": "1.25"} in kept["metrics"]
    assert trainer_status_line(kept) == "100% done, 0s left; step=4, total_steps=4, loss=1.25 (at 2026-12-07T09:00:00Z)"
    assert capfd.readouterr() == ("", "")  # answered 200 (the client prints a line otherwise), and nothing logged
    assert server.url.endswith(status_path("local", "run-x-train"))
    assert server.path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/local/trainjobs/run-x-train/status"


def test_keys_and_tokens_are_readable_by_their_owner_only(server, tmp_path):
    sent = endpoint(server)
    private = [tmp_path / "trainer-status" / name for name in ("ca.key", "server.key")] + [Path(sent.token_file)]
    assert [stat.S_IMODE(path.stat().st_mode) for path in private] == [0o600] * 3
    assert Path(sent.token_file).parent.name == POD  # a file per pod, as each pod has its projected token
    assert endpoint(server, "run-x-train-node-0-1").token_file != sent.token_file


@pytest.mark.parametrize(
    "token, code", [("", 401), ("not-this-attempts-token", 403)], ids=["no-token", "another-token"]
)
def test_a_request_without_the_attempts_token_is_refused_and_nothing_is_kept(refusing, token, code):
    answer = request(refusing, good_body(), token=token)
    assert answer[0] == code and answer[1]["code"] == code and answer[1]["kind"] == "Status"
    assert read_status(refusing.task_dir) is None


def test_another_path_is_not_found_and_another_method_not_allowed(refusing):
    other = status_path("local", "another-trainjob")
    assert request(refusing, good_body(), path=other)[0] == 404
    assert request(refusing, good_body(), path="/healthz")[0] == 404
    assert request(refusing, b"", method="GET")[0] == 405


def test_a_body_over_64_kib_is_refused(refusing):
    body = json.loads(good_body())
    body["trainerStatus"]["metrics"] = [{"name": "n", "value": "v" * 64}] * 1200  # ~ 90 KiB
    data = json.dumps(body).encode()
    assert len(data) > BODY_MAX
    assert request(refusing, data)[0] == 413
    assert read_status(refusing.task_dir) is None


def _with(**status: object) -> bytes:
    body = json.loads(good_body())
    body["trainerStatus"].update(status)
    return json.dumps({"trainerStatus": {k: v for k, v in body["trainerStatus"].items() if v is not None}}).encode()


@pytest.mark.parametrize(
    "body, says",
    [
        (b"{not json", "not JSON"),
        (b'{"status": {}}', "holding trainerStatus"),
        (_with(progressPercentage=101), "progressPercentage must be an integer from 0 to 100"),
        (_with(progressPercentage=True), "progressPercentage must be an integer"),
        (_with(estimatedRemainingSeconds=-1), "estimatedRemainingSeconds must be an integer from 0"),
        (_with(metrics=[{"name": "x" * 65, "value": "1"}]), "metrics[0]'s name and value must be strings of 1 to 64"),
        (_with(metrics=[{"name": "loss", "value": ""}]), "metrics[0]'s name and value"),
        (_with(metrics=[{"name": "m", "value": "1"}] * 257), "at most 256 items"),
        (_with(lastUpdatedTime=None), "lastUpdatedTime must be an RFC 3339 time"),
        (_with(lastUpdatedTime="yesterday"), "lastUpdatedTime must be an RFC 3339 time"),
        (_with(phase="Done"), "unknown fields: phase"),
    ],
    ids=[
        "not-json", "no-trainerStatus", "percent-101", "percent-bool", "negative-eta", "long-name", "empty-value",
        "257-metrics", "no-time", "bad-time", "unknown-field",
    ],
)  # fmt: skip
def test_a_status_the_crd_would_refuse_is_422_in_one_line(refusing, body, says):
    code, answer = request(refusing, body)
    assert code == 422 and says in answer["message"] and "\n" not in answer["message"]
    assert read_status(refusing.task_dir) is None


def test_closing_leaves_no_thread_no_port_and_no_token(tmp_path, capfd):
    before = set(threading.enumerate())
    server = TrainerStatusServer(tmp_path, "local", "run-x-train", "127.0.0.1")
    sent = endpoint(server)
    port = int(server.url.split(":")[2].split("/")[0])
    idle = socket.create_connection(("127.0.0.1", port))  # a client that never shakes hands
    assert request(server, good_body())[0] == 200
    idle.close()  # its handshake fails: nothing is printed
    server.close()
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert not Path(sent.token_file).exists()
    assert read_status(tmp_path) is not None  # the TrainJob's last status stays with the task
    assert capfd.readouterr() == ("", "")


def test_a_local_trainjobs_pods_report_to_it_and_the_run_keeps_the_status(tmp_path):
    """Without simulated nodes: every pod gets the three variables (its own token file), rank 0's report is kept."""
    out = tmp_path / "pods"
    program = f"""
import json, os, pathlib, sys
from datetime import datetime, timezone
from eksflow.runtime.trainer_status import reporter
out = pathlib.Path({str(out)!r})
out.mkdir(parents=True, exist_ok=True)
rank = os.environ["PET_NODE_RANK"]
names = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_SERVER_TOKEN")
(out / rank).write_text(json.dumps({{n: os.environ.get(n) for n in names}}))
if rank == "0":
    with reporter(8) as status:
        status.update(8, {{"loss": 0.5}})
"""
    manifest = workflow([("train", None)], [resource("train", trainjob(["python", "-c", program]))])
    result = run(manifest, tmp_path)
    assert phases(result) == {"train": "Succeeded"}, result.nodes["train"].message
    seen = [json.loads((out / rank).read_text()) for rank in ("0", "1")]
    assert all(v[ENV_URL].startswith("https://127.0.0.1:") for v in seen) and seen[0][ENV_URL] == seen[1][ENV_URL]
    assert seen[0][ENV_TOKEN] != seen[1][ENV_TOKEN]
    kept = result.nodes["train"].trainer_status
    assert (
        kept is not None and kept["progressPercentage"] == 100 and {"name": "loss", "value": "0.5"} in kept["metrics"]
    )
    document = json.loads((result.run_dir / "status.json").read_text())
    assert document["status"]["nodes"]["train"]["trainerStatus"] == kept
