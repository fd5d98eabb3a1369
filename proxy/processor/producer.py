"""Sending: which broker and queue a message goes to, and where it goes when that fails.

The proxy chooses the queue, as the Apache proxy does, not the client: the official Python
client (5.1.2) never sets a message's queue, so honouring the client's choice sent all of
its messages to one queue of one broker. A message of a message group (FIFO) goes to the
queue its group hashes to among the route's writable queues, the same on every proxy, so
that a group stays in one queue and in order whichever proxy sends it; any other message
goes to the next writable queue in turn (the listing interleaves the brokers, so
consecutive sends spread over them).
"""

from __future__ import annotations

import itertools
import zlib

from proxy.brokers import BrokerPool, BrokerRoute, TopicRoute
from proxy.remoting.answers import BrokerError, SendResult
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import ResponseCode
from proxy.remoting.lite import lite_queue_index
from proxy.remoting.message import Prop

# Broker refusals that another broker may not share: the send is tried once elsewhere.
RETRY_ELSEWHERE = frozenset(
    {
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
    }
)


class SendFailure(Exception):
    """No broker took the message; ``error`` is the last broker's answer (None: no broker
    of the route had a connection to try)."""

    def __init__(self, broker: str, error: RemotingError | None) -> None:
        super().__init__(f"{broker}: {error}")
        self.broker = broker
        self.error = error


class ProducerProcessor:
    def __init__(self, pool: BrokerPool, broker_timeout_s: float) -> None:
        self.pool = pool
        self.broker_timeout_s = broker_timeout_s
        self._turn = itertools.count()

    async def send(
        self,
        route: TopicRoute,
        body: bytes,
        properties: dict[str, str],
        *,
        producer_group: str = "PROXY_PRODUCER",
        sys_flag: int = 0,
    ) -> SendResult:
        """Send to the queue chosen for it (see the module's docstring); on a refusal
        another broker may not share, or no answer, try one other broker, unless the
        message belongs to a message group (elsewhere, it could overtake the group's
        earlier messages). ``result.broker`` names the broker that took it. Raises
        SendFailure."""
        failure: SendFailure | None = None
        targets = (
            self._lite_target(route, properties[Prop.LITE_TOPIC])
            if Prop.LITE_TOPIC in properties
            else self._targets(route, properties.get(Prop.SHARDING_KEY))
        )
        for broker, queue_id in targets:
            client = self.pool.broker(broker.name)
            if client is None:
                continue
            try:
                result = await client.send(
                    route.topic,
                    body,
                    properties=properties,
                    queue_id=queue_id,
                    producer_group=producer_group,
                    sys_flag=sys_flag,
                    timeout=self.broker_timeout_s,
                )
                result.broker = broker.name
                return result
            except BrokerError as exc:
                failure = SendFailure(broker.name, exc)
                if exc.code not in RETRY_ELSEWHERE:
                    break
            except RemotingError as exc:
                failure = SendFailure(broker.name, exc)
        raise failure or SendFailure("", None)

    @staticmethod
    def _lite_target(route: TopicRoute, lite_topic: str) -> list[tuple[BrokerRoute, int]]:
        """A lite message (RocketMQ 5.5) goes to the queue its lite topic hashes to among
        the parent's write queues listed broker by broker, brokers by name: the broker of
        that queue owns the lite topic, and only its subscribers get an event for it (a
        lite message stored elsewhere reaches no lite consumer). The Apache proxy and the
        broker compute it alike (``remoting/lite.py``). No other broker."""
        queues = [
            (broker, queue_id)
            for broker in sorted(route.writable, key=lambda b: b.name)
            for queue_id in range(broker.write_queues)
        ]
        if not queues:
            return []
        return [queues[lite_queue_index(lite_topic, len(queues))]]

    def _targets(
        self, route: TopicRoute, message_group: str | None
    ) -> list[tuple[BrokerRoute, int]]:
        """The queue chosen for the message, then (without a message group) one other
        broker, any queue."""
        queues = [q for q in route.queues if q.writable]
        if not queues:
            return []
        if message_group:
            # crc32, not hash(): the same on every proxy process.
            chosen = queues[zlib.crc32(message_group.encode()) % len(queues)]
            return [(chosen.broker, chosen.queue_id)]
        turn = next(self._turn)
        chosen = queues[turn % len(queues)]
        others = [b for b in route.writable if b != chosen.broker]
        first = (chosen.broker, chosen.queue_id)
        return [first, (others[turn % len(others)], -1)] if others else [first]
