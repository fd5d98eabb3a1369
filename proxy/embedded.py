"""The broker stubs behind ``rmq-proxy --embedded-brokers N``: the zero-set-up mode.

Only the entry points (``proxy.cli`` for one process, ``proxy.supervisor`` for workers)
call this; nothing else in ``proxy`` knows the stubs exist.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from proxy.config import ProxyConfig

if TYPE_CHECKING:
    from broker_stub import StubCluster


class StubMissing(RuntimeError):
    """The broker stub's distribution (rmq-broker-stub) is not installed."""


async def start_embedded_brokers(config: ProxyConfig) -> StubCluster | None:
    """Start a name server and ``config.embedded_brokers`` broker stubs on loopback (with
    ``config.topics`` on every broker); None when the configuration asks for none. The
    caller points its proxy at ``cluster.namesrv_address`` and stops the cluster."""
    if not config.embedded_brokers:
        return None
    try:
        from broker_stub import BrokerConfig, StubCluster
    except ImportError as exc:
        raise StubMissing(
            "--embedded-brokers runs the broker stub, a distribution of its own: "
            "pip install rmq-broker-stub (from the repository: pip install ./stub)"
        ) from exc

    cluster = StubCluster(
        config.embedded_brokers,
        host="127.0.0.1",
        template=BrokerConfig(topics=list(config.topics)),
    )
    await cluster.start()  # stops what it started if it fails
    return cluster


def fronting(config: ProxyConfig, cluster: StubCluster | None) -> ProxyConfig:
    """``config`` pointed at the embedded cluster's name server (a new config)."""
    if cluster is None:
        return config
    return replace(config, namesrv_addrs=[cluster.namesrv_address])
