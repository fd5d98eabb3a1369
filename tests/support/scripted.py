"""Scripted brokers for the receive path's unit tests: fakes of the broker clients that
the pool hands out, answering POP and NOTIFICATION from what they hold.

Each answers POP with the messages it holds (after ``pop_delay_s``) and NOTIFICATION with
hasMsg once it holds some, else at the end of the probe's poll time, as a broker parks a
probe. ``always_has_msg`` makes it say hasMsg whatever it holds, as a real broker does for
messages the subscription's tag filter will drop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

from proxy.brokers import BrokerPool, BrokerRoute, TopicRoute
from proxy.receive.types import ReceiveRequest
from proxy.remoting.answers import NotificationResult, PopResult
from proxy.remoting.client import RemotingError
from proxy.remoting.message import MessageExt, Prop
from proxy.remoting.popinfo import PopCheckpointInfo

PERM_READ_WRITE = 6


def message(broker: str, offset: int) -> MessageExt:
    ck = PopCheckpointInfo(0, 1, 30_000, 0, 0, broker, 0, offset).encode()
    return MessageExt(
        topic="T", body=b"x", properties={Prop.POP_CK: ck, Prop.UNIQ_KEY: f"{broker}-{offset}"}
    )


@dataclass
class ScriptedBroker:
    """A broker client's POP and NOTIFICATION, scripted; ``pops`` and ``probes`` count the
    requests it answered. ``down``: every request fails as on a closed connection."""

    name: str
    holds: list[MessageExt] = field(default_factory=list)
    pop_delay_s: float = 0.0
    pops: int = 0
    probes: int = 0
    always_has_msg: bool = False
    down: bool = False
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, msg: MessageExt) -> None:
        self.holds.append(msg)
        self.arrived.set()

    async def pop(self, group, topic, *, max_nums, poll_ms=0, on_late=None, **_):
        self.pops += 1
        if self.down:
            raise RemotingError(f"{self.name} is down")
        await asyncio.sleep(self.pop_delay_s)  # the scripted time the broker takes to answer
        taken, self.holds = self.holds[:max_nums], self.holds[max_nums:]
        if not self.holds:
            self.arrived.clear()
        return PopResult(code=0, messages=taken)

    async def notification(self, group, topic, *, poll_ms=0, order=False, timeout=None, **_):
        self.probes += 1
        if not self.holds and not self.always_has_msg:
            try:
                await asyncio.wait_for(self.arrived.wait(), poll_ms / 1000)
            except TimeoutError:
                return NotificationResult(has_msg=False)
        return NotificationResult(has_msg=True)


class Pool:
    """What the receive path uses of a BrokerPool: routes and broker clients by name."""

    def __init__(self, *brokers: ScriptedBroker) -> None:
        self.brokers = {b.name: b for b in brokers}

    async def route(self, topic: str) -> TopicRoute:
        routes = tuple(BrokerRoute(n, f"{n}:10911", 4, 4, PERM_READ_WRITE) for n in self.brokers)
        return TopicRoute(topic, routes)

    def broker(self, name: str) -> ScriptedBroker | None:
        return self.brokers.get(name)

    def as_broker_pool(self) -> BrokerPool:
        """Typed as the pool it stands in for."""
        return cast(BrokerPool, self)


def request(
    polling_s: float = 2.0, broker: str | None = "a", *, named_only: bool = False
) -> ReceiveRequest:
    """A ReceiveMessage of (G, T) naming ``broker``, long-polling ``polling_s``."""
    now = asyncio.get_running_loop().time()
    return ReceiveRequest(
        group="G",
        topic="T",
        expression="*",
        batch_size=16,
        invisible_ms=30_000,
        polling_ms=int(polling_s * 1000),
        answer_by=now + polling_s,
        arrived_at=now,
        broker_hint=broker,
        named_broker_only=named_only,
    )
