"""Broker-side long polling: parked pops and notifications, woken when a message arrives.

A request that finds nothing is parked under ``(topic, group, queueId)``, queueId -1
meaning any queue. An arrival on (topic, queue q) wakes, for each group waiting on the
topic, one request under queueId -1 and one under q: one message, one wake-up per key, as
RocketMQ does (the oldest pop, the newest notification). A wake-up runs the request's
``on_wake`` right away, inside the put that caused it, so there is no scan tick between a
send and the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from proxy.remoting.command import RemotingCommand

PollKey = tuple[str, str, int]  # topic, group, queue id


@dataclass(slots=True, eq=False)
class Waiter:
    """One parked request. Its future carries the eventual response."""

    key: PollKey
    future: asyncio.Future[RemotingCommand]
    deadline: float  # loop time
    on_wake: Callable[[Waiter], None]
    on_timeout: Callable[[Waiter], None]
    timer: asyncio.TimerHandle | None = None
    parked: bool = False
    watched: bool = False  # our done-callback is on the future


class PollingTable:
    """Parked requests of one kind. ``park`` refuses beyond the per-key or total limit."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, per_key: int, total: int, wake_newest: bool = False
    ) -> None:
        self.loop = loop
        # RocketMQ wakes the oldest parked pop but the newest parked notification: the newest
        # probe is the one most likely to still have a client waiting behind it.
        self.wake_newest = wake_newest
        self.per_key = per_key
        self.total = total
        self.size = 0
        # topic -> group -> queue id -> waiters, oldest first
        self._table: dict[str, dict[str, dict[int, deque[Waiter]]]] = {}

    def park(self, waiter: Waiter) -> bool:
        """Park ``waiter`` until a wake-up or its deadline; False if the table is full."""
        if self.size >= self.total or self.count(*waiter.key) >= self.per_key:
            return False
        topic, group, queue_id = waiter.key
        by_queue = self._table.setdefault(topic, {}).setdefault(group, {})
        by_queue.setdefault(queue_id, deque()).append(waiter)
        self.size += 1
        waiter.parked = True
        waiter.timer = self.loop.call_at(waiter.deadline, self._expire, waiter)
        if not waiter.watched:
            # A cancelled future (the client went away) leaves the table at once.
            waiter.watched = True
            waiter.future.add_done_callback(lambda _f: self._unpark(waiter))
        return True

    def count(self, topic: str, group: str, queue_id: int) -> int:
        waiters = self._table.get(topic, {}).get(group, {}).get(queue_id)
        return len(waiters) if waiters else 0

    def wake(self, topic: str, queue_id: int | None, group: str | None = None) -> int:
        """Wake one waiter per matching key; return how many woke.

        ``queue_id`` None wakes one waiter on every queue key (an arrival in a retry topic,
        which every queue's pops also read). ``group`` None means every group.
        """
        groups = self._table.get(topic)
        if not groups:
            return 0
        woken = 0
        for name in [group] if group is not None else list(groups):
            by_queue = groups.get(name)
            if not by_queue:
                continue
            if queue_id is None:
                keys = list(by_queue)
            else:
                keys = [-1, queue_id] if queue_id >= 0 else [-1]
            for qid in keys:
                waiters = by_queue.get(qid)
                if waiters:
                    self._wake(waiters.pop() if self.wake_newest else waiters.popleft())
                    woken += 1
        return woken

    def close(self) -> None:
        for groups in self._table.values():
            for by_queue in groups.values():
                for waiters in by_queue.values():
                    for waiter in list(waiters):
                        waiter.parked = False  # so the done-callback does not count it again
                        if waiter.timer is not None:
                            waiter.timer.cancel()
                        waiter.future.cancel()
        self._table.clear()
        self.size = 0

    def _wake(self, waiter: Waiter) -> None:
        self._detach(waiter)
        if not waiter.future.done():
            waiter.on_wake(waiter)

    def _expire(self, waiter: Waiter) -> None:
        self._remove(waiter)
        if not waiter.future.done():
            waiter.on_timeout(waiter)

    def _unpark(self, waiter: Waiter) -> None:
        if waiter.parked:
            self._remove(waiter)

    def _remove(self, waiter: Waiter) -> None:
        if not waiter.parked:
            return
        topic, group, queue_id = waiter.key
        waiters = self._table.get(topic, {}).get(group, {}).get(queue_id)
        if waiters is not None:
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
        self._detach(waiter)

    def _detach(self, waiter: Waiter) -> None:
        """Bookkeeping for a waiter that has left its deque."""
        waiter.parked = False
        self.size -= 1
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        topic, group, queue_id = waiter.key
        groups = self._table.get(topic)
        if groups is None:
            return
        by_queue = groups.get(group)
        if by_queue is not None and not by_queue.get(queue_id, True):
            del by_queue[queue_id]
            if not by_queue:
                del groups[group]
                if not groups:
                    del self._table[topic]
