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


async def start_embedded_brokers(config: ProxyConfig) -> StubCluster | None:
    """Start a name server and ``config.embedded_brokers`` broker stubs on loopback (with
    ``config.topics`` on every broker); None when the configuration asks for none. The
    caller points its proxy at ``cluster.namesrv_address`` and stops the cluster."""
    if not config.embedded_brokers:
        return None
    from broker_stub import BrokerConfig, StubCluster

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
