"""A RocketMQ-compatible POP broker and name server over the remoting protocol.

In memory, for development, tests and benchmarks. ``StubCluster`` runs a name server and
N brokers inside one event loop; ``rmq-broker-stub`` and ``rmq-namesrv-stub`` run them as
processes.
"""

from broker_stub.broker import Broker
from broker_stub.cluster import StubCluster
from broker_stub.config import BrokerConfig, NamesrvConfig
from broker_stub.namesrv import NameServer

__all__ = ["Broker", "BrokerConfig", "NameServer", "NamesrvConfig", "StubCluster"]
