"""Sending: which broker and queue a message goes to, and where it goes when that fails."""

from __future__ import annotations

import itertools

from proxy.brokers import BrokerPool, BrokerRoute, TopicRoute
from proxy.remoting.broker_client import BrokerError, SendResult
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import ResponseCode

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
        position: int,
        body: bytes,
        properties: dict[str, str],
        *,
        producer_group: str = "PROXY_PRODUCER",
        sys_flag: int = 0,
    ) -> SendResult:
        """Send to the queue at ``position`` of the route's listing (what QueryRoute showed
        the client), else any writable broker; on a refusal another broker may not share,
        or no answer, try one other broker. ``result.broker`` names the broker that took
        it. Raises SendFailure."""
        failure: SendFailure | None = None
        for broker, queue_id in self._targets(route, position):
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

    def _targets(self, route: TopicRoute, position: int) -> list[tuple[BrokerRoute, int]]:
        """The queue the client chose, then one other broker, any queue."""
        queues = route.queues
        writable = route.writable
        turn = next(self._turn)
        if 0 <= position < len(queues) and queues[position].writable:
            first = (queues[position].broker, queues[position].queue_id)
        else:
            first = (writable[turn % len(writable)], -1)
        others = [b for b in writable if b != first[0]]
        return [first, (others[turn % len(others)], -1)] if others else [first]
