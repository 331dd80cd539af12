"""The Trainer's status endpoint for one TrainJob attempt here: what its pods' rank 0 reports, kept with the task.

On a cluster, with the Trainer's `TrainJobStatus` gate on, its controller manager serves
`POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status` over HTTPS (pkg/statusserver,
v2.3.0; eksflow.runtime.trainer_status has what it does), and the Trainer injects KUBEFLOW_TRAINER_SERVER_URL,
KUBEFLOW_TRAINER_SERVER_CA_CERT and KUBEFLOW_TRAINER_SERVER_TOKEN into the trainer container. Here the local
executor serves it for each attempt, and gives every TrainJob pod the three variables always (no gate):

- keyed: a CA and a server certificate made for the attempt with the `openssl` CLI (the keys 0600 in the task's
  folder), the server's for the one address it listens on; a random bearer token per attempt in a file per pod
  (0600), where the Trainer projects a service-account token. The Trainer verifies a JWT (OIDC: signature,
  expiry, the audience of this TrainJob); here the token is compared as a whole, in constant time;
- fenced: it listens only where the pods reach it: 127.0.0.1 when the pods are processes here, the bridge's
  address of the run's pod network on simulated nodes (pod_network.py: pods reach pods and that address only);
- checked as the Trainer's server checks: POST on that one path (any other path 404, GET or PUT 405), the
  token (none: 401, another: 403), a body of at most 64 KiB (413), JSON with a `trainerStatus` the CRD accepts
  (progressPercentage 0-100, estimatedRemainingSeconds >= 0, at most 256 metrics of a name and value of 1-64
  characters, lastUpdatedTime RFC 3339) else 422 with one line; answered as its server does (the body echoed, or a
  metav1.Status), and nothing logged (the token never is);
- the latest trainerStatus goes to the task's folder (STATUS_FILE), which the executor shows in status.json and
  `get` as the TrainJob's `status.trainerStatus`.

`close` stops the server: its port is closed and no thread of it is left.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import threading
from collections.abc import Mapping
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from eksflow.errors import EXIT_FAILED, EksflowError
from eksflow.local.rundir import writing
from eksflow.runtime.readable import format_duration
from eksflow.runtime.trainer_status import ENV_CA_CERT, ENV_TOKEN, ENV_URL, FIELD_MAX, INT32_MAX, METRICS_MAX

STATUS_FILE = "trainer-status.json"  # in the task's folder: the latest trainerStatus, as the TrainJob would hold it
FOLDER = "trainer-status"  # in the task's folder: the attempt's CA, server key and certificate, each pod's token
BODY_MAX = 64 * 1024  # bytes of a request body (the Trainer's server: 64 KiB)
DRAIN_MAX = 1024 * 1024  # bytes of a body over BODY_MAX read before the 413 (past it the connection is just closed)
CONNECTION_TIMEOUT_S = 10.0  # a connection that sends nothing (no TLS handshake, no request) this long is closed
CERT_DAYS = "2"  # the certificates' validity: an attempt's life, with room
_STATUS_FIELDS = frozenset({"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"})
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


class TrainerStatusServerError(EksflowError):
    """The status endpoint could not start (no openssl, a certificate it could not make)."""

    label = "trainer status server error"
    exit_code = EXIT_FAILED


def status_path(namespace: str, name: str) -> str:
    """The Trainer's URL path of TrainJob `name`'s status."""
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def status_problem(body: Any) -> str:
    """Why a request body is not an UpdateTrainJobStatusRequest the CRD accepts; "" when it is."""
    if not isinstance(body, dict) or set(body) != {"trainerStatus"} or not isinstance(body["trainerStatus"], dict):
        return "the body must be a JSON object holding trainerStatus, and only it"
    status = body["trainerStatus"]
    if unknown := sorted(set(status) - _STATUS_FIELDS):
        return f"trainerStatus has unknown fields: {', '.join(unknown)}"
    for key, high in (("progressPercentage", 100), ("estimatedRemainingSeconds", INT32_MAX)):
        value = status.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
            return f"trainerStatus.{key} must be an integer from 0 to {high}"
    metrics = status.get("metrics", [])
    if not isinstance(metrics, list) or len(metrics) > METRICS_MAX:
        return f"trainerStatus.metrics must be a list of at most {METRICS_MAX} items"
    for i, metric in enumerate(metrics):
        if not isinstance(metric, dict) or set(metric) != {"name", "value"}:
            return f"trainerStatus.metrics[{i}] must hold a name and a value, and only them"
        if not all(isinstance(metric[k], str) and 1 <= len(metric[k]) <= FIELD_MAX for k in ("name", "value")):
            return f"trainerStatus.metrics[{i}]'s name and value must be strings of 1 to {FIELD_MAX} characters"
    stamp = status.get("lastUpdatedTime")
    if not isinstance(stamp, str) or not _RFC3339.fullmatch(stamp):
        return "trainerStatus.lastUpdatedTime must be an RFC 3339 time (it is required)"
    try:
        datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "trainerStatus.lastUpdatedTime must be an RFC 3339 time (it is required)"
    return ""


class TrainerStatusServer:
    """The status endpoint of TrainJob `namespace/name` for one attempt, on `address`, its files in `task_dir`."""

    def __init__(self, task_dir: Path, namespace: str, name: str, address: str) -> None:
        self.task_dir = task_dir
        self.folder = task_dir / FOLDER
        self.path = status_path(namespace, name)
        self._token = secrets.token_urlsafe(32)
        with writing(self.folder):
            shutil.rmtree(self.folder, ignore_errors=True)  # an earlier attempt's keys and tokens
            self.folder.mkdir(mode=0o700, parents=True)
            (self.task_dir / STATUS_FILE).unlink(missing_ok=True)  # a retry is a new TrainJob: no status yet
            context = _server_context(self.folder, address)
        self._httpd = _QuietServer((address, 0), _handler(self))
        self._httpd.daemon_threads = False  # server_close joins every request's thread: none is left
        self._httpd.socket = context.wrap_socket(
            self._httpd.socket, server_side=True, do_handshake_on_connect=False
        )  # each connection's handshake on its own thread (its first read), never in the accepting loop
        self.url = f"https://{address}:{self._httpd.server_address[1]}{self.path}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name=f"trainer-status-{name}"
        )
        self._thread.start()

    def __enter__(self) -> TrainerStatusServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def pod_env(self, pod: str) -> dict[str, str]:
        """The variables the Trainer injects into pod `pod`'s trainer container; its token file written (0600)."""
        token_file = self.folder / pod / "token"
        with writing(self.folder):
            token_file.parent.mkdir(mode=0o700, exist_ok=True)
            _write_private(token_file, self._token + "\n")
        return {ENV_URL: self.url, ENV_CA_CERT: str(self.folder / "ca.crt"), ENV_TOKEN: str(token_file)}

    def authorized(self, header: str | None) -> int:
        """200 when `header` carries the attempt's bearer token, 401 when it carries none, else 403."""
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401
        return 200 if hmac.compare_digest(token.strip().encode(), self._token.encode()) else 403

    def record(self, status: Mapping[str, Any]) -> None:
        """Keep `status` as the TrainJob's trainerStatus: the task folder's STATUS_FILE, replaced whole; OSError."""
        draft = self.task_dir / f".{STATUS_FILE}.{threading.get_ident()}"
        draft.write_text(json.dumps(status), encoding="utf-8")
        draft.replace(self.task_dir / STATUS_FILE)

    def close(self) -> None:
        """Stop serving: the port closed, the accepting thread and every request's ended, the token files removed."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
        shutil.rmtree(self.folder, ignore_errors=True)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A connection that failed its handshake, timed out or went away: the client's business, not logged."""


