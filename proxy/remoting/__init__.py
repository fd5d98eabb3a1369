"""The RocketMQ remoting protocol: codec, message encoding, asyncio client and server.

``broker_stub`` serves with these same pieces, so the proxy and the stub share one codec.
"""

from proxy.remoting.client import (
    RemotingClient,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from proxy.remoting.codes import LanguageCode, RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand, RemotingProtocolError
from proxy.remoting.server import RemotingServer

__all__ = [
    "LanguageCode",
    "RemotingClient",
    "RemotingCommand",
    "RemotingConnectError",
    "RemotingError",
    "RemotingProtocolError",
    "RemotingServer",
    "RemotingTimeoutError",
    "RequestCode",
    "ResponseCode",
]
