"""A Service's address on the simulated nodes: connections spread over its endpoints, a dropped one's closed."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from eksflow.local.service_proxy import ServiceProxy


class Named(socketserver.ThreadingTCPServer):
    """An endpoint that answers each line with its name, then the line, until the client closes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: str) -> None:
        self.name = name

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    self.wfile.write(f"{name}:".encode() + line)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.server_address[1])


@pytest.fixture
def pods() -> Iterator[list[Named]]:
    servers = [Named("a"), Named("b")]
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def ask(proxy: ServiceProxy, line: str = "hi") -> str:
    with socket.create_connection((proxy.address, proxy.port), timeout=5) as conn:
        conn.sendall(f"{line}\n".encode())
        return conn.makefile().readline().strip()


def test_connections_go_to_each_endpoint_in_turn(pods):
    proxy = ServiceProxy("svc", "127.0.0.1")
    try:
        proxy.set_endpoints([p.endpoint for p in pods])
        assert [ask(proxy) for _ in range(4)] == ["a:hi", "b:hi", "a:hi", "b:hi"]
        assert proxy.url == f"http://127.0.0.1:{proxy.port}"
    finally:
        proxy.close()


def test_an_endpoint_taken_out_has_its_connections_closed_and_gets_no_new_one(pods):
    proxy = ServiceProxy("svc", "127.0.0.1")
    try:
        proxy.set_endpoints([pods[0].endpoint, pods[1].endpoint])
        conn = socket.create_connection((proxy.address, proxy.port), timeout=5)
        reader = conn.makefile()
        conn.sendall(b"one\n")
        assert reader.readline().strip() == "a:one"
        proxy.set_endpoints([pods[1].endpoint])  # pod a is gone, its node with it
        assert reader.readline() == ""  # the live connection to it was closed
        conn.close()
        assert {ask(proxy) for _ in range(3)} == {"b:hi"}
    finally:
        proxy.close()


def test_a_dead_endpoint_is_skipped_and_no_endpoint_refuses(pods):
    proxy = ServiceProxy("svc", "127.0.0.1")
    try:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            dead = unused.getsockname()
        proxy.set_endpoints([dead, pods[1].endpoint])
        assert {ask(proxy) for _ in range(2)} == {"b:hi"}
        proxy.set_endpoints([])
        assert ask(proxy) == ""  # closed at once, as a Service without ready pods
    finally:
        proxy.close()


def test_closing_stops_listening(pods):
    proxy = ServiceProxy("svc", "127.0.0.1")
    proxy.set_endpoints([pods[0].endpoint])
    assert ask(proxy) == "a:hi"
    proxy.close()
    with pytest.raises(OSError):
        socket.create_connection((proxy.address, proxy.port), timeout=2)
