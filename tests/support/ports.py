"""Free loopback ports, for the programs tests start that cannot be given port 0."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: bound once by the OS's choice, then
    closed (so also a port that refuses connections)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
