"""Free loopback ports, for the programs tests start that cannot be given port 0."""

from __future__ import annotations

from rocketmq_local.launcher import free_port_block


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (so also a port that refuses
    connections), chosen where the kernel hands out none by itself
    (``rocketmq_local.launcher.free_port_block``)."""
    return free_port_block()
