"""A free TCP port on loopback, for a server this process starts a moment later (the caller accepts the race)."""

import socket


def free_port() -> int:
    """A TCP port nobody listens on now on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
