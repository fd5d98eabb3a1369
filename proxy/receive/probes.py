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

WATCHING, NOTIFIED, RELEASED = "watching", "notified", "released"


MissKey = tuple[str, str, str, str]  # broker, group, topic, filter expression


class MissMemory:
    """How many pops in a row found nothing on a broker right after it said hasMsg, per
    (broker, group, topic, expression), less one per pop that found messages, forgotten
    ``forget_s`` after the last miss.

    A poll's back-off (``notify.MISS_BACKOFF_S``) starts from here, so a client polling
    again and again through filtered traffic does not start each poll at no pause.
    """

    def __init__(self, forget_s: float = 2.0, max_keys: int = 100_000) -> None:
        self.forget_s = forget_s
        self.max_keys = max_keys
        self._streaks: dict[MissKey, tuple[int, float]] = {}

    def streak(self, key: MissKey, now: float) -> int:
        entry = self._streaks.get(key)
        if entry is None or now - entry[1] > self.forget_s:
            return 0
        return entry[0]

    def miss(self, key: MissKey, now: float) -> int:
        """Count one more miss; the streak including it."""
        streak = self.streak(key, now) + 1
        if key not in self._streaks and len(self._streaks) >= self.max_keys:
            self._forget(now)
        self._streaks[key] = (streak, now)
        return streak

    def hit(self, key: MissKey, now: float) -> None:
        """A pop found messages: one miss fewer. Not a reset: with a filter that drops
        nine messages in ten, nine misses come for each hit and the streak still grows;
        consumers racing for unfiltered messages miss about as often as they hit and keep
        it near zero."""
        streak = self.streak(key, now) - 1
        if streak <= 0:
            self._streaks.pop(key, None)
        else:
            self._streaks[key] = (streak, self._streaks[key][1])

    def __len__(self) -> int:
        return len(self._streaks)

    def _forget(self, now: float) -> None:
        old = [k for k, (_, t) in self._streaks.items() if now - t > self.forget_s]
        for key in old or list(self._streaks)[: len(self._streaks) // 10 + 1]:
            del self._streaks[key]


@dataclass(eq=False, slots=True)
class Watch:
    """One poll's interest in one key."""

    key: ProbeKey
    deadline: float  # loop time
    on_has_msg: Callable[[str], None]  # called with the broker name
    on_probe_sent: Callable[[], None]
    state: str = WATCHING


@dataclass(eq=False, slots=True)
class _Key:
    watchers: deque[Watch] = field(default_factory=deque)
    probe: asyncio.Task | None = None
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
        self.probes_sent = 0
        self.misses = MissMemory()

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
            state.probe = asyncio.ensure_future(self._probe_loop(key, state))
        return watch

    def release(self, watch: Watch) -> None:
        """The poll is done with this watch: it popped after a notice, or it is ending."""
        if watch.state == RELEASED:
            return
        state = self._keys.get(watch.key)
        if state is not None:
            if watch.state == WATCHING:
                with contextlib.suppress(ValueError):
                    state.watchers.remove(watch)
            else:  # NOTIFIED: its pop is over (or will not happen); probe for the others
                state.consumed.set()
            if not state.watchers and state.probe is None:
                del self._keys[watch.key]
        watch.state = RELEASED

    async def close(self) -> None:
        probes = [k.probe for k in self._keys.values() if k.probe is not None]
        for probe in probes:
            probe.cancel()
        for probe in probes:
            with contextlib.suppress(asyncio.CancelledError):
                await probe
        self._keys.clear()

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
        watch.state = NOTIFIED
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
                watch.state = RELEASED
        state.watchers = live

    def _report(self, broker: str, outcome: str) -> None:
        if self.on_result is not None:
            self.on_result(broker, outcome)
