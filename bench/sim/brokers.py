"""Simulated brokers: the client methods the receive code calls, answered as RocketMQ 5
answers them, on simulated time.

What a real broker does and this one does too:

- A pop with nothing to take and a ``pollTime`` is parked under ``topic@group@queueId``
  (queue -1 here, as the proxy pops); so is a NOTIFICATION. Pops and notifications are
  parked in two tables (RocketMQ's PopMessageProcessor and NotificationProcessor each own
  a PopLongPollingService), each refusing beyond 1,024 per key and 100,000 in all: a
  refused pop answers POLLING_FULL (209), a refused notification ``pollingFull=true``.
- A message arriving for (group, topic) wakes one parked pop, the oldest, which pops again
  (and parks again if it finds nothing), and one parked notification, the newest, which
  answers ``hasMsg=true``. A notification that finds a message at once answers at once.
- A popped message is invisible for the pop's invisible time, visible again after it
  unless acked; CHANGE_MESSAGE_INVISIBLETIME moves that moment. Becoming visible again is
  an arrival (it wakes pollers).

Sampling (see bench/sim/fleet.py): the simulator plays a sample of the keys. The 100,000
limit is on all keys of a broker, so each table refuses once ``parked * scale`` reaches
it, ``scale`` being (keys in the fleet) / (keys simulated); the per-key limit is exact,
since every simulated key has all its consumers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass

from proxy.brokers import BrokerRoute, TopicRoute
from proxy.remoting.answers import NotificationResult, PopResult
from proxy.remoting.codes import ResponseCode
from proxy.remoting.filter import ExpressionType
from proxy.remoting.message import MessageExt, Prop

PER_KEY_LIMIT = 1_024  # RocketMQ BrokerConfig.popPollingSize
TOTAL_LIMIT = 100_000  # RocketMQ BrokerConfig.maxPopPollingSize

Key = tuple[str, str]  # group, topic


@dataclass(eq=False, slots=True)
class SimMessage:
    id: int
    key: Key
    broker: str
    sent_at: float
    visible_since: float
    delivered: bool = False
    checkpoint: str = ""
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False, slots=True)
class _Waiter:
    key: Key
    future: asyncio.Future
    timer: asyncio.TimerHandle | None = None


class ParkTable:
    """Parked requests of one kind on one broker; counts and time-weighted size."""

    def __init__(self, loop: asyncio.AbstractEventLoop, total_limit: float) -> None:
        self.loop = loop
        self.total_limit = total_limit  # in simulated requests (already divided by scale)
        self.by_key: dict[Key, deque[_Waiter]] = {}
        self.size = 0
        self.max_size = 0
        self.refused = 0
        self.refused_per_key = 0  # of which the per-key limit
        self._area = 0.0  # integral of size over time
        self._since = loop.time()

    def _account(self) -> None:
        now = self.loop.time()
        self._area += self.size * (now - self._since)
        self._since = now

    def reset_stats(self) -> None:
        self._account()
        self._area = 0.0
        self.max_size = self.size
        self.refused = self.refused_per_key = 0

    def mean_size(self, seconds: float) -> float:
        self._account()
        return self._area / seconds if seconds > 0 else 0.0

    def park(self, key: Key, deadline: float, on_timeout) -> _Waiter | None:
        waiters = self.by_key.get(key)
        if waiters is not None and len(waiters) >= PER_KEY_LIMIT:
            self.refused += 1
            self.refused_per_key += 1
            return None
        if self.size + 1 > self.total_limit:
            self.refused += 1
            return None
        if waiters is None:
            waiters = self.by_key[key] = deque()
        waiter = _Waiter(key, self.loop.create_future())
        waiter.timer = self.loop.call_at(deadline, self._expire, waiter, on_timeout)
        waiters.append(waiter)
        self._account()
        self.size += 1
        self.max_size = max(self.max_size, self.size)
        return waiter

    def take(self, key: Key, newest: bool) -> _Waiter | None:
        waiters = self.by_key.get(key)
        if not waiters:
            return None
        waiter = waiters.pop() if newest else waiters.popleft()
        self._left(waiter, waiters)
        return waiter

    def _expire(self, waiter: _Waiter, on_timeout) -> None:
        waiters = self.by_key.get(waiter.key)
        if waiters is not None:
            try:
                waiters.remove(waiter)
            except ValueError:
                return
            waiter.timer = None
            self._left(waiter, waiters)
            on_timeout(waiter)

    def _left(self, waiter: _Waiter, waiters: deque[_Waiter]) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        if not waiters:
            del self.by_key[waiter.key]
        self._account()
        self.size -= 1


class FleetLedger:
    """What every broker shares: each key's visible messages (to tell a false empty) and
    the delivery record."""

    def __init__(self) -> None:
        self.visible: dict[Key, dict[int, SimMessage]] = {}
        self.latencies: list[float] = []
        self.delivered = 0
        self.redelivered = 0
        self.measuring = False

    def oldest_visible_since(self, key: Key) -> float | None:
        msgs = self.visible.get(key)
        if not msgs:
            return None
        return min(m.visible_since for m in msgs.values())


class SimBroker:
    """One broker; the proxies' BrokerPools hand it out as the broker's client."""

    def __init__(
        self,
        name: str,
        ledger: FleetLedger,
        *,
        scale: float = 1.0,
        rtt_s: float = 0.0005,
    ) -> None:
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.ledger = ledger
        self.scale = scale
        self.half_rtt = rtt_s / 2
        limit = TOTAL_LIMIT / scale
        self.pops = ParkTable(self.loop, limit)
        self.notifications = ParkTable(self.loop, limit)
        self.queues: dict[Key, deque[SimMessage]] = {}
        self.invisible: dict[str, SimMessage] = {}
        self.requests: dict[str, int] = dict.fromkeys(
            ("pop", "long_pop", "notification", "ack", "change_invisible"), 0
        )
        self._ck = itertools.count()

    def reset_stats(self) -> None:
        self.pops.reset_stats()
        self.notifications.reset_stats()
        for k in self.requests:
            self.requests[k] = 0

    # -- producing ------------------------------------------------------------------------

    def put(self, msg: SimMessage) -> None:
        self._make_visible(msg)

    def _make_visible(self, msg: SimMessage) -> None:
        msg.visible_since = self.loop.time()
        msg.timer = None
        self.queues.setdefault(msg.key, deque()).append(msg)
        self.ledger.visible.setdefault(msg.key, {})[msg.id] = msg
        self._arrived(msg.key)

    def _arrived(self, key: Key) -> None:
        """One arrival wakes one parked pop (the oldest) and one notification (the newest)."""
        waiter = self.pops.take(key, newest=False)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result("woken")
        waiter = self.notifications.take(key, newest=True)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(True)

    # -- the client API the receive code calls ----------------------------------------------

    async def _hop(self) -> None:
        if self.half_rtt > 0:
            await asyncio.sleep(self.half_rtt)

    async def pop(
        self,
        group: str,
        topic: str,
        *,
        queue_id: int = -1,
        max_nums: int = 32,
        invisible_ms: int = 30_000,
        poll_ms: int = 0,
        expression: str = "*",
        expression_type: ExpressionType = ExpressionType.TAG,  # filters are not simulated
        init_mode: int = 1,
        order: bool = False,  # FIFO groups are not simulated
        attempt_id: str | None = None,
        timeout: float | None = None,
        on_late=None,
    ) -> PopResult:
        self.requests["long_pop" if poll_ms > 0 else "pop"] += 1
        await self._hop()
        key = (group, topic)
        deadline = self.loop.time() + poll_ms / 1000
        while True:
            taken = self._take(key, max_nums, invisible_ms)
            if taken or poll_ms <= 0 or self.loop.time() >= deadline:
                code = ResponseCode.SUCCESS if taken else ResponseCode.POLLING_TIMEOUT
                result = PopResult(code, taken)
                break
            waiter = self.pops.park(key, deadline, _time_out)
            if waiter is None:
                result = PopResult(ResponseCode.POLLING_FULL)
                break
            await waiter.future  # "woken" or "timeout": pop again (once more at the deadline)
        await self._hop()
        return result

    async def notification(
        self,
        group: str,
        topic: str,
        *,
        queue_id: int = -1,
        poll_ms: int = 0,
        order: bool = False,  # FIFO groups are not simulated
        timeout: float | None = None,
    ) -> NotificationResult:
        self.requests["notification"] += 1
        await self._hop()
        key = (group, topic)
        if self.queues.get(key) or poll_ms <= 0:
            result = NotificationResult(has_msg=bool(self.queues.get(key)))
        else:
            waiter = self.notifications.park(key, self.loop.time() + poll_ms / 1000, _answer_false)
            if waiter is None:
                result = NotificationResult(has_msg=False, polling_full=True)
            else:
                result = NotificationResult(has_msg=await waiter.future)
        await self._hop()
        return result

    async def change_invisible_time(
        self,
        group: str,
        topic: str,
        extra_info: str,
        invisible_ms: int,
        timeout: float = 3.0,
        lite_topic: str | None = None,
    ) -> str:
        self.requests["change_invisible"] += 1
        await self._hop()
        msg = self.invisible.get(extra_info)
        if msg is not None and msg.timer is not None:
            msg.timer.cancel()
            msg.timer = self.loop.call_later(invisible_ms / 1000, self._revive, extra_info)
        await self._hop()
        return extra_info

    async def ack_batch(self, checkpoints: list[str]) -> None:
        """The client's AckMessage for one received batch: one BATCH_ACK_MESSAGE."""
        self.requests["ack"] += 1
        await self._hop()
        for ck in checkpoints:
            msg = self.invisible.pop(ck, None)
            if msg is not None and msg.timer is not None:
                msg.timer.cancel()
                msg.timer = None
        await self._hop()

    # -- inside ---------------------------------------------------------------------------

    def _take(self, key: Key, max_nums: int, invisible_ms: int) -> list[MessageExt]:
        queue = self.queues.get(key)
        if not queue:
            return []
        taken: list[MessageExt] = []
        visible = self.ledger.visible.get(key, {})
        while queue and len(taken) < max_nums:
            msg = queue.popleft()
            visible.pop(msg.id, None)
            ck = f"{self.name} {next(self._ck)}"
            msg.checkpoint = ck
            self.invisible[ck] = msg
            msg.timer = self.loop.call_later(invisible_ms / 1000, self._revive, ck)
            taken.append(
                MessageExt(
                    topic=key[1],
                    body=b"",
                    properties={Prop.POP_CK: ck, Prop.UNIQ_KEY: str(msg.id)},
                    commit_log_offset=msg.id,
                )
            )
        if not queue:
            del self.queues[key]
        return taken

    def _revive(self, ck: str) -> None:
        msg = self.invisible.pop(ck, None)
        if msg is not None:
            self._make_visible(msg)

    def message(self, ck: str) -> SimMessage | None:
        return self.invisible.get(ck)


def _time_out(waiter: _Waiter) -> None:
    if not waiter.future.done():
        waiter.future.set_result("timeout")


def _answer_false(waiter: _Waiter) -> None:
    if not waiter.future.done():
        waiter.future.set_result(False)


class SimPool:
    """What a proxy's BrokerPool gives the receive code: routes and broker clients."""

    def __init__(self, brokers: list[SimBroker], read_queues: int = 8) -> None:
        self._brokers = {b.name: b for b in brokers}
        self._route_brokers = tuple(
            BrokerRoute(b.name, f"sim:{b.name}", read_queues, read_queues, 6) for b in brokers
        )

    async def route(self, topic: str) -> TopicRoute:
        return TopicRoute(topic, self._route_brokers)

    def broker(self, name: str) -> SimBroker | None:
        return self._brokers.get(name)

    async def broker_by_name(self, name: str, topic: str) -> SimBroker | None:
        return self._brokers.get(name)
