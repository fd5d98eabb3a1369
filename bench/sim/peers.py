"""The links between simulated proxies, for the shared probe hub (``proxy/receive/shared.py``):
every message arrives ``hop_s`` later at its peer's hub, and is counted while ``counting``.
What the gRPC streams between real proxies carry, without the wire.

Faults, for the tests: a proxy in ``down`` has no link (a send to it fails, as on a
closed stream); one in ``silent`` gets nothing and says nothing, but sends still succeed
(a partition TCP has not noticed yet)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from proxy.fleet.messages import PeerMessage
from proxy.receive.shared import SharedProbeHub


class SimFabric:
    def __init__(self, ids: Sequence[str], hop_s: float) -> None:
        self.ids = list(ids)
        self.hop_s = hop_s
        self.hubs: dict[str, SharedProbeHub] = {}
        self.counting = False
        self.messages: Counter[str] = Counter()  # by kind
        self.bytes = 0
        self.down: set[str] = set()
        self.silent: set[str] = set()

    def links(self, self_id: str) -> SimLinks:
        return SimLinks(self, self_id)

    def _deliver(self, peer: str, sender: str, message: PeerMessage) -> None:
        if peer in self.silent or sender in self.silent or peer in self.down:
            return
        self.hubs[peer].receive(sender, message)


class SimLinks:
    def __init__(self, fabric: SimFabric, self_id: str) -> None:
        self.fabric = fabric
        self._self_id = self_id

    @property
    def self_id(self) -> str:
        return self._self_id

    def members(self) -> Sequence[str]:
        return self.fabric.ids

    def send(self, peer: str, message: PeerMessage) -> bool:
        fabric = self.fabric
        if peer in fabric.down or self._self_id in fabric.down:
            return False
        if fabric.counting:
            fabric.messages[message.kind.value] += 1
            fabric.bytes += message.size()
        asyncio.get_running_loop().call_later(
            fabric.hop_s, fabric._deliver, peer, self._self_id, message
        )
        return True
