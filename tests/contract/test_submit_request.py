"""`submit` against a recording HTTP server on 127.0.0.1: the request is what the Argo Server API expects."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eksflow import submit as submit_module
from eksflow.cli import main
from pipelines.llama_lora import build


class Recorder:
    def __init__(self):
        self.requests = []
        self.replies = []  # (status, body) per request, the last one repeated


@pytest.fixture
def server():
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            recorder.requests.append((self.command, self.path, dict(self.headers), body))
            status, payload = recorder.replies[min(len(recorder.requests), len(recorder.replies)) - 1]
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_GET = _reply  # noqa: N815  # http.server dispatches on these names

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield recorder, f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


CREATED = {"metadata": {"name": "llama-lora-x7k2p", "namespace": "argo"}, "spec": {}}


def run_cli(address, *extra):
    with pytest.raises(SystemExit) as exit_info:
        main(build, ["submit", "--argo-server", address, "--no-secure", *extra])
    return exit_info.value.code


def test_body_and_token_are_what_the_argo_cli_sends(server, monkeypatch, swagger_validator):
    recorder, address = server
    recorder.replies = [(200, CREATED)]
    monkeypatch.setenv("ARGO_TOKEN", "s3cr3t")
    assert run_cli(address) == 0
    ((method, path, headers, body),) = recorder.requests
    assert (method, path) == ("POST", "/api/v1/workflows/argo")
    assert headers["Authorization"] == "Bearer s3cr3t"
    request = json.loads(body)
    validator = swagger_validator("io.argoproj.workflow.v1alpha1.WorkflowCreateRequest")
    assert [e.message for e in validator.iter_errors(request)] == []
    assert request["workflow"]["metadata"]["generateName"] == "llama-lora-"
    assert request["namespace"] == "argo"


def test_a_token_with_its_scheme_is_sent_verbatim(server, monkeypatch):
    recorder, address = server
    recorder.replies = [(200, CREATED)]
    monkeypatch.setenv("ARGO_TOKEN", "Bearer abc.def")
    assert run_cli(address, "-n", "ml") == 0
    ((_, path, headers, _),) = recorder.requests
    assert path == "/api/v1/workflows/ml" and headers["Authorization"] == "Bearer abc.def"


@pytest.mark.parametrize(
    ("status", "payload", "expected"),
    [
        (401, {"code": 16, "message": "token not valid"}, "HTTP 401"),
        (409, {"code": 6, "message": "already exists"}, "already exists"),
        (500, b"upstream connect error", "the Argo Server failed"),
        (503, {"error": "overloaded"}, "HTTP 503"),
    ],
)
def test_server_errors_become_one_line(server, monkeypatch, capsys, status, payload, expected):
    recorder, address = server
    recorder.replies = [(status, payload)]
    monkeypatch.delenv("ARGO_TOKEN", raising=False)
    assert run_cli(address) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("argo server error:") and expected in err
    assert "Traceback" not in err


def test_unreachable_server_is_one_line(monkeypatch, capsys):
    monkeypatch.delenv("ARGO_TOKEN", raising=False)
    assert run_cli("127.0.0.1:9") == 1
    assert "cannot reach the Argo Server" in capsys.readouterr().err


def test_missing_server_is_explained(monkeypatch, capsys):
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(build, ["submit"])
    assert exit_info.value.code == 2  # a setting that cannot work is bad input, like a bad config
    assert "ARGO_SERVER" in capsys.readouterr().err


def test_watch_follows_node_phases(server, monkeypatch, capsys):
    recorder, address = server
    node = {"id": "n1", "name": "llama-lora-x7k2p.train", "displayName": "train", "type": "Pod"}
    recorder.replies = [
        (200, CREATED),
        (200, {**CREATED, "status": {"phase": "Running", "nodes": {"n1": {**node, "phase": "Running"}}}}),
        (200, {**CREATED, "status": {"phase": "Failed", "nodes": {"n1": {**node, "phase": "Failed"}}}}),
    ]
    monkeypatch.setattr(submit_module, "POLL_S", 0.0)
    monkeypatch.delenv("ARGO_TOKEN", raising=False)
    assert run_cli(address, "--watch") == 1
    out = capsys.readouterr().err  # progress goes to stderr, like the plan's errors; stdout keeps the plan table
    assert "submitted argo/llama-lora-x7k2p: http://127.0.0.1:" in out
    assert "train: Running" in out and "train: Failed" in out and "workflow llama-lora-x7k2p Failed" in out
    assert [r[1] for r in recorder.requests[1:]] == ["/api/v1/workflows/argo/llama-lora-x7k2p"] * 2
