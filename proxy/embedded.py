"""The broker stubs behind ``rmq-proxy --embedded-brokers N``: the zero-set-up mode.

The stubs are a distribution of their own (rmq-broker-stub), which builds on the proxy's
remoting codec; the proxy does not import it. The stub's distribution names a starter in
the ``rmq_proxy.embedded_brokers`` entry-point group, found here when installed. Only the
entry points (``proxy.cli`` for one process, ``proxy.supervisor`` for workers) call this.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib.metadata import entry_points
from typing import Protocol

from proxy.config import ProxyConfig

ENTRY_POINTS = "rmq_proxy.embedded_brokers"


class EmbeddedBrokers(Protocol):
    """A name server and brokers running in this process."""

    @property
    def namesrv_address(self) -> str: ...

    async def stop(self) -> None: ...


# A starter: (broker count, topics on every broker) -> the started brokers; one that fails
# stops what it started.
Starter = Callable[[int, list[str]], Awaitable[EmbeddedBrokers]]


class StubMissing(RuntimeError):
    """The broker stub's distribution (rmq-broker-stub) is not installed."""


async def start_embedded_brokers(config: ProxyConfig) -> EmbeddedBrokers | None:
    """Start a name server and ``config.embedded_brokers`` broker stubs on loopback (with
    ``config.topics`` on every broker); None when the configuration asks for none. The
    caller points its proxy at ``cluster.namesrv_address`` and stops the cluster."""
    if not config.embedded_brokers:
        return None
    missing = StubMissing(
        "--embedded-brokers runs the broker stub, a distribution of its own: "
        "pip install rmq-broker-stub (from the repository: pip install ./broker_stub)"
    )
    found = entry_points(group=ENTRY_POINTS, name="stub")
    if not found:
        raise missing
    try:
        start: Starter = next(iter(found)).load()
    except ImportError as exc:  # listed, but its package is gone
        raise missing from exc
    return await start(config.embedded_brokers, list(config.topics))


def fronting(config: ProxyConfig, cluster: EmbeddedBrokers | None) -> ProxyConfig:
    """``config`` pointed at the embedded cluster's name server (a new config)."""
    if cluster is None:
        return config
    return replace(config, namesrv_addrs=[cluster.namesrv_address])
