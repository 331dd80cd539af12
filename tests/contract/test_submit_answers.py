"""`submit` against a real local server answering every way a broken or foreign server can: one line, exit 1.

A 200 with a proxy's HTML, a 200 with `{}` or other JSON that is not a Workflow, 5xx, a refused connection, TLS
failures, and a server that accepts the connection and never answers (the read timeout ends the wait).
"""

import argparse
import datetime
import ipaddress
import socket
import ssl
import threading

import pytest
from rich.console import Console

from eksflow.cli import main
from eksflow.submit import SubmitError, submit
from pipelines.llama_lora import build
from tests.contract.fake_argo import Reply, start, workflow

MANIFEST = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"generateName": "llama-lora-"}}
CREATE = ("POST", "/api/v1/workflows/argo")
HANG_GUARD_S = 60  # a join limit that only a hang reaches: the read timeouts under test are 0.2 s


@pytest.fixture
def fake():
    server, stop = start()
    yield server
    stop()


@pytest.fixture(autouse=True)
def _quick_timeouts(monkeypatch):
    monkeypatch.delenv("ARGO_TOKEN", raising=False)
    monkeypatch.setenv("EKSFLOW_ARGO_CONNECT_TIMEOUT", "5")
    # Generous for servers that answer (a loaded machine may take a while to), quick where a test waits one out.
    monkeypatch.setenv("EKSFLOW_ARGO_READ_TIMEOUT", "30")


@pytest.fixture
def quick_read_timeout(monkeypatch):
    monkeypatch.setenv("EKSFLOW_ARGO_READ_TIMEOUT", "0.2")


def options(address, **overrides):
    values = {
        "argo_server": address,
        "namespace": None,
        "secure": False,
        "insecure_skip_verify": False,
        "argo_base_href": "",
        "watch": False,
    }
    return argparse.Namespace(**{**values, **overrides})


