"""Whether a URL's host names a server: a DNS name or an IP address (the settings that take a server's URL check it)."""

from __future__ import annotations

import ipaddress
import re

_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def is_host(host: str) -> bool:
    """An IP address, or RFC 1123 labels of 253 characters at most (an all-digit last label: a malformed IPv4)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()
