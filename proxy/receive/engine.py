"""The receive engine: runs a client's ReceiveMessage as a long poll in its mode.

It decides the mode of a request (fixed, or adaptive per group and topic), holds the
in-flight limit, runs the poll, and sends messages past their last delivery attempt to the
dead-letter queue instead of the client. What it pops and cannot deliver goes back through
the consumer processor.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from proxy.brokers import BrokerPool
from proxy.config import PollMode, ReceiveConfig, ReceiveMode
from proxy.fleet.links import PeerLinks
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.adaptive import AdaptiveSwitch, Decision, Evidence
from proxy.receive.context import PollContext
from proxy.receive.coupled import coupled_poll
from proxy.receive.lite import LiteReceiver
from proxy.receive.misses import MissMemory
from proxy.receive.notify import NotifyPoll
from proxy.receive.probes import ProbeHub, Prober
from proxy.receive.shared import DEFAULT_FALLBACK_S, SharedProbeHub
from proxy.receive.slicing import slicing_poll
from proxy.receive.thresholds import ThresholdsFile
from proxy.receive.types import PolledMessage, ReceiveRequest, ReceiveResult

log = logging.getLogger(__name__)


class TooManyRequests(Exception):
    """The proxy already holds its maximum of long polls, or a broker its parked pops."""


class ReceiveEngine:
    def __init__(
        self,
        config: ReceiveConfig,
        pool: BrokerPool,
        consumer: ConsumerProcessor,
        metrics: ProxyMetrics,
        clock: Callable[[], float] = time.monotonic,
        links: PeerLinks | None = None,
        fallback_s: float = DEFAULT_FALLBACK_S,
    ) -> None:
        """``links``: the other proxies of a fleet that probes each key once; without them
        this proxy probes for every key its polls wait on. ``fallback_s``: how long a key's
        owner may take to answer before this proxy probes the key itself."""
        self.config = config
        self.clock = clock  # the adaptive switch's time (the fleet simulator's is simulated)
        self.pool = pool
        self.consumer = consumer
        self.metrics = metrics
        local = ProbeHub(
            pool,
            max_poll_ms=config.max_polling_ms,
            broker_timeout_s=config.broker_timeout_s,
            on_result=metrics.probe_answered,
            max_per_broker=config.max_probes_per_broker,
            slice_s=config.probe_slice_s,
            linger_s=config.probe_linger_ms / 1000,
        )
        self.shared = (
            SharedProbeHub(local, links, fallback_s=fallback_s) if links is not None else None
        )
        self.hub: Prober = self.shared or local
        self.misses = MissMemory()
        self.lite = LiteReceiver(pool, consumer, config.broker_timeout_s)
        self.switch = AdaptiveSwitch(
            config.adaptive_high_rate,
            config.adaptive_low_rate,
            config.adaptive_window_s,
            Evidence(
                config.adaptive_hit_high,
                config.adaptive_hit_low,
                config.adaptive_min_polls,
                config.adaptive_max_coupled,
            ),
        )
        # Coupled polls in flight per (group, topic), for the switch; a key leaves at zero.
        self._coupled: Counter[tuple[str, str]] = Counter()
        self.thresholds: ThresholdsFile | None = None
        if config.mode is ReceiveMode.ADAPTIVE and config.adaptive_thresholds_file:
            self.thresholds = ThresholdsFile(
                config.adaptive_thresholds_file,
                config.adaptive_thresholds_check_s,
                self.switch.set_thresholds,
            )
        self.in_flight: Counter[PollMode] = Counter()
        self._turn = itertools.count()
        self.stopping = False
        self._polls: set[PollContext] = set()

    @property
    def in_flight_total(self) -> int:
        return sum(self.in_flight.values())

    async def start(self) -> None:
        """Load the adaptive thresholds file, if one is set, and keep watching it."""
        if self.thresholds is not None:
            await self.thresholds.check()
            self.thresholds.start()

    def _choose_mode(self, group: str, topic: str) -> PollMode:
        """The mode of one new request of (group, topic), counting it (adaptive)."""
        if self.config.mode is not ReceiveMode.ADAPTIVE:
            return self.config.mode.initial_poll_mode
        decision = self.switch.choose(
            group, topic, self.clock(), self._coupled.get((group, topic), 0)
        )
        self._switched(group, topic, decision)
        return decision.mode

    def _listen(self, req: ReceiveRequest, ctx: PollContext) -> None:
        """Have the poll tell the switch its first pop's outcome as soon as it is known."""
        if self.config.mode is ReceiveMode.ADAPTIVE:
            group, topic = req.group, req.topic
            ctx.on_first_pop = lambda hit: self.switch.first_pop(group, topic, self.clock(), hit)

    def _report_polling_full(self, req: ReceiveRequest, ctx: PollContext) -> None:
        """Tell the switch that a broker answered POLLING_FULL to this poll (adaptive)."""
        if self.config.mode is ReceiveMode.ADAPTIVE and ctx.polling_full:
            decision = self.switch.polling_full(req.group, req.topic, self.clock())
            self._switched(req.group, req.topic, decision)

    def _switched(self, group: str, topic: str, decision: Decision | None) -> None:
        if decision is not None and decision.switched:
            log.info(
                "%s/%s switched to %s polling: %s", group, topic, decision.mode, decision.reason
            )
            self.metrics.mode_switch(group, topic, decision.mode)

    async def receive(self, req: ReceiveRequest) -> ReceiveResult:
        """Run one client poll; ``req.mode`` says in which mode, also when it raises
        TooManyRequests, TopicNotFound or RemotingError."""
        req.mode = mode = self._choose_mode(req.group, req.topic)
        if self.in_flight_total >= self.config.max_in_flight:
            raise TooManyRequests(f"{self.config.max_in_flight} long polls already in flight")
        route = await self.pool.route(req.topic)
        ctx = PollContext(
            req,
            route,
            self.pool,
            self.consumer.hand_back,
            next(self._turn),
            self.config.broker_timeout_s,
        )
        ctx.mark("mode", mode.value)
        if self.stopping:
            ctx.stop()
        self._listen(req, ctx)
        self._polls.add(ctx)
        self.in_flight[mode] += 1
        key = (req.group, req.topic)
        if mode is PollMode.COUPLED:
            self._coupled[key] += 1
        self.metrics.long_poll_started(mode)
        try:
            messages = await self._run(mode, ctx)
            self._report_polling_full(req, ctx)
            delivered = await self._divert_exhausted(messages, req.max_attempts)
            if not messages and ctx.polling_full:
                # Answering empty at once would have the client poll again at once.
                raise TooManyRequests("the broker holds too many parked pops")
        finally:
            self._polls.discard(ctx)
            self.in_flight[mode] -= 1
            if mode is PollMode.COUPLED:
                self._coupled[key] -= 1
                if self._coupled[key] <= 0:
                    del self._coupled[key]
            self.metrics.long_poll_finished(mode)
        return ReceiveResult(
            messages=delivered,
            is_short_polling_hit=ctx.short_polling_hit and bool(delivered),
            pops=ctx.pops,
            probes=ctx.probes,
            timeline=ctx.timeline,
        )

    async def receive_lite(self, req: ReceiveRequest, client_id: str) -> ReceiveResult:
        """Run one lite consumer's poll (``receive/lite.py``): mode LITE, within the same
        in-flight limit as every other poll (each holds a parked pop per broker)."""
        req.mode = PollMode.LITE
        if self.in_flight_total >= self.config.max_in_flight:
            raise TooManyRequests(f"{self.config.max_in_flight} long polls already in flight")
        self.in_flight[PollMode.LITE] += 1
        self.metrics.long_poll_started(PollMode.LITE)
        try:
            return await self.lite.receive(req, client_id)
        finally:
            self.in_flight[PollMode.LITE] -= 1
            self.metrics.long_poll_finished(PollMode.LITE)

    def _run(self, mode: PollMode, ctx: PollContext) -> Coroutine[Any, Any, list[PolledMessage]]:
        """The poll of ``mode``, to be awaited by ``receive`` (a plain function: an idle
        poll holds no frame of its own here)."""
        if mode is PollMode.NOTIFY:
            return NotifyPoll(ctx, self.hub, self.misses, self.config.max_probes_per_poll).run()
        if mode is PollMode.COUPLED:
            return coupled_poll(ctx)
        return slicing_poll(ctx, self.config.slice_ms, self.config.slice_quota)

    async def _divert_exhausted(
        self, messages: list[PolledMessage], max_attempts: int
    ) -> list[PolledMessage]:
        """Messages past their group's last attempt go to ``%DLQ%<group>`` instead of the
        client."""
        deliver = await self.consumer.divert_exhausted(
            [(m.popped, m.message.reconsume_times) for m in messages], max_attempts
        )
        return [m for m, keep in zip(messages, deliver, strict=True) if keep]

    # -- status and shutdown --------------------------------------------------------------

    def status(self) -> dict[str, object]:
        return {
            "mode": self.config.mode.value,
            "in_flight": {mode.value: n for mode, n in self.in_flight.items()},
            "in_flight_limit": self.config.max_in_flight,
            "probes_in_flight": self.hub.probes_in_flight,
            "probe_watchers": self.hub.watchers,
            "probes_sent": self.hub.probes_sent,
            "handed_back": self.consumer.handed_back,
            "adaptive": self.switch.snapshot(self.clock()),
            "adaptive_thresholds": self.thresholds.status() if self.thresholds else None,
        }

    def stop_polls(self) -> None:
        """Make every poll in flight answer now (shutdown)."""
        self.stopping = True
        for ctx in list(self._polls):
            ctx.stop()

    async def close(self) -> None:
        """Stop watching the thresholds file, stop probing."""
        if self.thresholds is not None:
            await self.thresholds.close()
        await self.hub.close()
