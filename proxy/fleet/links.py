"""The links between the proxies of a fleet, as the shared probe hub sees them
(``proxy/receive/shared.py``): who is live, and a way to send each of them a message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from proxy.fleet.messages import PeerMessage


class PeerLinks(Protocol):
    """What the hub needs of the transport between proxies. The transport delivers what
    arrives to ``SharedProbeHub.receive`` and tells it ``peer_lost`` and
    ``members_changed``."""

    @property
    def self_id(self) -> str: ...

    def members(self) -> Sequence[str]:
        """The live proxies, this one included."""
        ...

    def send(self, peer: str, message: PeerMessage) -> bool:
        """Queue ``message`` for ``peer``; False when the link to it is down."""
        ...
