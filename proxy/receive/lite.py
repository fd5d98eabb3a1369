"""A lite consumer's long poll (RocketMQ 5.5 lite topics): POP_LITE_MESSAGE on every broker.

A lite group's messages wait in per-lite-topic queues, and each broker queues an event for
the *client* (by client id) when a lite topic it subscribed gets a message; a lite pop takes
the client's events. NOTIFICATION knows nothing of this (it looks at the parent topic's
queues, which lite pops never move, so it says ``hasMsg`` for ever), so pop-with-notify has
no probe to park. What the broker offers instead is its own long polling of a lite pop,
parked under the client id and woken by an event for that client: the poll is served with
that, on every broker at once:

1. **Instant pops.** A lite pop without broker-side wait to every broker that serves the
   parent topic, together. Messages: they are the answer (at most the batch size; the rest
   are handed back). A poll of one broker skips this step: its parked pop answers at once
   when there are messages, one request as from the Apache proxy.
2. **Parked pops.** Otherwise one lite pop per broker parked for the time left. The first
   that brings messages answers the poll; the others go on parked on their brokers until
   their time is up (remoting cannot take a parked request back).
3. **Late pops pass on.** A broker wakes the *oldest* parked lite pop of a client first
   (PopLiteLongPollingService, notifyLast false), so the client's next message on a broker
   where the last poll left its pop wakes that stale pop, not the client's live poll. What a
   stale pop brings goes to a poll of the same client, group and topic parked in this proxy
   now, if there is one: it answers that poll at the message's first attempt. Only without
   such a poll is it handed back at once (and comes again, one attempt later, when the broker
   revives it: seconds).

A push consumer's poll (``named_broker_only``) watches only the broker it names, as the
Apache proxy serves every lite push poll: the client polls each broker itself, and a pop it
left parked on another broker would stay there after the poll answered, where the broker
may wake it, not the client's live poll, for the client's next message (measured: 1-3 s
late, the message handed back and popped again). A LiteSimpleConsumer polls one request at
a time, naming the first broker always: its polls watch every broker, and step 3 serves its
next poll with what the last one's pops bring late. The proxy keeps no messages: the brokers
hold the subscriptions and events per client id, and a late pop with no live poll to take it
is handed back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from proxy.brokers import BrokerPool
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.types import PolledMessage, ReceiveRequest, ReceiveResult
from proxy.remoting.answers import PopResult
from proxy.remoting.client import RemotingError

log = logging.getLogger(__name__)

# A parked pass shorter than this is not worth the requests: answer empty.
MIN_PARK_MS = 100


class LiteReceiver:
    def __init__(
        self,
        pool: BrokerPool,
        consumer: ConsumerProcessor,
        broker_timeout_s: float,
    ) -> None:
        self.pool = pool
        self.consumer = consumer
        self.broker_timeout_s = broker_timeout_s
        # (client id, group, parent topic) -> the inboxes of that client's parked polls,
        # oldest first: where a pop that answers after its own poll ended passes its messages.
        self._parked: dict[tuple[str, str, str], list[asyncio.Future[list[PolledMessage]]]] = {}

    async def receive(self, req: ReceiveRequest, client_id: str) -> ReceiveResult:
        """Serve one lite poll of ``client_id``. Raises TopicNotFound or RemotingError when
        the parent topic has no route."""
        route = await self.pool.route(req.topic)
        brokers = [b.name for b in route.readable]
        if req.named_broker_only and req.broker_hint in brokers:
            brokers = [req.broker_hint]
        loop = asyncio.get_running_loop()
        key = (client_id, req.group, req.topic)
        pops = 0
        if len(brokers) > 1:
            pops += len(brokers)
            found = await self._first(
                [self._pop(name, req, client_id, 0) for name in brokers],
                loop.time() + self.broker_timeout_s,
                key,
                wait_all=True,
            )
            if found:
                return ReceiveResult(await self._deliverable(found, req), True, pops, 0)
        if not brokers:
            return ReceiveResult([], False, pops, 0)
        park_ms = int((req.answer_by - loop.time()) * 1000)
        if park_ms < MIN_PARK_MS:
            if pops:  # the instant pops were this poll's look
                return ReceiveResult([], False, pops, 0)
            park_ms = 0  # one broker, little time: its pop does not wait
        pops += len(brokers)
        # Parked: this poll also takes what an earlier poll's pops of the client bring late.
        inbox: asyncio.Future[list[PolledMessage]] = loop.create_future()
        self._parked.setdefault(key, []).append(inbox)
        try:
            found = await self._first(
                [self._pop(name, req, client_id, park_ms) for name in brokers] + [inbox],
                req.answer_by,
                key,
                wait_all=False,
            )
        finally:
            waiting = self._parked[key]
            waiting.remove(inbox)
            if not waiting:
                del self._parked[key]
        return ReceiveResult(await self._deliverable(found, req), False, pops, 0)

    def _pop(
        self, broker: str, req: ReceiveRequest, client_id: str, poll_ms: int
    ) -> asyncio.Future[list[PolledMessage]]:
        """One lite pop as its own task. What it brings after the remoting deadline
        (``on_late``) passes on like any pop that answers after its poll stopped waiting."""
        key = (client_id, req.group, req.topic)

        def polled(broker: str, result: PopResult) -> list[PolledMessage]:
            return [PolledMessage(broker, req.group, m, lite=True) for m in result.messages]

        async def call() -> list[PolledMessage]:
            client = self.pool.broker(broker)
            if client is None:
                return []
            try:
                result = await client.pop_lite(
                    client_id,
                    req.group,
                    req.topic,
                    max_nums=req.batch_size,
                    invisible_ms=req.invisible_ms,
                    poll_ms=poll_ms,
                    attempt_id=req.attempt_id,
                    timeout=poll_ms / 1000 + self.broker_timeout_s,
                    on_late=lambda late: self._pass_on(key, polled(broker, late), "late"),
                )
            except RemotingError as exc:
                log.info("lite pop from %s failed: %s", broker, exc)
                return []
            return polled(broker, result)

        return asyncio.ensure_future(call())

    async def _first(
        self,
        calls: list[asyncio.Future[list[PolledMessage]]],
        deadline: float,
        key: tuple[str, str, str],
        *,
        wait_all: bool,
    ) -> list[PolledMessage]:
        """Messages of the calls: of all of them (``wait_all``), else of the first that
        brings any; by ``deadline``. Calls not waited for pass on what they bring."""
        loop = asyncio.get_running_loop()
        found: list[PolledMessage] = []
        pending = set(calls)
        reason = "deadline"
        try:
            while pending and (wait_all or not found):
                left = deadline - loop.time()
                if left <= 0:
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                for call in done:
                    found.extend(call.result())
        except asyncio.CancelledError:
            self._hand_back(found, "cancelled")
            reason = "cancelled"
            raise
        finally:
            for call in pending:
                call.add_done_callback(self._pass_on_call(key, reason))
        return found

    async def _deliverable(
        self, found: list[PolledMessage], req: ReceiveRequest
    ) -> list[PolledMessage]:
        """At most the batch size (the rest go back at once), less messages past their last
        attempt, which go to the dead-letter queue (as the engine does for every poll)."""
        self._hand_back(found[req.batch_size :], "over_batch")
        fit = found[: req.batch_size]
        deliver = await self.consumer.divert_exhausted(
            [(m.popped, m.message.reconsume_times) for m in fit], req.max_attempts
        )
        return [m for m, keep in zip(fit, deliver, strict=True) if keep]

    def _pass_on(
        self, key: tuple[str, str, str], messages: list[PolledMessage], reason: str
    ) -> None:
        """Messages a pop brought after its poll stopped waiting: to the oldest parked poll
        of the same client, group and topic in this proxy, else handed back (``reason``)."""
        if not messages:
            return
        for inbox in self._parked.get(key, ()):
            if not inbox.done():
                inbox.set_result(messages)
                log.debug("late lite pop of %s passed on to its next poll", key[0])
                return
        self._hand_back(messages, reason)

    def _pass_on_call(
        self, key: tuple[str, str, str], reason: str
    ) -> Callable[[asyncio.Future[list[PolledMessage]]], None]:
        def done(call: asyncio.Future[list[PolledMessage]]) -> None:
            if not call.cancelled() and call.exception() is None:
                self._pass_on(key, call.result(), reason)

        return done

    def _hand_back(self, messages: list[PolledMessage], reason: str) -> None:
        self.consumer.hand_back([m.popped for m in messages], reason)
