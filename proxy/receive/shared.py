"""The shared probe hub: this proxy's ``ProbeHub``, with the keys another proxy of the fleet
owns probed by that owner (``proxy/fleet``).

A poll watches (broker, group, topic) keys as with the local hub; ``notify.py`` does not
know the difference. For a (group, topic) whose owner (``members.owner_of``) is another
proxy:

1. **Subscribe.** The first poll of the key sends the owner one WATCH naming every broker
   it watches, for a lease (``LEASE_S``) or the poll's deadline, whichever is later. Polls
   that follow send nothing while the lease covers them.
2. **Probe once.** The owner keeps, per broker, one watch in its own hub standing in for
   every subscribed proxy, beside its own polls. A broker holds one NOTIFICATION for the
   key whichever proxies wait on it, and the owner answers WATCHING.
3. **Wake one.** When a broker says hasMsg and the hub picks the stand-in, the owner sends
   WAKE to the subscriber that waited longest (then puts it last). That proxy hands the
   wake to its oldest poll of the key, which pops the broker itself: one message wakes one
   poll, fleet-wide. A subscriber with no poll waiting answers UNWATCH, and the owner
   wakes the next.
4. **Done.** The woken poll's pop over, the subscriber sends DONE (and whether it found
   nothing), and the owner's hub probes that broker again.
5. **Leave.** ``LINGER_S`` after its last poll of the key ended, the subscriber sends
   UNWATCH (a consumer polls again at once, so this saves a WATCH per poll).

**Fallback.** A key whose owner has not answered WATCHING within ``fallback_s``, whose
link goes down, or whose owner changes, is watched by this proxy's own hub, as without
sharing, for as long as polls of it wait here; the polls after them ask the owner again.
So a dead, slow or partitioned owner costs at most ``fallback_s`` of not hearing a broker,
and no poll waits past its own deadline.

Nothing here holds a message or a receipt handle: a WAKE is a hint, and every delivery
goes through the woken proxy's own pop and its client's ack. A lost hint costs time, at
most until the poll's deadline, never a message.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.fleet.links import PeerLinks
from proxy.fleet.members import owner_of
from proxy.fleet.messages import PeerKind, PeerMessage
from proxy.receive.probes import ProbeHub, ProbeKey, Watch, WatchState

log = logging.getLogger(__name__)

Pair = tuple[str, str]  # group, topic

# How long a subscriber waits for its owner's WATCHING before it probes the key itself:
# about one probe slice, so an owner that is gone costs no more than the cap's rotation.
DEFAULT_FALLBACK_S = 1.0
# A WATCH asks for this long at least (polls wait up to 20 s), so a key with a poll always
# waiting is subscribed again every LEASE_S - 20 s, not at every poll.
LEASE_S = 60.0
# A subscription with no poll left waits this long for the next one before UNWATCH.
LINGER_S = 2.0
# A WAKE for a broker none of the waiting polls watches right now (each pauses up to 0.4 s
# after an empty pop there, notify.MISS_BACKOFF_S) is held this long for the next poll
# that does, then handed back with DONE. Handing it back at once would have the owner probe
# again, hear the same message, and wake this proxy again, as fast as the network goes.
HOLD_S = 0.5
MAX_OWNERS_CACHED = 200_000  # keys whose owner is remembered (about 40 MB at most)


@dataclass(eq=False, slots=True)
class SharedWatch(Watch):
    """A poll's watch of a key another proxy owns; ``local``: the hub's own watch that
    replaced it after a fallback."""

    order: bool = False
    local: Watch | None = None


@dataclass(eq=False, slots=True)
class _Subscription:
    """This proxy's polls of one (group, topic) that its owner probes for it."""

    owner: str
    order: bool
    waiting: dict[str, deque[SharedWatch]] = field(default_factory=dict)  # by broker
    woken: dict[str, SharedWatch] = field(default_factory=dict)  # by broker; popping now
    brokers_sent: frozenset[str] = frozenset()
    watched_until: float = 0.0  # loop time the owner watches for us until
    fallen_back: bool = False  # its polls watch the local hub
    flush: asyncio.Handle | None = None  # a WATCH to send at the end of this loop turn
    no_answer: asyncio.TimerHandle | None = None  # the fallback, until WATCHING arrives
    linger: asyncio.TimerHandle | None = None  # UNWATCH, unless a poll comes first
    held: dict[str, asyncio.TimerHandle] = field(default_factory=dict)  # WAKEs, by broker

    def idle(self) -> bool:
        return not self.woken and not any(self.waiting.values())

    def cancel_timers(self) -> None:
        for timer in (self.flush, self.no_answer, self.linger, *self.held.values()):
            if timer is not None:
                timer.cancel()
        self.flush = self.no_answer = self.linger = None
        self.held.clear()


