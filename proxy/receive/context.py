"""One client long poll in progress: its request, brokers, clock and broker calls.

Every mode works through a ``PollContext``: it counts the broker requests the poll makes,
knows how much time is left, and makes sure a pop that answers after the poll stopped
waiting (client gone, deadline passed) has its messages handed back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from proxy.brokers import BrokerPool, BrokerRoute, TopicRoute
from proxy.processor.consumer import Popped
from proxy.receive.timeline import Timeline
from proxy.receive.types import PolledMessage, ReceiveRequest
from proxy.remoting.answers import PopResult, refuses_filter
from proxy.remoting.client import RemotingError

log = logging.getLogger(__name__)

HandBack = Callable[[list[Popped], str], None]


class PollContext:
    def __init__(
        self,
        request: ReceiveRequest,
        route: TopicRoute,
        pool: BrokerPool,
        hand_back: HandBack,
        first_broker_index: int,
        broker_timeout_s: float,
    ) -> None:
        self.request = request
        # Set when the proxy shuts down: every wait ends at once and the poll answers.
        self.stopped = False
        self.brokers: list[BrokerRoute] = route.readable
        if request.named_broker_only and request.broker_hint:
            named = [b for b in self.brokers if b.name == request.broker_hint]
            self.brokers = named or self.brokers
        self.pool = pool
        self.hand_back = hand_back
        self.broker_timeout_s = broker_timeout_s
        self.loop = asyncio.get_running_loop()
        self.pops = 0
        self.probes = 0  # NOTIFICATION requests sent for this poll
        self.short_polling_hit = False
        self.polling_full = False  # a broker refused to park a pop: it holds too many
        # Told once whether the first pop found messages, as soon as that is known (the
        # adaptive switch's evidence); see ``first_pop_done``.
        self.on_first_pop: Callable[[bool], None] | None = None
        self._first_index = first_broker_index
        # Stages with their times, when the timeline debug log is on (``timeline.py``).
        self.timeline: Timeline | None = Timeline.wanted()
        # One plain future at a time carries every wait of the poll; an idle poll is held
        # by thousands, so no task, queue or event per poll. It ends with True when a
        # broker said hasMsg (``wait_has_msg``), with None on time-out or stop.
        self._waiter: asyncio.Future[bool | None] | None = None
        self._watching = False  # in wait_has_msg: has_msg() ends the wait

    # -- time -----------------------------------------------------------------------------

    @property
    def remaining_s(self) -> float:
        if self.stopped:
            return 0.0
        return max(self.request.answer_by - self.loop.time(), 0.0)

    @property
    def remaining_ms(self) -> int:
        return int(self.remaining_s * 1000)

    def stop(self) -> None:
        """End every wait of this poll now (the proxy is shutting down)."""
        self.stopped = True
        self._wake()

    def mark(self, stage: str, detail: str = "") -> None:
        """Note a stage of the poll on its timeline, when there is one."""
        if self.timeline is not None:
            self.timeline.mark(self.loop.time(), stage, detail)

    def has_msg(self, broker: str = "") -> None:
        """A broker this poll watches said it has messages (see ``wait_has_msg``)."""
        self.mark("has_msg", broker)
        if self._watching:
            self._wake(True)

    async def wait_has_msg(self) -> bool:
        """Wait for ``has_msg()`` until the deadline; False when time runs out first or the
        poll stops. The wait is the waiter future itself: the notify poll's idle state is
        this one future and its timer."""
        limit_s = self.remaining_s
        if limit_s <= 0:
            return False
        waiter = self._waiter = self.loop.create_future()
        self._watching = True
        timer = self.loop.call_later(limit_s, self._wake)
        try:
            return bool(await waiter)
        finally:
            timer.cancel()
            self._watching = False
            self._waiter = None

    async def wait_done(self, future: asyncio.Future[Any], limit_s: float) -> bool:
        """Wait until ``future`` is done, ``limit_s`` passes or the poll stops; True if done.
        The future itself is left alone (a pop goes on and hands back what it brings)."""
        if future.done() or self.stopped or limit_s <= 0:
            return future.done()
        self._waiter = self.loop.create_future()
        future.add_done_callback(self._wake)
        timer = self.loop.call_later(limit_s, self._wake)
        try:
            await self._waiter
        finally:
            timer.cancel()
            future.remove_done_callback(self._wake)
            self._waiter = None
        return future.done()

    def _wake(self, outcome: object = None) -> None:
        """End the wait in progress: ``outcome`` True from ``has_msg``; anything else (a
        timer, a stop, a future's done callback) ends it without hasMsg."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(True if outcome is True else None)

    def first_pop_done(self, hit: bool) -> None:
        """The first pop found messages (``hit``) or not; ``on_first_pop`` hears it once."""
        if hit:
            self.short_polling_hit = True
        callback, self.on_first_pop = self.on_first_pop, None
        if callback is not None:
            callback(hit)

    # -- brokers --------------------------------------------------------------------------

    def first_broker(self) -> BrokerRoute | None:
        """The broker the client named, else the next one in round-robin order."""
        if not self.brokers:
            return None
        hint = self.request.broker_hint
        for broker in self.brokers:
            if broker.name == hint:
                return broker
        return self.brokers[self._first_index % len(self.brokers)]

    def brokers_from(self, first: BrokerRoute) -> list[BrokerRoute]:
        """All brokers, in turn, starting at ``first``."""
        start = self.brokers.index(first)
        return self.brokers[start:] + self.brokers[:start]

    def broker(self, name: str) -> BrokerRoute | None:
        return next((b for b in self.brokers if b.name == name), None)

    def count_probe(self, broker: str = "") -> None:
        """A NOTIFICATION was sent on this poll's behalf (to ``broker``)."""
        self.probes += 1
        self.mark("probe", broker)

    async def pop(
        self, broker: BrokerRoute, poll_ms: int = 0, *, patient: bool = False
    ) -> list[PolledMessage]:
        """Pop from ``broker``; [] when it has nothing, is down or too slow.

        A pop is given up after ``broker_timeout_s`` past its broker-side wait, so a broker
        that hangs costs a poll no more. A ``patient`` pop waits for the answer as long as
        the poll can instead: one sent to a broker that has just answered hasMsg, which is
        up, so a slow answer is slowness, not a hang. A pop given up still brings back what
        the broker popped for it, and that is handed back, to be redelivered only when a
        real broker's revive service next scans (3-6 s after the hand-back on RocketMQ
        5.5.0, measured): a late answer delivered beats that (issue 26).

        The pop runs as its own task: if this poll stops waiting for it (cancelled, or out
        of time), whatever it still brings back is handed back at once.
        """
        client = self.pool.broker(broker.name)
        if client is None or (poll_ms > 0 and self.remaining_s <= 0):
            return []
        req = self.request
        self.pops += 1
        self.mark("pop", f"{broker.name}/{poll_ms}" if poll_ms else broker.name)

        def hand_back_result(result: PopResult, reason: str = "late") -> None:
            if result.messages:
                self.hand_back(
                    [PolledMessage(broker.name, req.group, m).popped for m in result.messages],
                    reason,
                )

        # A pop without broker-side wait may use its own timeout even on a short poll.
        limit = self.remaining_s if poll_ms else max(self.remaining_s, self.broker_timeout_s)
        timeout = poll_ms / 1000 + self.broker_timeout_s
        call = asyncio.ensure_future(
            client.pop(
                req.group,
                req.topic,
                max_nums=req.batch_size,
                invisible_ms=req.invisible_ms,
                poll_ms=poll_ms,
                expression=req.expression,
                expression_type=req.expression_type,
                order=req.fifo,
                attempt_id=req.attempt_id,
                timeout=max(timeout, limit) if patient else timeout,
                on_late=hand_back_result,
            )
        )
        try:
            finished = await self.wait_done(call, limit)
        except asyncio.CancelledError:
            call.add_done_callback(lambda c: _hand_back_done(c, hand_back_result, "cancelled"))
            raise
        if not finished:  # out of time, or stopping: the pop hands back what it brings
            self.mark("pop_abandoned", broker.name)
            call.add_done_callback(lambda c: _hand_back_done(c, hand_back_result, "deadline"))
            return []
        try:
            result = call.result()
        except RemotingError as exc:
            if refuses_filter(exc):
                raise
            log.info("pop from %s failed: %s", broker.name, exc)
            self.mark("pop_failed", broker.name)
            return []
        if result.polling_full:
            self.polling_full = True
        self.mark("popped", f"{broker.name}/{len(result.messages)}")
        return [PolledMessage(broker.name, req.group, m) for m in result.messages]


def _hand_back_done(
    call: asyncio.Future[PopResult], hand_back: Callable[[PopResult, str], None], reason: str
) -> None:
    if call.cancelled() or call.exception() is not None:
        return
    hand_back(call.result(), reason)