def read_status(task_dir: Path) -> dict[str, Any] | None:
    """The latest trainerStatus a task's TrainJob reported here; None if none (or none readable)."""
    try:
        loaded = json.loads((task_dir / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def trainer_status_line(status: Mapping[str, Any]) -> str:
    """A trainerStatus in one line: percent done, time left, metrics, when reported."""
    parts = [f"{status.get('progressPercentage', '?')}% done"]
    if isinstance(left := status.get("estimatedRemainingSeconds"), int):
        parts.append(f"{format_duration(left)} left")
    metrics = ", ".join(f"{m.get('name')}={m.get('value')}" for m in status.get("metrics") or [] if isinstance(m, dict))
    return ", ".join(parts) + (f"; {metrics}" if metrics else "") + f" (at {status.get('lastUpdatedTime')})"


def _handler(server: TrainerStatusServer) -> type[BaseHTTPRequestHandler]:
    class StatusHandler(BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT_S  # on the connection's socket: the handshake and each read
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # http.server dispatches on these names
            if self.path != server.path:
                return self._answer(404, f"the page {self.path!r} is not found")
            if (auth := server.authorized(self.headers.get("Authorization"))) != 200:
                return self._answer(auth, "no bearer token" if auth == 401 else "the token is not this TrainJob's")
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return self._answer(411, "the request needs a Content-Length")
            if int(length) > BODY_MAX:
                self.rfile.read(min(int(length), DRAIN_MAX))  # read, not kept: the client then reads the answer
                return self._answer(413, f"the body is over {BODY_MAX} bytes")
            try:
                body = json.loads(self.rfile.read(int(length)))
            except ValueError:
                return self._answer(422, "the body is not JSON")
            if problem := status_problem(body):
                return self._answer(422, problem)
            try:
                server.record(body["trainerStatus"])
            except OSError as exc:  # the state folder: the pod's reporter says so in one line and goes on
                return self._answer(500, f"the status could not be kept: {exc.strerror}")
            self._send(200, body)

        def do_GET(self) -> None:
            self._not_post()

        def do_PUT(self) -> None:
            self._not_post()

        def _not_post(self) -> None:
            if self.path != server.path:
                self._answer(404, f"the page {self.path!r} is not found")
            else:
                self._answer(405, "only POST", {"Allow": "POST"})

        def _answer(self, code: int, message: str, headers: Mapping[str, str] | None = None) -> None:
            """A metav1.Status, as the Trainer's server answers a refused request."""
            self.close_connection = True
            reason = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed"}
            status = {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                "reason": reason.get(code, "Invalid" if code == 422 else "BadRequest"), "code": code,
            }  # fmt: skip
            self._send(code, status, headers)

        def _send(self, code: int, document: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> None:
            data = json.dumps(document).encode()
            self.send_response(code)
            for key, value in {**(headers or {}), "Content-Type": "application/json"}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Nothing is logged: a request line is all a log could add, and the pods' own logs say more."""

    return StatusHandler


def _server_context(folder: Path, address: str) -> ssl.SSLContext:
    """A CA and a server certificate for `address` signed by it (made with openssl; keys 0600): the server's context."""
    if shutil.which("openssl") is None:
        raise TrainerStatusServerError(
            "the TrainJob's status endpoint needs the openssl command (apt-get install openssl)"
        )
    ca_key, ca_cert = folder / "ca.key", folder / "ca.crt"
    key, request, cert, extensions = (folder / f"server.{ext}" for ext in ("key", "csr", "crt", "ext"))
    extensions.write_text(
        f"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        f"subjectAltName=IP:{address}\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n",
        encoding="utf-8",
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", ca_key, "-out", ca_cert, "-days", CERT_DAYS,
        "-subj", "/CN=eksflow local Kubeflow Trainer CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
    )  # fmt: skip
    _openssl("req", "-new", *ec, "-keyout", key, "-out", request, "-subj", "/CN=kubeflow-trainer-controller-manager")
    _openssl(
        "x509", "-req", "-in", request, "-CA", ca_cert, "-CAkey", ca_key, "-set_serial", str(secrets.randbits(63)),
        "-days", CERT_DAYS, "-extfile", extensions, "-out", cert,
    )  # fmt: skip
    for private in (ca_key, key):
        private.chmod(0o600)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def _openssl(*args: str | Path) -> None:
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise TrainerStatusServerError(f"openssl {args[0]} for the TrainJob's status endpoint: {lines[-1]}")


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only from the start."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as file:
        file.write(text)
