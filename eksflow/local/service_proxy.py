"""A Service's address on the simulated nodes: what kube-proxy makes of a Service for the run's pods and this machine.

On a cluster a Service is a virtual address; kube-proxy spreads the connections made to it over the Service's
endpoints (the ready pods its selector picks), one pod per connection, and the endpoints controller takes a pod out
of that list when it stops being ready or is gone, its node with it. Here a Service of a run with simulated nodes is
a listener on the address the run's bridge holds on this machine (PodNetwork.gateway: only the run's pods and this
machine reach it), and each connection goes to the next endpoint in turn (round robin, as kube-proxy's IPVS mode
does). `set_endpoints` replaces the list; the connections to an endpoint taken out are closed, as a lost pod's
break. A connection that finds no endpoint is closed at once, as a Service without ready pods refuses it.

Bytes are forwarded as they come, in both directions, with no look at what they are: the engines' keys, TLS or
HTTP keep-alive pass through unchanged.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Sequence

Endpoint = tuple[str, int]  # (pod address, port)
_CONNECT_TIMEOUT_S = 1.0  # a pod on the bridge answers a SYN at once; a lost one never does
_CHUNK = 65536


class ServiceProxy:
    """One Service's listener on `address`, forwarding each connection to one of its endpoints."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self._endpoints: list[Endpoint] = []
        self._next = 0
        self._open: dict[Endpoint, set[socket.socket]] = {}  # the sockets of each endpoint's live connections
        self._lock = threading.Lock()
        self._closed = False
        self._listener = socket.create_server((address, 0))
        self.address, self.port = self._listener.getsockname()[:2]
        threading.Thread(target=self._accept, name=f"service-{name}", daemon=True).start()

    @property
    def url(self) -> str:
        """http://<address>:<port>, where the run's pods and this machine reach the Service."""
        return f"http://{self.address}:{self.port}"

    def endpoints(self) -> list[Endpoint]:
        """The endpoints connections go to now."""
        with self._lock:
            return list(self._endpoints)

    def set_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        """Send new connections to `endpoints`; close the live connections of every endpoint no longer among them."""
        with self._lock:
            self._endpoints = list(dict.fromkeys(endpoints))
            dropped = [socks for endpoint, socks in self._open.items() if endpoint not in self._endpoints]
        for socks in dropped:
            for sock in list(socks):
                _close(sock)

    def close(self) -> None:
        """Stop listening and close every connection."""
        with self._lock:
            self._closed = True
            self._endpoints = []
            live = [sock for socks in self._open.values() for sock in socks]
        _close(self._listener)
        for sock in live:
            _close(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _pick(self) -> list[Endpoint]:
        """Every endpoint, starting with the one whose turn it is."""
        with self._lock:
            if self._closed or not self._endpoints:
                return []
            start = self._next % len(self._endpoints)
            self._next += 1
            return self._endpoints[start:] + self._endpoints[:start]

    def _forward(self, client: socket.socket) -> None:
        for endpoint in self._pick():
            try:
                upstream = socket.create_connection(endpoint, timeout=_CONNECT_TIMEOUT_S)
            except OSError:
                continue  # gone since the list was made: the next one
            upstream.settimeout(None)
            with self._lock:
                if endpoint not in self._endpoints:  # taken out while connecting
                    _close(upstream)
                    continue
                self._open.setdefault(endpoint, set()).update((client, upstream))
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()
            with self._lock:
                self._open.get(endpoint, set()).difference_update((client, upstream))
            _close(upstream)
            break
        _close(client)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy `source` to `sink` until either ends; then end both directions."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