@dataclass(eq=False, slots=True)
class _Served:
    """Other proxies' polls of one (group, topic) that this proxy, its owner, probes for."""

    order: bool
    peers: dict[str, float] = field(default_factory=dict)  # until when; oldest waiter first
    stand_ins: dict[str, Watch] = field(default_factory=dict)  # by broker
    woken: dict[str, str] = field(default_factory=dict)  # broker -> peer, until its DONE


class SharedProbeHub:
    """The ``Prober`` a notify poll uses (``probes.py``), over a local hub and peer links."""

    def __init__(
        self, local: ProbeHub, links: PeerLinks, *, fallback_s: float = DEFAULT_FALLBACK_S
    ) -> None:
        self.local = local
        self.links = links
        self.fallback_s = fallback_s
        self._subscriptions: dict[Pair, _Subscription] = {}
        self._served: dict[Pair, _Served] = {}
        self._sweep_at = 1024
        self._lookups: set[asyncio.Future[None]] = set()  # routes a WATCH needs
        # Each key's owner, until the members change: a poll watches every broker, and
        # hashing the key with each of 100 members per watch would cost more than the rest.
        self._owners: dict[Pair, str] = {}
        self.sent: Counter[PeerKind] = Counter()
        self.fallbacks = 0

    # -- what a poll calls ----------------------------------------------------------------

    @property
    def probes_in_flight(self) -> int:
        return self.local.probes_in_flight

    @property
    def watchers(self) -> int:
        subscribed = sum(len(q) for s in self._subscriptions.values() for q in s.waiting.values())
        return self.local.watchers + subscribed

    @property
    def probes_sent(self) -> int:
        return self.local.probes_sent

    def parked(self, key: ProbeKey) -> bool:
        """What this proxy's own probes know: a key another proxy probes is never taken as
        parked, so its polls always make their first pop."""
        return self.local.parked(key)

    def watch(
        self,
        key: ProbeKey,
        deadline: float,
        on_has_msg: Callable[[str], None],
        on_probe_sent: Callable[[str], None],
        *,
        order: bool = False,
    ) -> Watch:
        broker, group, topic = key
        pair = (group, topic)
        subscription = self._subscriptions.get(pair)
        if subscription is not None and subscription.fallen_back:
            return self.local.watch(key, deadline, on_has_msg, on_probe_sent, order=order)
        owner = self._owner(pair)
        if subscription is not None and subscription.owner != owner:
            self._fall_back(pair, subscription, "owner changed")
            return self.local.watch(key, deadline, on_has_msg, on_probe_sent, order=order)
        if owner == self.links.self_id:
            return self.local.watch(key, deadline, on_has_msg, on_probe_sent, order=order)
        if subscription is None:
            subscription = self._subscriptions[pair] = _Subscription(owner, order)
        watch = SharedWatch(key, deadline, on_has_msg, on_probe_sent, order=order)
        if subscription.linger is not None:
            subscription.linger.cancel()
            subscription.linger = None
        held = subscription.held.pop(broker, None)
        if held is not None:  # a WAKE waited for a poll of this broker: this one
            held.cancel()
            watch.state = WatchState.NOTIFIED
            subscription.woken[broker] = watch
            asyncio.get_running_loop().call_soon(on_has_msg, broker)
            return watch
        subscription.waiting.setdefault(broker, deque()).append(watch)
        stale = broker not in subscription.brokers_sent or deadline > subscription.watched_until
        if stale and subscription.flush is None:
            # Once per loop turn: a poll watches all its brokers in one go.
            subscription.flush = asyncio.get_running_loop().call_soon(
                self._subscribe, pair, subscription
            )
        return watch

    def release(self, watch: Watch, *, missed: bool = False) -> None:
        if not isinstance(watch, SharedWatch):
            self.local.release(watch, missed=missed)
            return
        if watch.local is not None:
            self.local.release(watch.local, missed=missed)
        state, watch.state = watch.state, WatchState.RELEASED
        broker, group, topic = watch.key
        pair = (group, topic)
        subscription = self._subscriptions.get(pair)
        if subscription is None or state is WatchState.RELEASED:
            return
        if state is WatchState.WATCHING:
            queue = subscription.waiting.get(broker)
            if queue is not None and watch in queue:
                queue.remove(watch)
        elif subscription.woken.get(broker) is watch:  # NOTIFIED: its pop is over
            del subscription.woken[broker]
            if not subscription.fallen_back:
                self._send(subscription.owner, PeerKind.DONE, pair, (broker,), missed=missed)
        self._when_idle(pair, subscription)

    async def close(self) -> None:
        for task in list(self._lookups):
            task.cancel()
        await asyncio.gather(*self._lookups, return_exceptions=True)
        for subscription in self._subscriptions.values():
            subscription.cancel_timers()
        self._subscriptions.clear()
        self._served.clear()
        await self.local.close()

    # -- what the links call --------------------------------------------------------------

    def receive(self, peer: str, message: PeerMessage) -> None:
        """A message from ``peer``."""
        kind, pair = message.kind, (message.group, message.topic)
        if kind is PeerKind.WATCH:
            self._serve(peer, pair, message)
            self._send(peer, PeerKind.WATCHING, pair)
        elif kind is PeerKind.DONE:
            self._done(peer, pair, message.broker, message.missed)
        elif kind is PeerKind.UNWATCH:
            self._unwatch(peer, pair)
        elif kind is PeerKind.WATCHING:
            subscription = self._subscriptions.get(pair)
            if subscription is not None and subscription.owner == peer and subscription.no_answer:
                subscription.no_answer.cancel()
                subscription.no_answer = None
        elif kind is PeerKind.WAKE:
            self._woken(peer, pair, message.broker)

    def peer_lost(self, peer: str) -> None:
        """The link to ``peer`` broke: what it subscribed to here goes, and what it probed
        for this proxy is probed here until the polls waiting on it end."""
        for pair in [p for p, s in self._served.items() if peer in s.peers]:
            self._unwatch(peer, pair)
        for pair, subscription in list(self._subscriptions.items()):
            if subscription.owner == peer:
                self._fall_back(pair, subscription, "link lost")

    def members_changed(self) -> None:
        """Keys whose owner changed are probed here until their polls end; the polls after
        them subscribe at the new owner."""
        self._owners.clear()
        for pair, subscription in list(self._subscriptions.items()):
            if self._owner(pair) != subscription.owner:
                self._fall_back(pair, subscription, "owner changed")

    # -- subscriber side ------------------------------------------------------------------

    def _owner(self, pair: Pair) -> str:
        owner = self._owners.get(pair)
        if owner is None:
            if len(self._owners) >= MAX_OWNERS_CACHED:
                self._owners.clear()
            owner = self._owners[pair] = owner_of(self.links.members(), *pair)
        return owner

    def _subscribe(self, pair: Pair, subscription: _Subscription) -> None:
        subscription.flush = None
        if self._subscriptions.get(pair) is not subscription or subscription.fallen_back:
            return
        now = self._now()
        brokers = subscription.brokers_sent | {b for b, q in subscription.waiting.items() if q}
        longest = max((w.deadline for q in subscription.waiting.values() for w in q), default=now)
        until = max(now + LEASE_S, longest)
        if not self._send(
            subscription.owner, PeerKind.WATCH, pair, tuple(sorted(brokers)), until - now,
            order=subscription.order,
        ):  # fmt: skip
            self._fall_back(pair, subscription, "link down")
            return
        subscription.brokers_sent = frozenset(brokers)
        subscription.watched_until = until
        if subscription.no_answer is None:
            subscription.no_answer = asyncio.get_running_loop().call_later(
                self.fallback_s, self._fall_back, pair, subscription, "no answer"
            )

    def _woken(self, owner: str, pair: Pair, broker: str) -> None:
        subscription = self._subscriptions.get(pair)
        if subscription is None or subscription.fallen_back or subscription.owner != owner:
            self._send(owner, PeerKind.UNWATCH, pair)  # not ours: the owner wakes another
            return
        now = self._now()
        queue = subscription.waiting.get(broker, deque())
        while queue:
            watch = queue.popleft()
            if watch.deadline > now and watch.state is WatchState.WATCHING:
                watch.state = WatchState.NOTIFIED
                subscription.woken[broker] = watch
                watch.on_has_msg(broker)
                return
        if not subscription.idle():
            # Polls wait here, none on that broker now (each pauses after an empty pop
            # there): held for the next one that watches it (``HOLD_S``).
            if broker not in subscription.held:
                subscription.held[broker] = asyncio.get_running_loop().call_later(
                    HOLD_S, self._hand_back, pair, subscription, broker
                )
            return
        # No poll here at all: leave, so the owner wakes another proxy now; the next poll
        # here subscribes again.
        self._send(owner, PeerKind.UNWATCH, pair)
        subscription.brokers_sent = frozenset()
        subscription.watched_until = 0.0
        self._when_idle(pair, subscription)

    def _hand_back(self, pair: Pair, subscription: _Subscription, broker: str) -> None:
        """No poll took a held WAKE: the owner probes that broker again for the others."""
        subscription.held.pop(broker, None)
        if self._subscriptions.get(pair) is subscription and not subscription.fallen_back:
            self._send(subscription.owner, PeerKind.DONE, pair, (broker,))

    def _when_idle(self, pair: Pair, subscription: _Subscription) -> None:
        """Forget a subscription with no poll left: at once after a fallback (the next poll
        asks the owner again), else after LINGER_S, with an UNWATCH."""
        if not subscription.idle() or self._subscriptions.get(pair) is not subscription:
            return
        if subscription.fallen_back or not subscription.brokers_sent:
            self._forget(pair, subscription)
        elif subscription.linger is None:
            subscription.linger = asyncio.get_running_loop().call_later(
                LINGER_S, self._leave, pair, subscription
            )

    def _leave(self, pair: Pair, subscription: _Subscription) -> None:
        subscription.linger = None
        if subscription.idle() and self._subscriptions.get(pair) is subscription:
            self._send(subscription.owner, PeerKind.UNWATCH, pair)
            self._forget(pair, subscription)

    def _forget(self, pair: Pair, subscription: _Subscription) -> None:
        subscription.cancel_timers()
        if self._subscriptions.get(pair) is subscription:
            del self._subscriptions[pair]

    def _fall_back(self, pair: Pair, subscription: _Subscription, why: str) -> None:
        """Watch the key in the local hub for every poll of it still waiting here."""
        if subscription.fallen_back or self._subscriptions.get(pair) is not subscription:
            return
        log.info("probing %s here: %s (owner %s)", pair, why, subscription.owner)
        self.fallbacks += 1
        subscription.fallen_back = True
        subscription.cancel_timers()
        if subscription.brokers_sent:
            self._send(subscription.owner, PeerKind.UNWATCH, pair)
        for queue in subscription.waiting.values():
            for watch in queue:
                watch.local = self.local.watch(
                    watch.key, watch.deadline, watch.on_has_msg, watch.on_probe_sent,
                    order=watch.order,
                )  # fmt: skip
        self._when_idle(pair, subscription)

    # -- owner side -----------------------------------------------------------------------

    def _serve(self, peer: str, pair: Pair, message: PeerMessage) -> None:
        """Watch the brokers of ``message`` for ``peer`` until its lease ends."""
        if len(self._served) >= self._sweep_at:
            self._sweep()
        served = self._served.get(pair)
        if served is None:
            served = self._served[pair] = _Served(message.order)
        until = self._now() + message.remaining_s
        served.peers[peer] = max(served.peers.get(peer, 0.0), until)  # keeps its place
        unknown = [b for b in message.brokers if self.local.pool.broker(b) is None]
        for broker in message.brokers:
            if broker not in unknown:
                self._stand_in(pair, served, broker)
        if unknown:
            # No poll of this proxy has needed the topic's route yet: look it up first.
            task = asyncio.ensure_future(self._stand_in_when_known(pair, unknown))
            self._lookups.add(task)
            task.add_done_callback(self._lookup_done)

    async def _stand_in_when_known(self, pair: Pair, brokers: list[str]) -> None:
        for broker in brokers:
            await self.local.pool.broker_by_name(broker, pair[1])
            served = self._served.get(pair)
            if served is not None and self.local.pool.broker(broker) is not None:
                self._stand_in(pair, served, broker)

    def _lookup_done(self, task: asyncio.Future[None]) -> None:
        self._lookups.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("route look-up for a peer failed", exc_info=task.exception())

    def _stand_in(self, pair: Pair, served: _Served, broker: str) -> None:
        """One watch of (broker, pair) in the local hub for all the peers; extended, not
        doubled, when it exists; none while a woken peer pops that broker."""
        until = max(served.peers.values(), default=0.0)
        current = served.stand_ins.get(broker)
        if current is not None and current.state is not WatchState.RELEASED:
            current.deadline = max(current.deadline, until)  # the hub reads it each turn
            return
        if broker in served.woken or until <= self._now():
            return
        wake = functools.partial(self._wake, pair)
        served.stand_ins[broker] = self.local.watch(
            (broker, pair[0], pair[1]), until, wake, _nothing, order=served.order
        )

    def _wake(self, pair: Pair, broker: str) -> None:
        """The local hub says ``broker`` has a message and picked the peers' stand-in: wake
        the peer that has waited longest, and put it last."""
        served = self._served.get(pair)
        if served is None:
            return
        now = self._now()
        for peer, until in list(served.peers.items()):
            del served.peers[peer]
            if until > now and self._send(peer, PeerKind.WAKE, pair, (broker,)):
                served.peers[peer] = until
                served.woken[broker] = peer
                return
        # Nobody to tell: the hub probes again for its own polls at once.
        self._release_stand_in(served, broker)
        self._drop_if_idle(pair, served)

    def _done(self, peer: str, pair: Pair, broker: str, missed: bool) -> None:
        served = self._served.get(pair)
        if served is None or served.woken.get(broker) != peer:
            return
        del served.woken[broker]
        self._release_stand_in(served, broker, missed=missed)
        self._stand_in(pair, served, broker)
        self._drop_if_idle(pair, served)

    def _unwatch(self, peer: str, pair: Pair) -> None:
        served = self._served.get(pair)
        if served is None:
            return
        served.peers.pop(peer, None)
        for broker in [b for b, p in served.woken.items() if p == peer]:
            del served.woken[broker]
            self._release_stand_in(served, broker)
            self._stand_in(pair, served, broker)
        self._drop_if_idle(pair, served)

    def _release_stand_in(self, served: _Served, broker: str, *, missed: bool = False) -> None:
        stand_in = served.stand_ins.pop(broker, None)
        if stand_in is not None:
            self.local.release(stand_in, missed=missed)

    def _drop_if_idle(self, pair: Pair, served: _Served) -> None:
        now = self._now()
        for peer in [p for p, until in served.peers.items() if until <= now]:
            del served.peers[peer]
        if served.peers or served.woken:
            return
        for broker in list(served.stand_ins):
            self._release_stand_in(served, broker)
        if self._served.get(pair) is served:
            del self._served[pair]

    def _sweep(self) -> None:
        """Forget keys whose every lease has run out (nothing else tells): amortised, once
        the table has doubled since the last sweep."""
        for pair, served in list(self._served.items()):
            self._drop_if_idle(pair, served)
        self._sweep_at = max(2 * len(self._served), 1024)

    # -- helpers --------------------------------------------------------------------------

    def _send(
        self,
        peer: str,
        kind: PeerKind,
        pair: Pair,
        brokers: tuple[str, ...] = (),
        remaining_s: float = 0.0,
        *,
        order: bool = False,
        missed: bool = False,
    ) -> bool:
        group, topic = pair
        message = PeerMessage(kind, group, topic, brokers, max(remaining_s, 0.0), order, missed)
        sent = self.links.send(peer, message)
        if sent:
            self.sent[kind] += 1
        return sent

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()


def _nothing(_broker: str) -> None:
    return None
