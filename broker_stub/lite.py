"""Lite topics (RocketMQ 5.5, RIP-83): per-client subscriptions, event queues, lite pops.

A lite consumer client keeps a *subscription*: a set of lite topics (their LMQs, see
``proxy.remoting.lite``) under one parent topic, for one group, kept in step by
LITE_SUBSCRIPTION_CTL. The broker does not scan those LMQs on a pop. It keeps, per client,
a bounded, deduplicated FIFO of *events*, LMQ names that may hold something: a message
arriving in an LMQ puts it on the queue of one client of each subscribed group (a random
one, as LiteEventDispatcher), and wakes that client's parked pop. POP_LITE_MESSAGE takes
events off the client's queue and pops each LMQ orderly (queue 0, FIFO: blocked while an
earlier pop of it is neither acked nor expired) until it has its batch. An ack that frees
the LMQ puts it back on a client's queue for the rest of its backlog.

A lite topic is subscribed on a broker only if that broker owns it (the parent route's
sharding) or its LMQ already holds messages there; others are dropped silently.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from broker_stub.groups import (
    LITE_SUB_CLIENT_MAX_EVENT_CNT,
    LITE_SUB_RESET_OFFSET_EXCLUSIVE,
    LITE_SUB_RESET_OFFSET_UNSUBSCRIBE,
    GroupTable,
)
from broker_stub.polling import PollingTable
from broker_stub.pop import PopService
from broker_stub.store import LMQ_PREFIX, MessageStore
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.headers import NotifyUnsubscribeLiteHeader, now_ms
from proxy.remoting.lite import (
    POLICY_MAX,
    POLICY_MIN,
    OffsetOption,
    OffsetType,
    split_lmq_name,
)

MAX_CLIENT_EVENT_COUNT = 100  # BrokerConfig.maxClientEventCount: a client's event queue
# LiteEventDispatcher.scan, every liteEventCheckInterval: a client that has not taken events
# for CLIENT_IDLE_MS (or for CLIENT_INACTIVE_MS while it has some) loses its queue to the
# group's other clients and goes last in their selection for BLACKLIST_MS.
EVENT_CHECK_INTERVAL_S = 10.0
CLIENT_INACTIVE_MS = 10_000
CLIENT_IDLE_MS = 35_000
BLACKLIST_MS = 10_000
FULL_DISPATCH_DELAY_S = 10.0  # liteEventFullDispatchDelayTime: retry after a full queue
POLL_GROUP = ""  # parked lite pops are keyed by client id alone (PopLiteLongPollingService)


class LiteQuotaExceeded(Exception):
    """The broker holds maxLiteSubscriptionCount (client, lite topic) subscriptions."""


class LiteRefused(Exception):
    """A subscription change the group may not make (IllegalStateException on a broker)."""


@dataclass(eq=False, slots=True)
class ClientSubscription:
    client_id: str
    group: str
    topic: str  # the parent topic
    lmqs: set[str] = field(default_factory=set)
    updated_ms: int = field(default_factory=now_ms)


class EventQueue:
    """One client's pending LMQ names: FIFO, each at most once, at most ``capacity``."""

    __slots__ = ("_events", "_queued", "capacity", "group", "last_access_ms")

    def __init__(self, group: str, capacity: int) -> None:
        self.group = group
        self.capacity = capacity
        self._events: deque[str] = deque()
        self._queued: set[str] = set()
        self.last_access_ms = now_ms()

    def offer(self, lmq: str) -> bool:
        """False only when full (an LMQ already queued counts as offered)."""
        if len(self._events) >= self.capacity:
            return False
        if lmq not in self._queued:
            self._queued.add(lmq)
            self._events.append(lmq)
        return True

    def poll(self) -> str | None:
        if not self._events:
            return None
        self.last_access_ms = now_ms()  # only a pop that finds events counts (as RocketMQ)
        lmq = self._events.popleft()
        self._queued.discard(lmq)
        return lmq

    def __len__(self) -> int:
        return len(self._events)


@dataclass(slots=True)
class LitePopResult:
    pop_time: int
    records: list[bytes] = field(default_factory=list)
    order_counts: list[str] = field(default_factory=list)  # one per message


