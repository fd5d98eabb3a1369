"""Notification probes, shared by every poll of one proxy.

A poll in notify mode wants to hear when any broker has a message for its (group, topic).
Rather than each poll parking its own NOTIFICATION on every broker, polls *watch* a key
(broker, group, topic) and the hub keeps at most one probe in flight per key, held open
as long as the longest watcher needs. When the broker answers ``hasMsg``, the hub tells
the oldest watcher, waits until that watcher has popped (so one message wakes one poll),
then probes again for the others; a broker with a backlog answers the next probe at once.

With ``linger_s`` set, a probe is parked for as long as a broker holds one, and is sent
again after it ends while the key had a poll within ``linger_s``: a consumer polls again
moments after its last answer, finds the probe parked, and its poll skips the first pop
(``notify.py``). A lingering probe that hears hasMsg with no poll watching stops: the next
poll's first pop takes the message.

Sharing keeps broker-side parked requests at (brokers x keys) instead of (brokers x polls),
and no probe is left parked on behalf of a poll that has already finished while another
poll of this proxy waits on the same key.

With ``max_per_broker`` set, the hub keeps at most that many probes per broker. A key
that finds them all taken waits in the broker's queue; while any key waits, a probe is
parked for at most ``slice_s`` and then gives its place to the first waiting key and goes
to the back of the queue (fair rotation). A broker holds at most P x max_per_broker
probes from a fleet of P proxies, however many keys they serve. A key not probed by this
proxy for a while is, with many proxies, almost always probed by another one that has a
consumer of the same group waiting (docs/scale.md).
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
from typing import Protocol

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
    on_probe_sent: Callable[[str], None]
    state: WatchState = WatchState.WATCHING


@dataclass(eq=False, slots=True)
class _Key:
    watchers: deque[Watch] = field(default_factory=deque)
    probe: asyncio.Task[None] | None = None
    consumed: asyncio.Event = field(default_factory=asyncio.Event)
    queued: bool = False  # waiting in its broker's queue for a probe slot
    probes: int = 0  # sent by the running probe loop
    order: bool = False  # a FIFO group's key: orderly probes (blocked queues do not count)
    parked: bool = False  # a NOTIFICATION is out and has not answered yet
    last_watched: float = float("-inf")  # loop time a watch of this key last ended


class Prober(Protocol):
    """What a notify poll and the engine need of the probes: this proxy's ``ProbeHub``, or
    the ``SharedProbeHub`` of a fleet that probes each key once (``receive/shared.py``)."""

    @property
    def probes_in_flight(self) -> int: ...

    @property
    def watchers(self) -> int: ...

    @property
    def probes_sent(self) -> int: ...

    def parked(self, key: ProbeKey) -> bool: ...

    def watch(
        self,
        key: ProbeKey,
        deadline: float,
        on_has_msg: Callable[[str], None],
        on_probe_sent: Callable[[str], None],
        *,
        order: bool = False,
    ) -> Watch: ...

    def release(self, watch: Watch, *, missed: bool = False) -> None: ...

    async def close(self) -> None: ...


class ProbeHub:
    def __init__(
        self,
        pool: BrokerPool,
        *,
        max_poll_ms: int = 20_000,
        broker_timeout_s: float = 3.0,
        error_backoff_s: float = 1.0,
        on_result: Callable[[str, str], None] | None = None,  # (broker, true/false/error)
        max_per_broker: int = 0,  # probes per broker at most (0: no limit)
        slice_s: float = 5.0,  # a probe's time while other keys wait for its place
        linger_s: float = 0.0,  # keep probing this long past the key's last watch
    ) -> None:
        self.pool = pool
        self.max_per_broker = max_per_broker
        self.slice_s = slice_s
        self.linger_s = linger_s
        self._holding: dict[str, int] = {}  # broker -> probe loops running
        self._queue: dict[str, deque[tuple[ProbeKey, _Key]]] = {}  # broker -> waiting keys
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

    def parked(self, key: ProbeKey) -> bool:
        """A NOTIFICATION of ``key`` is out and has not answered. A broker answers one at
        once when it holds a message for the group, and wakes it when one arrives, so its
        broker has had nothing new for the key since the probe reached it (a pop there
        would find nothing), or the answer saying otherwise is on its way."""
        state = self._keys.get(key)
        return state is not None and state.parked

    def watch(
        self,
        key: ProbeKey,
        deadline: float,
        on_has_msg: Callable[[str], None],
        on_probe_sent: Callable[[str], None],
        *,
        order: bool = False,
    ) -> Watch:
        """Be told (once) when the broker of ``key`` has a message, until ``deadline``;
        ``order``: the key's group is FIFO (a group is or is not, for all its polls)."""
        watch = Watch(key, deadline, on_has_msg, on_probe_sent)
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key(order=order)
        state.watchers.append(watch)
        if state.probe is None and not state.queued:
            if self._slot_free(key[0]):
                self._start_probe(key, state)
            else:
                self._enqueue(key, state)
        return watch

    def release(self, watch: Watch, *, missed: bool = False) -> None:
        """The poll is done with this watch: it popped after hasMsg, or it is ending.
        ``missed``: its pop after hasMsg found nothing, so the broker holds messages the
        poll cannot take (filtered out, or taken first): a lingering probe would hear them
        at once, again and again, so the key does not linger."""
        if watch.state is WatchState.RELEASED:
            return  # an expired watch was timed by _drop_expired; a second release is no news
        state = self._keys.get(watch.key)
        if state is not None:
            state.last_watched = float("-inf") if missed else asyncio.get_running_loop().time()
            if watch.state is WatchState.WATCHING:
                with contextlib.suppress(ValueError):
                    state.watchers.remove(watch)
            else:  # NOTIFIED: its pop is over (or will not happen); probe for the others
                state.consumed.set()
            if not state.watchers and state.probe is None and self._keys.get(watch.key) is state:
                del self._keys[watch.key]  # a queued entry of it is skipped when its turn comes
        watch.state = WatchState.RELEASED

    async def close(self) -> None:
        self._closed = True
        for timer in self._restarts:
            timer.cancel()
        self._restarts.clear()
        self._queue.clear()
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
        self._holding[key[0]] = self._holding.get(key[0], 0) + 1
        task.add_done_callback(functools.partial(self._probe_done, key, state))

    # -- probe slots per broker (max_per_broker) --------------------------------------------

    def _slot_free(self, broker: str) -> bool:
        return not self.max_per_broker or self._holding.get(broker, 0) < self.max_per_broker

    def _enqueue(self, key: ProbeKey, state: _Key) -> None:
        state.queued = True
        self._queue.setdefault(key[0], deque()).append((key, state))

    def _others_wait(self, broker: str) -> bool:
        return bool(self.max_per_broker and self._queue.get(broker))

    def _slot_freed(self, broker: str) -> None:
        """A probe of ``broker`` ended: its place goes to the first key still watched."""
        held = self._holding.get(broker, 1) - 1
        if held:
            self._holding[broker] = held
        else:
            self._holding.pop(broker, None)
        queue = self._queue.get(broker)
        now = asyncio.get_running_loop().time()
        while queue and self._slot_free(broker) and not self._closed:
            key, state = queue.popleft()
            state.queued = False
            self._drop_expired(state, now)
            if self._keys.get(key) is not state or state.probe is not None:
                continue
            if state.watchers:
                self._start_probe(key, state)
            else:
                del self._keys[key]
        if queue is not None and not queue:
            del self._queue[broker]

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
        rotate = False  # give the place to a waiting key and queue again
        try:
            while True:
                now = loop.time()
                self._drop_expired(state, now)
                lingering = self.linger_s > 0 and now - state.last_watched < self.linger_s
                if not state.watchers and not lingering:
                    return
                if self._others_wait(broker) and state.probes:
                    rotate = True
                    return
                client = self.pool.broker(broker)
                if client is None:
                    return
                if self.linger_s > 0:
                    # As long as a broker holds one: the key's next polls find it parked.
                    poll_ms = self.max_poll_ms
                else:
                    longest = max(w.deadline for w in state.watchers) - now
                    if longest < MIN_PROBE_S:
                        return  # these polls answer in a moment; a probe cannot help them
                    poll_ms = min(int(longest * 1000), self.max_poll_ms)
                if self._others_wait(broker):
                    poll_ms = min(poll_ms, int(self.slice_s * 1000))
                state.probes += 1
                if state.watchers:
                    state.watchers[0].on_probe_sent(broker)
                self.probes_sent += 1
                state.parked = True
                try:
                    answer = await client.notification(
                        group,
                        topic,
                        poll_ms=poll_ms,
                        order=state.order,
                        timeout=poll_ms / 1000 + self.broker_timeout_s,
                    )
                except RemotingError as exc:
                    state.parked = False
                    self._report(broker, "error")
                    log.info("notification to %s failed: %s", broker, exc)
                    await asyncio.sleep(self.error_backoff_s)
                    continue
                state.parked = False
                if answer.polling_full:
                    self._report(broker, "error")
                    await asyncio.sleep(self.error_backoff_s)
                    continue
                self._report(broker, "true" if answer.has_msg else "false")
                if answer.has_msg and not await self._notify_one(state, broker):
                    return  # nobody to tell: the next poll's first pop takes it
        finally:
            state.parked = False  # also when cancelled while parked
            state.probe = None
            state.probes = 0
            if rotate and not self._closed:
                self._enqueue(key, state)
            elif not state.watchers and self._keys.get(key) is state:
                del self._keys[key]
            self._slot_freed(broker)

    async def _notify_one(self, state: _Key, broker: str) -> bool:
        """Tell the oldest watcher; wait until it has popped before probing again. False
        when no poll watches (a lingering probe): probing again would only hear the same
        message again."""
        self._drop_expired(state, asyncio.get_running_loop().time())
        if not state.watchers:
            return False
        watch = state.watchers.popleft()
        watch.state = WatchState.NOTIFIED
        state.consumed.clear()
        watch.on_has_msg(broker)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.consumed.wait(), self.broker_timeout_s)
        return True

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
                state.last_watched = now  # its poll ends now (probe linger)
        state.watchers = live

    def _report(self, broker: str, outcome: str) -> None:
        if self.on_result is not None:
            self.on_result(broker, outcome)
