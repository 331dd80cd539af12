"""A real HTTP server on 127.0.0.1 that answers like an Argo Server, or like a broken one, as a test scripts it.

Each request is recorded; `route` maps (method, path) to a Reply: a status and body, a body sent in chunks with
stalls between them (a log stream going quiet), or no answer at all (a server that accepts and hangs).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

STALL = object()  # in Reply.chunks: stop writing until the test ends (the client's read timeout fires)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: object = None  # a dict/list (sent as JSON) or bytes
    content_type: str = "application/json"
    chunks: list = field(default_factory=list)  # streamed bytes and STALL markers, the connection closed after
    hang: bool = False  # accept the request and never answer


@dataclass
class FakeArgo:
    address: str  # host:port, as ARGO_SERVER holds it
    requests: list[Request] = field(default_factory=list)
    routes: dict[tuple[str, str], Callable[[Request], Reply] | list[Reply]] = field(default_factory=dict)
    released: threading.Event = field(default_factory=threading.Event)

    def route(self, method: str, path: str, *replies: Reply | Callable[[Request], Reply]) -> None:
        """Answer `method path` with these replies in turn (the last repeated), or with a function of the request."""
        self.routes[(method, path)] = replies[0] if len(replies) == 1 and callable(replies[0]) else list(replies)

    def reply_for(self, request: Request) -> Reply:
        route = self.routes.get((request.method, request.path))
        if route is None:
            return Reply(404, {"code": 5, "message": f"no route {request.method} {request.path}"})
        if callable(route):
            return route(request)
        seen = sum(1 for r in self.requests if (r.method, r.path) == (request.method, request.path))
        return route[min(seen, len(route)) - 1]


def start(fake_factory: Callable[[str], FakeArgo] = FakeArgo, tls_context=None):
    """Start a server; returns (fake, stop). `tls_context` (an ssl.SSLContext) makes it HTTPS."""
    state: dict[str, FakeArgo] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streams and keep-alive, like the Argo Server

        def _serve(self):
            fake = state["fake"]
            length = int(self.headers.get("Content-Length") or 0)
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
            request = Request(self.command, split.path, query, dict(self.headers), self.rfile.read(length))
            fake.requests.append(request)
            reply = fake.reply_for(request)
            if reply.hang:
                fake.released.wait(timeout=60)
                return
            if reply.chunks:  # chunked, one HTTP chunk per item, as Go's net/http streams with a flush per event
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in reply.chunks:
                    if chunk is STALL:
                        fake.released.wait(timeout=60)
                        return
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                return
            data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = _serve  # noqa: N815  # http.server dispatches on these names

        def log_message(self, *args):
            pass

        def handle(self):
            with contextlib.suppress(OSError):  # the client gave up (a timeout under test): nothing to answer
                super().handle()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    if tls_context is not None:
        httpd.socket = tls_context.wrap_socket(httpd.socket, server_side=True)
    fake = fake_factory(f"127.0.0.1:{httpd.server_address[1]}")
    state["fake"] = fake
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()

    def stop():
        fake.released.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)

    return fake, stop


def workflow(name: str, phase: str = "Succeeded", **status) -> dict:
    """A Workflow object as the Argo Server returns it (valid against swagger's Workflow definition)."""
    return {
        "metadata": {
            "name": name,
            "namespace": "argo",
            "creationTimestamp": "2026-05-01T10:00:00Z",
            "labels": {"eksflow.dev/pipeline": "llama-lora"},
        },
        "spec": {"entrypoint": "main", "arguments": {"parameters": [{"name": "base_model", "value": "smollm2"}]}},
        "status": {"phase": phase, "startedAt": "2026-05-01T10:00:00Z", **status},
    }