class LiteService:
    """The lite subscriptions and events of one broker."""

    def __init__(
        self,
        store: MessageStore,
        pop: PopService,
        groups: GroupTable,
        polls: PollingTable,
        loop: asyncio.AbstractEventLoop,
        *,
        max_subscriptions: int = 100_000,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.pop_service = pop
        self.groups = groups
        self.polls = polls
        self.loop = loop
        self.max_subscriptions = max_subscriptions  # BrokerConfig.maxLiteSubscriptionCount
        self.rng = rng or random.Random()
        self.subscriptions: dict[str, ClientSubscription] = {}  # client id ->
        self._subscribers: dict[str, dict[str, str]] = {}  # lmq -> client id -> group
        self._events: dict[str, EventQueue] = {}  # client id ->
        self._channels: dict[str, RemotingConnection] = {}  # client id -> last CTL's
        self._full_dispatch: dict[str, asyncio.TimerHandle] = {}  # client id ->
        self._unblock: dict[tuple[str, str], asyncio.TimerHandle] = {}  # (group, lmq) ->
        self._blacklist: dict[str, int] = {}  # client id -> until (epoch ms)
        self._scan_timer = loop.call_later(EVENT_CHECK_INTERVAL_S, self._scan_tick)
        self.active = 0  # (client, lmq) pairs subscribed

    def close(self) -> None:
        self._scan_timer.cancel()
        for timer in [*self._full_dispatch.values(), *self._unblock.values()]:
            timer.cancel()
        self._full_dispatch.clear()
        self._unblock.clear()

    @property
    def event_queue_count(self) -> int:
        return len(self._events)

    @property
    def lmq_count(self) -> int:
        return self.store.queue_count(LMQ_PREFIX)

    def lmq_exists(self, lmq: str) -> bool:
        return self.store.max_offset(lmq, 0) > 0

    # -- subscriptions (LITE_SUBSCRIPTION_CTL) ---------------------------------------------

    def remember_channel(self, client_id: str, conn: RemotingConnection) -> None:
        self._channels[client_id] = conn

    def add_partial(
        self,
        client_id: str,
        group: str,
        topic: str,
        lmqs: Iterable[str],
        option: OffsetOption | None,
        active: Callable[[str], bool],
    ) -> None:
        """PARTIAL_ADD: subscribe the LMQs that are ``active`` here; with ``option``, move
        the group's offset of each."""
        if self.active >= self.max_subscriptions:
            raise LiteQuotaExceeded(f"lite subscription quota exceeded {self.max_subscriptions}")
        config = self.groups.get(group)
        sub = self._subscription(client_id, group, topic)
        for lmq in lmqs:
            if not active(lmq):
                continue
            sub.lmqs.add(lmq)
            sub.updated_ms = now_ms()
            if config.lite_exclusive:
                self._evict_others(client_id, group, lmq)
            self._reset_offset(group, lmq, option)
            self._register(client_id, group, lmq)

    def remove_partial(self, client_id: str, group: str, topic: str, lmqs: Iterable[str]) -> None:
        """PARTIAL_REMOVE (the group's offset back to the oldest message when it has
        lite.sub.reset.offset.unsubscribe)."""
        reset = self.groups.get(group).flag(LITE_SUB_RESET_OFFSET_UNSUBSCRIBE)
        sub = self._subscription(client_id, group, topic)
        for lmq in lmqs:
            sub.lmqs.discard(lmq)
            sub.updated_ms = now_ms()
            self._unregister(client_id, group, lmq, reset)

    def add_complete(
        self,
        client_id: str,
        group: str,
        topic: str,
        lmqs: Iterable[str],
        active: Callable[[str], bool],
    ) -> None:
        """COMPLETE_ADD: the client's whole set (no quota check, no offset option)."""
        wanted = {lmq for lmq in lmqs if active(lmq)}
        sub = self._subscription(client_id, group, topic)
        for lmq in sub.lmqs - wanted:
            sub.lmqs.discard(lmq)
            self._unregister(client_id, sub.group, lmq, False)
        for lmq in wanted:
            sub.lmqs.add(lmq)
            self._register(client_id, sub.group, lmq)
        sub.updated_ms = now_ms()

    def remove_complete(self, client_id: str) -> None:
        """COMPLETE_REMOVE: forget the client; its pending events go to the others."""
        self._channels.pop(client_id, None)
        sub = self.subscriptions.pop(client_id, None)
        if sub is None:
            return
        for lmq in sub.lmqs:
            self._unregister(client_id, sub.group, lmq, False)
        timer = self._full_dispatch.pop(client_id, None)
        if timer is not None:
            timer.cancel()
        events = self._events.pop(client_id, None)
        while events is not None and (event := events.poll()) is not None:
            self.dispatch(events.group, event, exclude=client_id)

    def _subscription(self, client_id: str, group: str, topic: str) -> ClientSubscription:
        sub = self.subscriptions.get(client_id)
        if sub is None:
            sub = self.subscriptions[client_id] = ClientSubscription(client_id, group, topic)
        return sub

    def _register(self, client_id: str, group: str, lmq: str) -> None:
        clients = self._subscribers.setdefault(lmq, {})
        if client_id in clients:
            return
        clients[client_id] = group
        self.active += 1
        if self.lmq_exists(lmq):
            self.dispatch(group, lmq)

    def _unregister(self, client_id: str, group: str, lmq: str, reset: bool) -> None:
        clients = self._subscribers.get(lmq)
        if clients is None or clients.pop(client_id, None) is None:
            return
        self.active -= 1
        if not clients:
            del self._subscribers[lmq]
        if reset:
            self._reset_offset(group, lmq, OffsetOption(OffsetType.POLICY, POLICY_MIN))

    def _evict_others(self, client_id: str, group: str, lmq: str) -> None:
        """An exclusive group: the other clients of ``group`` lose ``lmq``, and are told."""
        reset = self.groups.get(group).flag(LITE_SUB_RESET_OFFSET_EXCLUSIVE)
        clients = self._subscribers.get(lmq, {})
        for other in [c for c, g in clients.items() if g == group and c != client_id]:
            sub = self.subscriptions.get(other)
            if sub is not None:
                sub.lmqs.discard(lmq)
                if not sub.lmqs:
                    del self.subscriptions[other]
            self._notify_unsubscribe(other, group, lmq)
            self._unregister(other, group, lmq, reset)

    def _notify_unsubscribe(self, client_id: str, group: str, lmq: str) -> None:
        conn = self._channels.get(client_id)
        names = split_lmq_name(lmq)
        if conn is None or conn.closed or names is None:
            return
        header = NotifyUnsubscribeLiteHeader(names[1], group, client_id)
        request = RemotingCommand(RequestCode.NOTIFY_UNSUBSCRIBE_LITE, header.encode())
        request.flag |= 0x2  # one-way, as Broker2Client sends it
        conn.send(request)

    def _reset_offset(self, group: str, lmq: str, option: OffsetOption | None) -> None:
        """resetOffset: POLICY min/max, OFFSET, TAIL_N (from an existing offset);
        TIMESTAMP and POLICY last change nothing."""
        if option is None:
            return
        has_offset = self.pop_service.has_offset(group, lmq, 0)
        current = self.pop_service.committed_offset(group, lmq, 0) if has_offset else -1
        target: int | None = None
        if option.type is OffsetType.POLICY:
            if option.value == POLICY_MIN:
                target = 0
            elif option.value == POLICY_MAX:
                target = self.store.max_offset(lmq, 0)
        elif option.type is OffsetType.OFFSET:
            target = option.value
        elif option.type is OffsetType.TAIL_N and current >= 0:
            target = max(0, current - option.value)
        if target is not None and target != current:
            self.pop_service.reset_offset(group, lmq, 0, target)

    # -- events ---------------------------------------------------------------------------

    def on_arrival(self, lmq: str) -> None:
        """A message arrived in ``lmq``: one client of each subscribed group hears of it."""
        self.dispatch(None, lmq)

    def dispatch(self, group: str | None, lmq: str, exclude: str | None = None) -> None:
        """Queue ``lmq`` on one client of ``group`` (of every group when None), preferring
        any client but ``exclude``, and wake its parked pop."""
        by_group: dict[str, list[str]] = {}
        for client_id, client_group in self._subscribers.get(lmq, {}).items():
            if group is None or client_group == group:
                by_group.setdefault(client_group, []).append(client_id)
        for client_group, clients in by_group.items():
            start = self.rng.randrange(len(clients))
            ordered = clients[start:] + clients[:start]
            now = now_ms()
            last = [c for c in ordered if c == exclude or self._blacklist.get(c, 0) > now]
            ordered = [c for c in ordered if c not in last] + last
            for client_id in ordered:
                if self._offer(client_id, client_group, lmq):
                    self.polls.wake(client_id, 0)
                    break

    def _offer(self, client_id: str, group: str, lmq: str) -> bool:
        events = self._events.get(client_id)
        if events is None:
            events = self._events[client_id] = EventQueue(group, self._capacity(group))
        if events.offer(lmq):
            return True
        self._schedule_full_dispatch(client_id, group)
        return False

    def _capacity(self, group: str) -> int:
        value = self.groups.get(group).attributes.get(LITE_SUB_CLIENT_MAX_EVENT_CNT, "")
        count = int(value) if value.lstrip("-").isdigit() else 0
        return count if count > 0 else MAX_CLIENT_EVENT_COUNT

    def _schedule_full_dispatch(self, client_id: str, group: str) -> None:
        if client_id not in self._full_dispatch:
            self._full_dispatch[client_id] = self.loop.call_later(
                FULL_DISPATCH_DELAY_S, self._full_dispatch_for, client_id, group
            )

    def _full_dispatch_for(self, client_id: str, group: str) -> None:
        """Events were dropped on a full queue: queue every subscribed LMQ with a backlog."""
        self._full_dispatch.pop(client_id, None)
        sub = self.subscriptions.get(client_id)
        if sub is None:
            return
        for lmq in sorted(sub.lmqs):
            high = self.store.max_offset(lmq, 0)
            if high <= 0 or self.pop_service.committed_offset(group, lmq, 0) >= high:
                continue
            if not self._offer(client_id, group, lmq):
                break
        self.polls.wake(client_id, 0)

    def _scan_tick(self) -> None:
        self.scan()
        self._scan_timer = self.loop.call_later(EVENT_CHECK_INTERVAL_S, self._scan_tick)

    def scan(self, now: int | None = None) -> None:
        """Take the event queue of every client that stopped popping and dispatch its
        events to the group's other clients (it goes last among them for a while)."""
        now = now_ms() if now is None else now
        self._blacklist = {c: until for c, until in self._blacklist.items() if until > now}
        for client_id, events in list(self._events.items()):
            idle = now - events.last_access_ms
            if idle <= CLIENT_IDLE_MS and not (len(events) and idle > CLIENT_INACTIVE_MS):
                continue
            del self._events[client_id]
            self._blacklist[client_id] = now + BLACKLIST_MS
            while (event := events.poll()) is not None:
                self.dispatch(events.group, event, exclude=client_id)

    # -- pop ------------------------------------------------------------------------------

    def pop(
        self,
        client_id: str,
        group: str,
        max_num: int,
        invisible_time: int,
        attempt_id: str | None,
    ) -> LitePopResult:
        """Pop up to ``max_num`` messages from the LMQs on the client's event queue, in
        its order; each LMQ once per pop (an event that yields nothing is spent)."""
        result = LitePopResult(now_ms())
        events = self._events.get(client_id)
        seen: set[str] = set()
        while events is not None and len(result.records) < max_num:
            lmq = events.poll()
            if lmq is None:
                break
            if lmq in seen:
                continue
            seen.add(lmq)
            want = max_num - len(result.records)
            popped = self.pop_service.pop_queue_orderly(
                group, lmq, 0, want, invisible_time, attempt_id, result.pop_time
            )
            records = [r for q in popped.queues for r in q.records]
            if not records:
                continue
            result.records.extend(records)
            result.order_counts.extend(_counts(popped.order_count_info or [], len(records)))
            self.watch_block(group, lmq)
        return result

    def acked(self, group: str, lmq: str) -> None:
        """An ack freed ``lmq``: its backlog is an event for the group again."""
        self.dispatch(group, lmq)

    def watch_block(self, group: str, lmq: str) -> None:
        """When the LMQ's orderly block ends unacked (its invisible time, or a changed one),
        it is an event for the group again: a 5.5 broker's lock-free timer
        (QueueLevelConsumerOrderInfoLockManager.notifyLockIsFree) dispatches it."""
        key = (group, lmq)
        timer = self._unblock.pop(key, None)
        if timer is not None:
            timer.cancel()
        end = self.pop_service.block_end(group, lmq, 0)
        if end is not None:
            delay = max(end - now_ms(), 0) / 1000
            self._unblock[key] = self.loop.call_later(delay, self._unblocked, group, lmq)

    def _unblocked(self, group: str, lmq: str) -> None:
        self._unblock.pop((group, lmq), None)
        end = self.pop_service.block_end(group, lmq, 0)
        if end is None:
            return  # acked meanwhile: the ack dispatched already
        if end > now_ms():
            self.watch_block(group, lmq)  # moved by a change of invisible time
            return
        self.dispatch(group, lmq)


def _counts(order_count_info: list[str], count: int) -> list[str]:
    """The consume count of each of ``count`` messages, from an orderly pop's count info
    (PopLiteMessageProcessor.transformOrderCountInfo)."""
    if len(order_count_info) > 1:
        return order_count_info[:-1]  # the per-offset entries, without the queue's
    parts = order_count_info[0].split(" ") if order_count_info else []
    return [parts[2] if len(parts) == 3 else "0"] * count
