"""Pop-with-notify: the long-polling task of docs/design.md ("How one long poll is served").

1. First pop: pop (no broker-side wait) from the broker the client named, or the next in
   turn. Messages: answer at once; that is a short-polling hit. Skipped when every
   broker's probe for the (group, topic) is already parked: none of them has anything.
2. Notify: watch every broker serving the topic; the probe hub sends the NOTIFICATION
   probes and puts each broker that answers ``hasMsg`` into this poll's result queue.
3. Consume: take a broker from the queue and pop from it. Messages: done. Empty: probe that
   broker again while time remains, at once after its first empty pop (another consumer got
   there first), after a growing pause after further ones (see ``MISS_BACKOFF_S``). The loop
   below is the one consumption step of the task, so at most one pop runs at a time.
4. End: messages, or the deadline; release every watch so nothing is left behind.
"""

from __future__ import annotations

import asyncio
import functools

from proxy.receive.context import PollContext
from proxy.receive.misses import MissMemory
from proxy.receive.probes import Prober, Watch
from proxy.receive.types import PolledMessage
from proxy.remoting.filter import ExpressionType

# Pause before probing a broker again after its n-th empty pop in one poll (n = 1, 2, ...),
# the last value repeating. The probes carry no filter (a 5.5.0 broker cannot apply a SQL92
# one to a NOTIFICATION): hasMsg is true for any message past the group's offset, and every
# arriving message wakes a parked probe. With a filter that drops most messages, probing again at
# once after each empty pop costs a notification and a pop per *arriving* message (10 per
# delivered message at 90 % filtered, measured on RocketMQ 5.5.0). Pausing lets the
# arrivals of the pause share one probe and one pop, so a poll makes at most about one pop
# per broker per 0.4 s however many filtered messages arrive; a matching message waits at
# most that long more. Polls without misses (no filter, or a filter that matches) never
# pause. The count of empty pops carries over to the next poll of the same subscription
# (``misses.MissMemory``), or each poll would start again without a pause.
MISS_BACKOFF_S = (0.0, 0.05, 0.1, 0.2, 0.4)


def _nothing_new(ctx: PollContext, hub: Prober) -> bool:
    """Whether every broker of the poll has a probe for its (group, topic) parked: then no
    broker has anything the first pop could find (``ProbeHub.parked``), and the poll goes
    straight to watching. A message that lands in between wakes the parked probe; one that
    landed before a probe was sent made that probe answer at once, so it is not parked.
    Not for FIFO groups, whose probes leave out queues blocked by messages in flight. Not
    for SQL92 subscriptions either: only a broker parses them, and a poll with one it
    refuses must hear so now, not when a message arrives (an idle SQL92 consumer's poll
    costs a pop more)."""
    req = ctx.request
    if req.fifo or req.expression_type is not ExpressionType.TAG:
        return False
    return all(hub.parked((b.name, req.group, req.topic)) for b in ctx.brokers)


class NotifyPoll:
    """One poll in notify mode: ``run`` is the task above, steps 1 to 4. Its state is these
    slots rather than a coroutine's closures: an idle poll is held by thousands, and the
    hub's callbacks are made once.

    Nothing the poll holds holds the poll: its watches keep its callbacks, so a callback
    bound to the poll (``self._has_msg``) made each poll a reference cycle, with its
    context, request and watches. Reference counting never frees a cycle; the proxy's full
    collection does, only every ``gc_full_collection_s`` (``proxy/collector.py``, 10
    minutes), and until then every poll that ended stayed: 1.4-1.7 KB per poll, about
    0.5 GB per 10 minutes at 500 polls a second (issue 58). So the hasMsg callback holds the result
    queue and the context, not the poll. (A re-watch timer's callback is bound to the poll
    while it waits; the poll's end cancels it, which drops the callback.)"""

    __slots__ = (
        "active",
        "ctx",
        "hub",
        "max_probes",
        "misses",
        "on_has_msg",
        "on_probe_sent",
        "pauses",
        "ready",
        "watches",
    )

    def __init__(self, ctx: PollContext, hub: Prober, misses: MissMemory, max_probes: int):
        self.ctx = ctx
        self.hub = hub
        self.misses = misses
        self.max_probes = max_probes
        self.ready: list[str] = []  # the result queue: brokers that said hasMsg (a few)
        self.watches: dict[str, Watch] = {}
        self.pauses: dict[str, asyncio.TimerHandle] | None = None  # made at the first pause
        self.active = True
        self.on_has_msg = functools.partial(_heard, self.ready, ctx)
        self.on_probe_sent = ctx.count_probe

    async def run(self) -> list[PolledMessage]:
        ctx, hub = self.ctx, self.hub
        first = ctx.first_broker()
        if first is None:
            return []
        req = ctx.request
        if _nothing_new(ctx, hub):
            ctx.mark("first_pop_skipped")
            ctx.first_pop_done(False)
        else:
            messages = await ctx.pop(first)
            ctx.first_pop_done(bool(messages))
            if messages:
                return messages
        if ctx.remaining_s <= 0:
            return []
        ready = self.ready
        try:
            for broker in ctx.brokers:
                self._watch(broker.name)
            while True:
                if not ready and not await ctx.wait_has_msg():
                    return []  # the deadline: answer empty
                if not ready:
                    continue
                broker_name = ready.pop(0)
                route = ctx.broker(broker_name)
                # Patient: the broker has just said hasMsg, so it is up (ctx.pop).
                messages = await ctx.pop(route, patient=True) if route is not None else []
                hub.release(self.watches[broker_name], missed=not messages)
                miss_key = (broker_name, req.group, req.topic, req.expression)
                if messages:
                    self.misses.hit(miss_key, ctx.loop.time())
                    return messages
                missed = self.misses.miss(miss_key, ctx.loop.time())
                if ctx.probes < self.max_probes and ctx.remaining_s > 0:
                    pause = MISS_BACKOFF_S[min(missed, len(MISS_BACKOFF_S)) - 1]
                    if pause <= 0:
                        self._watch(broker_name)
                    elif pause < ctx.remaining_s:
                        if self.pauses is None:
                            self.pauses = {}
                        self.pauses[broker_name] = ctx.loop.call_later(
                            pause, self._watch_again, broker_name
                        )
        finally:
            self.active = False
            for timer in (self.pauses or {}).values():
                timer.cancel()
            for w in self.watches.values():
                hub.release(w)

    def _watch(self, broker: str) -> None:
        ctx = self.ctx
        req = ctx.request
        ctx.mark("watch", broker)
        self.watches[broker] = self.hub.watch(
            (broker, req.group, req.topic),
            req.answer_by,
            self.on_has_msg,
            self.on_probe_sent,
            order=req.fifo,
        )

    def _watch_again(self, broker: str) -> None:
        """A pause after an empty pop ended: watch the broker again, if still polling."""
        if self.pauses is not None:
            self.pauses.pop(broker, None)
        if self.active:
            self._watch(broker)


def _heard(ready: list[str], ctx: PollContext, broker: str) -> None:
    """A poll's hasMsg callback (``NotifyPoll.on_has_msg``): ``broker`` joins the poll's
    result queue ``ready`` and wakes its wait. Not a method of the poll: see NotifyPoll."""
    ready.append(broker)
    ctx.has_msg(broker)
