"""Notification probes, shared by every poll of one proxy.

A poll in notify mode wants to hear when any broker has a message for its (group, topic).
Rather than each poll parking its own NOTIFICATION on every broker, polls *watch* a key
(broker, group, topic) and the hub keeps at most one probe in flight per key, held open
as long as the longest watcher needs. When the broker answers ``hasMsg``, the hub tells
the oldest watcher, waits until that watcher has popped (so one message wakes one poll),
then probes again for the others; a broker with a backlog answers the next probe at once.

Sharing keeps broker-side parked requests at (brokers x keys) instead of (brokers x polls),
and no probe is left parked on behalf of a poll that has already finished while another
poll of this proxy waits on the same key.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.brokers import BrokerPool
from proxy.remoting.client import RemotingError

log = logging.getLogger(__name__)

ProbeKey = tuple[str, str, str]  # broker, group, topic

# A probe for less time than this costs a request and cannot change any answer.
MIN_PROBE_S = 0.05


class WatchState(enum.Enum):
    WATCHING = "watching"  # waiting for hasMsg
    NOTIFIED = "notified"  # told hasMsg; its pop is running
    RELEASED = "released"  # done with


@dataclass(eq=False, slots=True)
class Watch:
    """One poll's interest in one key."""

    key: ProbeKey
    deadline: float  # loop time
    on_has_msg: Callable[[str], None]  # called with the broker name
    on_probe_sent: Callable[[], None]
    state: WatchState = WatchState.WATCHING


@dataclass(eq=False, slots=True)
class _Key:
    watchers: deque[Watch] = field(default_factory=deque)
    probe: asyncio.Task[None] | None = None
    consumed: asyncio.Event = field(default_factory=asyncio.Event)


class ProbeHub:
    def __init__(
        self,
        pool: BrokerPool,
        *,
        max_poll_ms: int = 20_000,
        broker_timeout_s: float = 3.0,
        error_backoff_s: float = 1.0,
        on_result: Callable[[str, str], None] | None = None,  # (broker, true/false/error)
    ) -> None:
        self.pool = pool
        self.max_poll_ms = max_poll_ms
        self.broker_timeout_s = broker_timeout_s
        self.error_backoff_s = error_backoff_s
        self.on_result = on_result
        self._keys: dict[ProbeKey, _Key] = {}
        self._restarts: set[asyncio.TimerHandle] = set()
        self._closed = False
        self.probes_sent = 0

    @property
    def probes_in_flight(self) -> int:
        return sum(1 for k in self._keys.values() if k.probe is not None)

    @property
    def watchers(self) -> int:
        return sum(len(k.watchers) for k in self._keys.values())

    def watch(
        self,
        key: ProbeKey,
        deadline: float,
        on_has_msg: Callable[[str], None],
        on_probe_sent: Callable[[], None],
    ) -> Watch:
        """Be told (once) when the broker of ``key`` has a message, until ``deadline``."""
        watch = Watch(key, deadline, on_has_msg, on_probe_sent)
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key()
        state.watchers.append(watch)
        if state.probe is None:
            self._start_probe(key, state)
        return watch

    def release(self, watch: Watch) -> None:
        """The poll is done with this watch: it popped after hasMsg, or it is ending."""
        if watch.state is WatchState.RELEASED:
            return
        state = self._keys.get(watch.key)
        if state is not None:
            if watch.state is WatchState.WATCHING:
                with contextlib.suppress(ValueError):
                    state.watchers.remove(watch)
            else:  # NOTIFIED: its pop is over (or will not happen); probe for the others
                state.consumed.set()
            if not state.watchers and state.probe is None:
                del self._keys[watch.key]
        watch.state = WatchState.RELEASED

    async def close(self) -> None:
        self._closed = True
        for timer in self._restarts:
            timer.cancel()
        self._restarts.clear()
        probes = [k.probe for k in self._keys.values() if k.probe is not None]
        for probe in probes:
            probe.cancel()
        for probe in probes:
            with contextlib.suppress(asyncio.CancelledError):
                await probe
        self._keys.clear()

    def _start_probe(self, key: ProbeKey, state: _Key) -> None:
        task = asyncio.ensure_future(self._probe_loop(key, state))
        state.probe = task
        task.add_done_callback(functools.partial(self._probe_done, key, state))

    def _probe_done(self, key: ProbeKey, state: _Key, task: asyncio.Task[None]) -> None:
        """A probe loop that raised (a defect, not a broker error: those it handles) is
        logged and, after the error back-off, started again for the polls still watching,
        so they do not sit out their deadlines unheard."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("probe of %s failed", key, exc_info=task.exception())
        self._report(key[0], "error")
        if self._closed:
            return
        loop = asyncio.get_running_loop()

        def restart() -> None:
            self._restarts.discard(timer)
            if not self._closed and state.watchers and state.probe is None:
                self._keys.setdefault(key, state)
                self._start_probe(key, state)

        timer = loop.call_later(self.error_backoff_s, restart)
        self._restarts.add(timer)

    async def _probe_loop(self, key: ProbeKey, state: _Key) -> None:
        broker, group, topic = key
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._drop_expired(state, loop.time())
                if not state.watchers:
                    return
                client = self.pool.broker(broker)
                if client is None:
                    return
                longest = max(w.deadline for w in state.watchers) - loop.time()
                if longest < MIN_PROBE_S:
                    return  # these polls answer in a moment; a probe could not help them
                poll_ms = min(int(longest * 1000), self.max_poll_ms)
                state.watchers[0].on_probe_sent()
                self.probes_sent += 1
                try:
                    answer = await client.notification(
                        group,
                        topic,
                        poll_ms=poll_ms,
                        timeout=poll_ms / 1000 + self.broker_timeout_s,
                    )
                except RemotingError as exc:
                    self._report(broker, "error")
                    log.info("notification to %s failed: %s", broker, exc)
                    await asyncio.sleep(self.error_backoff_s)
                    continue
                if answer.polling_full:
                    self._report(broker, "error")
                    await asyncio.sleep(self.error_backoff_s)
                    continue
                self._report(broker, "true" if answer.has_msg else "false")
                if answer.has_msg:
                    await self._notify_one(state, broker)
        finally:
            state.probe = None
            if not state.watchers and self._keys.get(key) is state:
                del self._keys[key]

    async def _notify_one(self, state: _Key, broker: str) -> None:
        """Tell the oldest watcher; wait until it has popped before probing again."""
        self._drop_expired(state, asyncio.get_running_loop().time())
        if not state.watchers:
            return
        watch = state.watchers.popleft()
        watch.state = WatchState.NOTIFIED
        state.consumed.clear()
        watch.on_has_msg(broker)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.consumed.wait(), self.broker_timeout_s)

    @staticmethod
    def _drop_expired(state: _Key, now: float) -> None:
        """Forget watchers whose polls are past their deadline (they are answering empty)."""
        if all(w.deadline > now for w in state.watchers):
            return
        live: deque[Watch] = deque()
        for watch in state.watchers:
            if watch.deadline > now:
                live.append(watch)
            else:
                watch.state = WatchState.RELEASED
        state.watchers = live

    def _report(self, broker: str, outcome: str) -> None:
        if self.on_result is not None:
            self.on_result(broker, outcome)