def submit_error(address, **overrides) -> str:
    """Run submit in a thread (a hang fails the test instead of stalling the suite) and return its error line."""
    outcome: dict = {}

    def target():
        try:
            outcome["code"] = submit(MANIFEST, options(address, **overrides), Console(stderr=True))
        except SubmitError as err:
            outcome["error"] = str(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "submit hung"
    assert "error" in outcome, f"submit succeeded: {outcome}"
    message = outcome["error"]
    assert "\n" not in message and "Traceback" not in message
    return message


ODD_ANSWERS = [
    (Reply(200, b"<!DOCTYPE html><html><title>Sign in</title></html>", "text/html"), "answered 200 with HTML"),
    (Reply(200, b"", "text/plain"), "answered 200 with text, not the API's JSON (empty body)"),
    (Reply(200, {}), "answered the submission with {}, not a Workflow"),
    (Reply(200, []), "answered the submission with [], not a Workflow"),
    (Reply(200, {"metadata": {}}), "not a Workflow"),
    (Reply(200, {"metadata": {"name": 7}}), "not a Workflow"),
    (Reply(200, "llama-lora-x"), "not a Workflow"),
    (Reply(500, b"upstream connect error or disconnect/reset", "text/plain"), "HTTP 500"),
    (Reply(502, b"<html><h1>502 Bad Gateway</h1></html>", "text/html"), "HTTP 502"),
    (Reply(503, {"code": 14, "message": "overloaded"}), "HTTP 503"),
    (Reply(401, {"code": 16, "message": "token not valid"}), "set ARGO_TOKEN"),
    (Reply(302, b"", "text/html"), "HTTP 302"),
]


@pytest.mark.parametrize(
    ("reply", "expected"),
    ODD_ANSWERS,
    ids=["html", "empty", "{}", "[]", "no-name", "name-not-text", "json-string", "500", "502", "503", "401", "302"],
)
def test_an_odd_answer_is_one_line(fake, reply, expected):
    fake.route(*CREATE, reply)
    message = submit_error(fake.address)
    assert expected in message
    assert fake.address in message


def test_5xx_says_what_to_do(fake):
    fake.route(*CREATE, Reply(502, b"<html><h1>502 Bad Gateway</h1></html>", "text/html"))
    assert submit_error(fake.address).endswith(": 502 Bad Gateway; the Argo Server failed; retry, then check its logs")


def test_a_server_that_never_answers_times_out(fake, quick_read_timeout):
    fake.route(*CREATE, Reply(hang=True))
    message = submit_error(fake.address)
    assert "accepted the connection but did not answer within 0.2 s" in message
    assert "EKSFLOW_ARGO_READ_TIMEOUT" in message


def test_an_answer_cut_off_midway_is_one_line(fake):
    fake.route(*CREATE, Reply(chunks=[b'{"metadata": {"na']))  # the answer ends inside the JSON
    assert "not the API's JSON" in submit_error(fake.address)


def test_watch_ends_in_one_line_when_the_server_turns_odd(fake):
    fake.route(*CREATE, Reply(200, workflow("llama-lora-x7k2p", "Running")))
    fake.route("GET", "/api/v1/workflows/argo/llama-lora-x7k2p", Reply(200, b"<html>login</html>", "text/html"))
    assert "answered 200 with HTML" in submit_error(fake.address, watch=True)


def test_a_refused_connection_is_one_line():
    with socket.socket() as s:  # a port nothing listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    message = submit_error(f"127.0.0.1:{port}")
    assert message.startswith(f"cannot reach the Argo Server at http://127.0.0.1:{port}/")
    assert "refused" in message.lower()


def test_https_to_a_plain_http_server_is_a_tls_error(fake):
    fake.route(*CREATE, Reply(200, workflow("x")))
    message = submit_error(fake.address, secure=True)
    assert message.startswith(f"TLS to https://{fake.address}/ failed")
    assert "ARGO_SECURE=false" in message


@pytest.fixture
def tls_fake(tmp_path):
    """An HTTPS server with a self-signed certificate for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "argo-server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server, stop = start(tls_context=context)
    yield server
    stop()


def test_a_self_signed_certificate_is_refused_in_one_line_and_accepted_with_skip_verify(tls_fake, capsys):
    tls_fake.route(*CREATE, Reply(200, workflow("llama-lora-tls01")))
    message = submit_error(tls_fake.address, secure=True)
    assert "certificate verify failed: self-signed certificate" in message and "--insecure-skip-verify" in message
    code = submit(MANIFEST, options(tls_fake.address, secure=True, insecure_skip_verify=True), Console(stderr=True))
    assert code == 0
    assert f"submitted argo/llama-lora-tls01: https://{tls_fake.address}/workflows/argo/llama-lora-tls01" in (
        capsys.readouterr().err
    )


def test_a_bad_timeout_setting_is_one_line(fake, monkeypatch):
    monkeypatch.setenv("EKSFLOW_ARGO_READ_TIMEOUT", "soon")
    assert "EKSFLOW_ARGO_READ_TIMEOUT='soon' is not a number of seconds" in submit_error(fake.address)
    assert fake.requests == []


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(200, b"<html>SSO</html>", "text/html"), "answered 200 with HTML"),
        (Reply(200, {}), "not a Workflow"),
        (Reply(hang=True), "did not answer within 0.2 s"),
    ],
    ids=["html", "{}", "hang"],
)
def test_the_cli_exits_1_with_one_line(fake, capsys, monkeypatch, reply, expected):
    if reply.hang:
        monkeypatch.setenv("EKSFLOW_ARGO_READ_TIMEOUT", "0.2")
    fake.route(*CREATE, reply)
    with pytest.raises(SystemExit) as exit_info:
        main(build, ["submit", "--argo-server", fake.address, "--no-secure"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("argo server error:") and expected in err


TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.c2lnbmF0dXJl"  # a service-account-token-shaped secret


def _echo_authorization(status: int, content_type: str):
    """A server that repeats the request's Authorization header in its answer, as some proxies' error pages do."""

    def reply(request):
        header = request.headers.get("Authorization", "")
        if content_type == "application/json":
            return Reply(status, {"code": 16, "message": f"token rejected: Authorization: {header}"})
        return Reply(
            status, f"<html><p>denied for {header}</p><pre>{request.headers}</pre></html>".encode(), content_type
        )

    return reply


@pytest.mark.parametrize("token", [TOKEN, f"Bearer {TOKEN}"], ids=["bare", "with-scheme"])
@pytest.mark.parametrize(
    ("status", "content_type"),
    [(401, "application/json"), (500, "text/html"), (200, "text/html"), (302, "text/plain")],
    ids=["401-json", "500-html", "200-html", "302-text"],
)
def test_a_server_echoing_the_authorization_header_never_prints_the_token(
    fake, capsys, monkeypatch, token, status, content_type
):
    monkeypatch.setenv("ARGO_TOKEN", token)
    fake.route(*CREATE, _echo_authorization(status, content_type))
    with pytest.raises(SystemExit) as exit_info:
        main(build, ["submit", "--argo-server", fake.address, "--no-secure"])
    out, err = capsys.readouterr()
    assert fake.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"  # it was sent, and echoed
    assert exit_info.value.code == 1
    assert len(err.strip().splitlines()) == 1 and err.startswith("argo server error:")
    for part in TOKEN.split("."):
        assert part not in out + err


def test_a_workflow_answer_echoing_the_token_in_node_messages_never_prints_it(fake, capsys, monkeypatch):
    monkeypatch.setenv("ARGO_TOKEN", TOKEN)
    nodes = {"n1": {"id": "n1", "displayName": "train", "type": "Pod", "phase": "Failed", "message": f"sent {TOKEN}"}}
    fake.route(*CREATE, Reply(200, workflow("llama-lora-x7k2p", "Running")))
    fake.route(
        "GET",
        "/api/v1/workflows/argo/llama-lora-x7k2p",
        Reply(200, workflow("llama-lora-x7k2p", "Failed", message=f"Bearer {TOKEN}", nodes=nodes)),
    )
    with pytest.raises(SystemExit) as exit_info:
        main(build, ["submit", "--argo-server", fake.address, "--no-secure", "--watch"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 1
    assert "train: Failed (sent ***)" in err
    assert TOKEN not in out + err


@pytest.mark.parametrize(
    "token",
    [f"{TOKEN}\nX-Injected: 1", f"Bearer {TOKEN}\r\nX-Injected: 1", f"{TOKEN}\x1b[2J", f"a\x7f{TOKEN}"],
    ids=["newline", "crlf", "escape", "del"],
)
def test_a_token_holding_a_control_character_is_refused_unprinted(fake, capsys, monkeypatch, token):
    monkeypatch.setenv("ARGO_TOKEN", token)
    with pytest.raises(SystemExit) as exit_info:
        main(build, ["submit", "--argo-server", fake.address, "--no-secure"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2
    assert err.startswith("config error: ARGO_TOKEN holds a control character") and len(err.splitlines()) == 1
    assert fake.requests == []
    for part in TOKEN.split("."):
        assert part not in out + err


def test_a_token_read_whole_from_a_file_is_sent_without_its_line_break(fake, monkeypatch):
    monkeypatch.setenv("ARGO_TOKEN", f"Bearer {TOKEN}\n")
    fake.route(*CREATE, Reply(200, workflow("llama-lora-x7k2p")))
    assert submit(MANIFEST, options(fake.address), Console(stderr=True)) == 0
    assert fake.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"


CREDENTIAL_SETTINGS = {
    "server-userinfo": ({"ARGO_SERVER": "admin:hunter22@{address}"}, "ARGO_SERVER (--argo-server)"),
    "server-url-userinfo": ({"ARGO_SERVER": "http://admin:hunter22@{address}"}, "ARGO_SERVER (--argo-server)"),
    "server-token-query": ({"ARGO_SERVER": "http://{address}/?token=hunter22"}, "ARGO_SERVER (--argo-server)"),
    "base-href-query": (
        {"ARGO_SERVER": "{address}", "ARGO_BASE_HREF": "/argo/?access_token=hunter22"},
        "ARGO_BASE_HREF (--argo-base-href)",
    ),
}


@pytest.mark.parametrize("command", [["submit"], ["list"], ["get", "llama-lora-x7k2p"]], ids=lambda c: c[0])
@pytest.mark.parametrize(("settings", "named"), CREDENTIAL_SETTINGS.values(), ids=CREDENTIAL_SETTINGS.keys())
def test_a_credential_in_the_server_settings_is_refused_in_one_line(
    fake, capsys, monkeypatch, command, settings, named
):
    monkeypatch.setenv("ARGO_SECURE", "false")
    monkeypatch.setenv("ARGO_TOKEN", TOKEN)
    for variable, value in settings.items():
        monkeypatch.setenv(variable, value.format(address=fake.address))
    with pytest.raises(SystemExit) as exit_info:
        main(build, command)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2
    assert err.startswith(f"config error: {named} holds a credential") and len(err.splitlines()) == 1
    assert "ARGO_TOKEN" in err
    assert "hunter22" not in out + err and TOKEN not in out + err
    assert fake.requests == []  # nothing sent, so no Basic auth in place of the token
