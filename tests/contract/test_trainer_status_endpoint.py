"""The TrainJob status reporter against the TrainJob CRD and a real HTTPS server that checks its bearer token.

The server stands in for the Trainer's status endpoint (pkg/statusserver, v2.3.0): POST, `Authorization: Bearer`,
TLS from a CA the client is given as a file. The controller itself (OIDC verification of the token, the apply to
the TrainJob's status, the feature gate) does not run here.
"""

import datetime
import ipaddress
import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eksflow.runtime.trainer_status import Endpoint, TrainerStatusReporter, status_body

PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/llama-lora-x7k2p/status"
OBSERVED = datetime.datetime(2026, 12, 7, 9, 0, 0, tzinfo=datetime.timezone.utc)
HANG_GUARD_S = 60  # a wait only a hang reaches
TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOlsidHJhaW5lciJdfQ.c2lnbmF0dXJlLTE"  # a JWT's shape: header.claims.signature
ROTATED = "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOlsidHJhaW5lciJdfQ.c2lnbmF0dXJlLTI"


def trainjob(status_request):
    """A TrainJob as the controller applies a status request to it."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "llama-lora-x7k2p", "namespace": "ml"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
        "status": status_request,
    }


@pytest.mark.parametrize(
    "done, remaining_s, metrics",
    [
        (0, None, {}),
        (37, 1234.6, {"loss": 1.7364, "learning_rate": 5e-05, "tokens_per_s": 1523.0}),
        (100, 0.0, {"loss": float("nan")}),
        (250, 1e12, {f"metric_{i}_{'x' * 80}": i / 3 for i in range(300)}),  # past every bound of the CRD
    ],
    ids=["start", "midway", "done", "past-the-bounds"],
)
def test_the_request_body_is_a_valid_trainjob_status(crd_validator, done, remaining_s, metrics):
    body = status_body(done, 100, remaining_s, metrics, OBSERVED)
    manifest = trainjob(body)
    errors = [e.message for e in crd_validator(manifest).iter_errors(manifest)]
    assert errors == []
    status = body["trainerStatus"]
    # the CRD's CEL rule (jsonschema does not run it): lastUpdatedTime whenever trainerStatus is set, RFC 3339
    assert datetime.datetime.strptime(status["lastUpdatedTime"], "%Y-%m-%dT%H:%M:%SZ")
    assert 0 <= status["progressPercentage"] <= 100


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for 127.0.0.1: (ca file the client trusts, server context)."""
    return _self_signed(tmp_path, "trainer")


def _self_signed(folder, name):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kubeflow-trainer-{name}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / f"{name}.crt", folder / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return cert_file, context


class StatusServer:
    """An HTTPS endpoint that records each request and answers as `answer(request)` says."""

    def __init__(self, context, token_file):
        self.requests = []  # (path, Authorization header, body as JSON or None)
        self.token_file = token_file
        self.answer = self.check_token
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server dispatches on this name
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = (self.path, self.headers.get("Authorization"), json.loads(data) if data else None)
                server.requests.append(request)
                status, headers = server.answer(request)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": "0"}.items():
                    self.send_header(name, value)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}{PATH}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def check_token(self, request):
        """As the Trainer's server: 403 unless the bearer token is the one the pod holds now."""
        _, authorization, _ = request
        return (200 if authorization == f"Bearer {self.token_file.read_text().strip()}" else 403), {}

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def server(tmp_path, certificate):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # as the kubelet writes a projected token
    running = StatusServer(certificate[1], token_file)
    yield running
    running.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def reporter_for(server, ca_file, clock, **options):
    endpoint = Endpoint(server.url, str(ca_file), str(server.token_file))
    return TrainerStatusReporter(endpoint, 10, clock=clock, now=lambda: OBSERVED, **options)


def test_reports_reach_the_endpoint_with_the_token_of_the_moment(server, certificate, capsys):
    clock = Clock()
    with reporter_for(server, certificate[0], clock, dispatch=lambda work: work()) as status:
        status.update(0, {})
        server.token_file.write_text(ROTATED)  # the kubelet rotated it
        clock.now = 30.0
        status.update(3, {"loss": 1.5})
    paths = {path for path, _, _ in server.requests}
    tokens = [authorization.removeprefix("Bearer ") for _, authorization, _ in server.requests]
    steps = [body["trainerStatus"]["metrics"][0]["value"] for _, _, body in server.requests]
    assert (paths, tokens, steps) == ({PATH}, [TOKEN, ROTATED], ["0", "3"])
    assert server.requests[-1][2]["trainerStatus"]["estimatedRemainingSeconds"] == 70
    assert capsys.readouterr().err == ""  # every request was answered 200: the token was the one of the moment


def test_a_slow_endpoint_holds_no_training_step(server, certificate):
    clock, released, answered = Clock(), threading.Event(), []

    def slow(request):
        answered.append(released.wait(HANG_GUARD_S))  # False: training waited on the request (a hang)
        return server.check_token(request)

    server.answer = slow
    status = reporter_for(server, certificate[0], clock)  # requests on their own thread, as in training
    status.update(0, {})
    clock.now = 10.0
    status.update(1, {})  # returns while the first request is unanswered
    released.set()
    status.close()
    assert answered == [True, True]
    assert [body["trainerStatus"]["progressPercentage"] for _, _, body in server.requests] == [0, 10]


def test_an_endpoint_answering_500_costs_one_line_and_never_the_token(server, certificate, capsys):
    server.answer = lambda request: (500, {})
    clock = Clock()
    with reporter_for(server, certificate[0], clock, dispatch=lambda work: work()) as status:
        for step in range(1, 11):
            clock.now = step * 5.0
            status.update(step, {"loss": 1.0})
    lines = capsys.readouterr().err.splitlines()
    assert len(server.requests) == 10
    assert len(lines) == 1 and "HTTP 500" in lines[0] and "training goes on" in lines[0]
    assert TOKEN not in lines[0]


def test_an_endpoint_that_is_down_costs_one_line(tmp_path, certificate, capsys):
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token_file = tmp_path / "token"
    token_file.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    endpoint = Endpoint(f"https://127.0.0.1:{port}{PATH}", str(certificate[0]), str(token_file))
    with TrainerStatusReporter(endpoint, 10, clock=Clock(), dispatch=lambda work: work()) as status:
        for step in range(1, 11):
            status.update(step, {})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "Connection refused" in lines[0]


def test_a_server_the_trainers_ca_did_not_sign_gets_no_request(tmp_path, server, capsys):
    other_ca, _ = _self_signed(tmp_path, "other")
    with reporter_for(server, other_ca, Clock(), dispatch=lambda work: work()) as status:
        status.update(10, {})
    lines = capsys.readouterr().err.splitlines()
    assert server.requests == []
    assert len(lines) == 1 and "certificate verify failed" in lines[0]


def test_a_redirect_is_not_followed_with_the_token(server, certificate, capsys):
    server.answer = lambda request: (307, {"Location": "/elsewhere"}) if request[0] == PATH else (200, {})
    with reporter_for(server, certificate[0], Clock(), dispatch=lambda work: work()) as status:
        status.update(10, {})
    assert [path for path, _, _ in server.requests] == [PATH]
    assert "HTTP 307" in capsys.readouterr().err
