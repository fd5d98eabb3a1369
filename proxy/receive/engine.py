"""The receive engine: turns a client's ReceiveMessage into a long poll in the right mode.

It picks the mode (fixed, or adaptive per group and topic), enforces the in-flight limit,
runs the poll, diverts messages past their last delivery attempt to the dead-letter queue,
hands back messages the client never got, and records metrics and an event per request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter

from proxy.brokers import BrokerPool
from proxy.config import ReceiveConfig
from proxy.receive.adaptive import COUPLED, NOTIFY, AdaptiveSwitch
from proxy.receive.context import PollContext
from proxy.receive.coupled import coupled_poll
from proxy.receive.notify import notify_poll
from proxy.receive.probes import ProbeHub
from proxy.receive.slicing import slicing_poll
from proxy.receive.types import PolledMessage, ReceiveRequest, ReceiveResult
from proxy.remoting.client import RemotingError
from proxy.remoting.message import Prop

log = logging.getLogger(__name__)

SLICING = "slicing"
POLL_MODES = (NOTIFY, COUPLED, SLICING)


class TooManyRequests(Exception):
    """The proxy already holds its maximum of long polls."""


class ReceiveEngine:
    def __init__(
        self,
        config: ReceiveConfig,
        pool: BrokerPool,
        *,
        metrics=None,
        events=None,
        proxy_id: str = "proxy",
    ) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self.events = events
        self.proxy_id = proxy_id
        self.hub = ProbeHub(
            pool,
            max_poll_ms=config.max_polling_ms,
            broker_timeout_s=config.broker_timeout_s,
            on_result=metrics.notification if metrics is not None else None,
        )
        self.switch = AdaptiveSwitch(
            config.adaptive_high_rate, config.adaptive_low_rate, config.adaptive_window_s
        )
        self.in_flight: Counter[str] = Counter()
        self._turn = itertools.count()
        self._background: set[asyncio.Task] = set()
        self.stopping = False
        self._polls: set[PollContext] = set()
        self.nacked = 0

    @property
    def in_flight_total(self) -> int:
        return sum(self.in_flight.values())

    # -- the request path -----------------------------------------------------------------

    def choose_mode(self, group: str, topic: str) -> str:
        if self.config.mode != "adaptive":
            return self.config.mode
        mode, switched = self.switch.choose(group, topic, time.monotonic())
        if switched:
            log.info("%s/%s switched to %s polling", group, topic, mode)
            if self.metrics is not None:
                self.metrics.mode_switch(group, topic, mode)
        return mode

    def current_mode(self, group: str, topic: str) -> str:
        """The mode a poll of (group, topic) would use now, without counting a request."""
        if self.config.mode != "adaptive":
            return self.config.mode
        return self.switch.current(group, topic)

    async def receive(self, req: ReceiveRequest) -> ReceiveResult:
        """Run one client poll. Raises TooManyRequests, TopicNotFound or RemotingError."""
        if self.in_flight_total >= self.config.max_in_flight:
            raise TooManyRequests(f"{self.config.max_in_flight} long polls already in flight")
        mode = self.choose_mode(req.group, req.topic)
        route = await self.pool.route(req.topic)
        ctx = PollContext(
            req, route, self.pool, self.nack, next(self._turn), self.config.broker_timeout_s
        )
        if self.stopping:
            ctx.stop()
        self._polls.add(ctx)
        self.in_flight[mode] += 1
        if self.metrics is not None:
            self.metrics.long_poll_started(mode)
        try:
            messages = await self._run(mode, ctx)
            delivered, dead = await self._divert_exhausted(req, messages)
            if not messages and ctx.polling_full:
                # Answering empty at once would have the client poll again at once.
                raise TooManyRequests("the broker holds too many parked pops")
        finally:
            self._polls.discard(ctx)
            self.in_flight[mode] -= 1
            if self.metrics is not None:
                self.metrics.long_poll_finished(mode)
        return ReceiveResult(
            messages=delivered,
            mode=mode,
            is_short_polling_hit=ctx.short_polling_hit and bool(delivered),
            pops=ctx.pops,
            notifications=ctx.notifications,
            wait_s=ctx.loop.time() - req.arrived_at,
            broker=delivered[0].broker if delivered else None,
            dead_lettered=dead,
        )

    async def _run(self, mode: str, ctx: PollContext) -> list[PolledMessage]:
        if mode == NOTIFY:
            return await notify_poll(ctx, self.hub, self.config.max_probes_per_poll)
        if mode == COUPLED:
            return await coupled_poll(ctx)
        return await slicing_poll(ctx, self.config.slice_ms, self.config.slice_quota)

    async def _divert_exhausted(
        self, req: ReceiveRequest, messages: list[PolledMessage]
    ) -> tuple[list[PolledMessage], int]:
        """Send messages past their last attempt to ``%DLQ%<group>`` instead of the client."""
        limit = self.config.max_delivery_attempts
        keep = [m for m in messages if m.message.reconsume_times + 1 <= limit]
        if len(keep) == len(messages):
            return messages, 0
        for polled in messages:
            if polled.message.reconsume_times + 1 > limit:
                await self.dead_letter(req.group, polled, limit - 1)
        return keep, len(messages) - len(keep)

    async def dead_letter(self, group: str, polled: PolledMessage, max_reconsume: int) -> None:
        """Move ``polled`` to the group's DLQ and ack it; on failure hand it back."""
        client = self.pool.broker(polled.broker)
        if client is None:
            return
        msg = polled.message
        try:
            await client.send_to_dead_letter(
                group, msg.commit_log_offset, msg.msg_id, msg.topic, max_reconsume
            )
            await client.ack(group, msg.topic, msg.properties[Prop.POP_CK])
        except RemotingError as exc:
            log.warning("dead-lettering %s failed: %s", polled.message.msg_id, exc)

    # -- handing back ---------------------------------------------------------------------

    def nack(self, messages: list[PolledMessage], reason: str) -> None:
        """Hand back messages a client did not get: make them visible again shortly."""
        if not messages:
            return
        self.nacked += len(messages)
        if self.metrics is not None:
            self.metrics.nack(reason, len(messages))
        task = asyncio.ensure_future(self._change_invisible(messages))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _change_invisible(self, messages: list[PolledMessage]) -> None:
        for polled in messages:
            client = self.pool.broker(polled.broker)
            if client is None:
                continue
            msg = polled.message
            try:
                await client.change_invisible_time(
                    polled.group,
                    msg.topic,
                    msg.properties[Prop.POP_CK],
                    self.config.nack_invisible_ms,
                )
            except RemotingError as exc:
                log.warning("could not hand back %s: %s", msg.msg_id, exc)

    # -- events and status ----------------------------------------------------------------

    def status(self) -> dict:
        return {
            "mode": self.config.mode,
            "in_flight": dict(self.in_flight),
            "in_flight_limit": self.config.max_in_flight,
            "probes_in_flight": self.hub.probes_in_flight,
            "probe_watchers": self.hub.watchers,
            "probes_sent": self.hub.probes_sent,
            "nacked": self.nacked,
            "adaptive": self.switch.snapshot(time.monotonic()),
        }

    def stop_polls(self) -> None:
        """Make every poll in flight answer now (shutdown)."""
        self.stopping = True
        for ctx in list(self._polls):
            ctx.stop()

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop probing; give hand-backs in flight up to ``grace_s`` to finish."""
        await self.hub.close()
        if self._background:
            await asyncio.wait(self._background, timeout=grace_s)
