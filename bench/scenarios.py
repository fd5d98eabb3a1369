"""The benchmark scenarios. Each runs every mode, interleaved in rounds, so the
machine's noise hits them alike; each mode has its own proxy process and its own topics."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import statistics
import time
import uuid
from dataclasses import dataclass, field

from proxy.api.v2 import definition_pb2 as pb
from proxy.remoting.answers import BrokerError
from proxy.remoting.codes import ResponseCode
from proxy.remoting.message import BatchEntry, Prop
from testkit.lean_client import LeanClient
from testkit.processes import (
    System,
    broker_requests,
    broker_requests_by_code,
    gc_pauses,
    scrape,
)
from testkit.processes import status as proxy_status

# The consumers' client class; bench/peer.py puts in one that sends its settings over
# Telemetry first, as the official clients do (the Apache proxy needs them).
CLIENT_CLASS: list[type[LeanClient]] = [LeanClient]

OK, NOT_FOUND, TOO_MANY = pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND, pb.Code.TOO_MANY_REQUESTS


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


@dataclass
class ModeTally:
    """What one mode did over all its slots of a scenario."""

    latencies: list[float] = field(default_factory=list)
    delivered: int = 0
    receives: int = 0
    empties: int = 0
    false_empties: int = 0
    too_many: int = 0
    # Receives that raised (the proxy unreachable, a deadline): reported, never hidden as
    # empty answers.
    receive_errors: int = 0
    undelivered: int = 0
    send_retries: int = 0
    seconds: float = 0.0
    proxy_cpu: float = 0.0
    # Time and proxy CPU a slot spent starting its clients, left out of the two above.
    setup_seconds: float = 0.0
    setup_cpu: float = 0.0
    before: dict | None = None
    after: dict | None = None
    # One entry per slot: when it ran, the machine's load then, its own latencies.
    slots: list[dict] = field(default_factory=list)

    @property
    def broker_requests(self) -> float:
        return broker_requests(self.before or {}, self.after or {})

    def summary(self) -> dict:
        per_msg = self.broker_requests / self.delivered if self.delivered else None
        return {
            "delivered": self.delivered,
            "receives": self.receives,
            "empty_answers": self.empties,
            "false_empties": self.false_empties,
            "too_many_requests": self.too_many,
            "receive_errors": self.receive_errors,
            "undelivered_at_end": self.undelivered,
            "send_retries": self.send_retries,
            "latency_ms_p50": ms(percentile(self.latencies, 0.5)),
            "latency_ms_p99": ms(percentile(self.latencies, 0.99)),
            "latency_ms_max": ms(max(self.latencies) if self.latencies else None),
            "broker_requests": round(self.broker_requests),
            "broker_requests_per_message": round(per_msg, 2) if per_msg is not None else None,
            # Which requests they were: POP_MESSAGE, NOTIFICATION, ACK_MESSAGE, ...
            "broker_requests_per_message_by_code": {
                code: round(n / self.delivered, 2)
                for code, n in sorted(
                    broker_requests_by_code(self.before or {}, self.after or {}).items()
                )
            }
            if self.delivered
            else {},
            "receive_rate_per_s": round(self.receives / self.seconds, 1) if self.seconds else None,
            "delivered_per_s": round(self.delivered / self.seconds, 1) if self.seconds else None,
            "proxy_cpu_s_per_1000": (
                round(self.proxy_cpu / self.delivered * 1000, 3) if self.delivered else None
            ),
            "client_setup_s": round(self.setup_seconds, 1),
            "slots": self.slots,
        }


class Consumers:
    """Long-polling consumers through one proxy; they ack what they get and count what
    they see. ``available`` maps message ids to the time their send was acknowledged."""

    def __init__(
        self,
        endpoint: str,
        group: str,
        topic: str,
        tally: ModeTally,
        available: dict[str, float],
        await_ms: int,
        batch: int = 16,
        track_early: bool = False,
        work_s: float = 0.0,
        connections: int = 1,
        expression: str = "*",
        filter_type: int = pb.FilterType.TAG,
    ) -> None:
        self.endpoint, self.group, self.topic = endpoint, group, topic
        self.expression, self.filter_type = expression, filter_type
        # The consumers share this many HTTP/2 connections (a multi-worker proxy spreads
        # connections, not calls, over its workers).
        self.connections = connections
        # Time a consumer spends on each message it received before it acks them (its
        # own processing; 0: it acks at once).
        self.work_s = work_s
        self.tally, self.available = tally, available
        self.await_ms, self.batch = await_ms, batch
        self.tasks: list[asyncio.Task] = []
        self.clients: list[LeanClient] = []
        self.received = asyncio.Event()
        # Ids received before the producer saw its send acknowledged (a race the sparse
        # scenario settles: such a message counts with latency 0, not as waiting forever).
        self.early: set[str] = set()
        self.track_early = track_early

    def start(self, count: int) -> None:
        """Start ``count`` more consumers."""
        for client in self._new_clients(count):
            self.tasks.append(asyncio.ensure_future(self._run(client)))

    async def start_prepared(self, count: int, timeout_s: float = 60.0) -> None:
        """Start ``count`` more consumers once each has done what it does before its first
        receive (``LeanClient.prepare``: the settings exchange of a SettingsClient), so that
        a slot measures receiving, not clients starting up."""
        clients = self._new_clients(count)
        await asyncio.wait_for(
            asyncio.gather(*(c.prepare(self.group, self.topic, self.await_ms) for c in clients)),
            timeout_s,
        )
        for client in clients:
            self.tasks.append(asyncio.ensure_future(self._run(client)))

    def _new_clients(self, count: int) -> list[LeanClient]:
        first = len(self.clients)
        self.clients += [
            CLIENT_CLASS[0](self.endpoint, f"bench-consumer-{i}", connection=i % self.connections)
            for i in range(first, first + count)
        ]
        return self.clients[first:]

    async def _run(self, client: LeanClient) -> None:
        while True:
            try:
                result = await client.receive(
                    self.group,
                    self.topic,
                    await_ms=self.await_ms,
                    batch=self.batch,
                    invisible_ms=30_000,
                    expression=self.expression,
                    filter_type=self.filter_type,
                )
            except Exception as exc:
                result = None
                self.tally.receive_errors += 1
                if self.tally.receive_errors <= 3:
                    print(f"  receive failed ({self.topic}): {exc!r}", flush=True)
            now = time.perf_counter()
            self.tally.receives += 1
            if result is not None and result.messages:
                for m in result.messages:
                    sent = self.available.pop(m.system_properties.message_id, None)
                    if sent is not None:
                        self.tally.latencies.append(now - sent)
                    elif self.track_early:
                        self.early.add(m.system_properties.message_id)
                self.tally.delivered += len(result.messages)
                self.received.set()
                if self.work_s:
                    await asyncio.sleep(self.work_s * len(result.messages))
                await client.ack(self.group, self.topic, result.messages)
            elif result is not None and result.status == TOO_MANY:
                self.tally.too_many += 1
                await asyncio.sleep(1.0)
            else:
                self.tally.empties += 1
                if any(now - t >= 0.1 for t in self.available.values()):
                    self.tally.false_empties += 1

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for client in self.clients:
            await client.close()


async def _interleaved(system: System, rounds: int, slot) -> dict[str, ModeTally]:
    """Run ``slot(mode, round, tally)`` for every mode, in a shuffled order per round."""
    tallies = {mode: ModeTally() for mode in system.modes}
    for mode in system.modes:
        tallies[mode].before = await system.metrics(mode)
    began = time.perf_counter()
    for round_no in range(rounds):
        order = list(system.modes)
        random.shuffle(order)
        for mode in order:
            proxy, tally = system.proxies[mode], tallies[mode]
            cpu0, t0, seen = proxy.cpu_seconds(), time.perf_counter(), len(tally.latencies)
            setup0 = (tally.setup_seconds, tally.setup_cpu)
            load0 = os.getloadavg()[0]
            await system.slot_edge(mode, True)
            await slot(mode, round_no, tally)
            await system.slot_edge(mode, False)
            tally.seconds += time.perf_counter() - t0 - (tally.setup_seconds - setup0[0])
            tally.proxy_cpu += proxy.cpu_seconds() - cpu0 - (tally.setup_cpu - setup0[1])
            mine = tally.latencies[seen:]
            tally.slots.append({
                "round": round_no,
                "started_s": round(t0 - began, 1),
                "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
                "latencies": len(mine),
                "latency_ms_p50": ms(percentile(mine, 0.5)),
                "latency_ms_max": ms(max(mine) if mine else None),
                "over_20_ms": sum(1 for x in mine if x > 0.02),
            })  # fmt: skip
    return tallies


async def _final_scrape(system: System, tallies: dict[str, ModeTally], settle_s: float) -> None:
    # Probes and parked pops of the last slots finish within one poll time.
    await asyncio.sleep(settle_s)
    for mode, tally in tallies.items():
        tally.after = await system.metrics(mode)


# -- 1. sparse ------------------------------------------------------------------------------


async def sparse(
    system: System,
    *,
    rounds: int,
    slot_s: float,
    await_ms: int = 10_000,
    consumers: int = 2,
    warmup_s: float = 0.0,
) -> dict:
    """Few consumers, a message every 200-500 ms on a random broker. Each message carries
    its own UNIQ_KEY, as a client's producer sets it (a real broker adds none). With
    ``warmup_s``, every mode first runs one unmeasured slot that long (JIT-compiling JVM
    brokers on the real backend get their first requests there)."""
    rng = random.Random(7)

    async def send(topic: str, msg_id: str, tally: ModeTally) -> None:
        # A real broker sheds sends that waited over 200 ms in its queue (SYSTEM_BUSY,
        # "flow control") when the machine is loaded; retry on another broker, as the
        # official producers do, and count it.
        for attempt in range(3):
            try:
                await rng.choice(system.broker_clients).send(
                    topic, b"x" * 64, properties={Prop.UNIQ_KEY: msg_id}
                )
                return
            except BrokerError as exc:
                if exc.code != ResponseCode.SYSTEM_BUSY or attempt == 2:
                    raise
                tally.send_retries += 1
                await asyncio.sleep(0.05)

    async def slot(mode: str, round_no: int, tally: ModeTally, length_s: float) -> None:
        topic = f"sparse-{mode}-{round_no}" if round_no >= 0 else f"sparse-{mode}-warmup"
        await system.create_topic(topic)
        available: dict[str, float] = {}
        group = f"sparse-{mode}"
        crowd = Consumers(
            system.proxies[mode].address["grpc"], group, topic, tally, available, await_ms,
            track_early=True,
        )  # fmt: skip
        crowd.start(consumers)
        await asyncio.sleep(0.5)  # consumers are polling
        end = time.perf_counter() + length_s
        while time.perf_counter() < end:
            await asyncio.sleep(rng.uniform(0.2, 0.5))
            msg_id = uuid.uuid4().hex.upper()
            await send(topic, msg_id, tally)
            if msg_id in crowd.early:
                tally.latencies.append(0.0)
            else:
                available[msg_id] = time.perf_counter()
        drain_until = time.perf_counter() + await_ms / 1000 + 1
        while available and time.perf_counter() < drain_until:  # noqa: ASYNC110 - bounded poll
            await asyncio.sleep(0.05)
        tally.undelivered += len(available)
        await crowd.stop()

    if warmup_s > 0:
        for mode in system.modes:
            await slot(mode, -1, ModeTally(), warmup_s)
    tallies = await _interleaved(
        system, rounds, lambda mode, round_no, tally: slot(mode, round_no, tally, slot_s)
    )
    await _final_scrape(system, tallies, await_ms / 1000 + 1)
    return {
        mode: t.summary() | {"latencies_ms": [round(x * 1000, 3) for x in t.latencies]}
        for mode, t in tallies.items()
    }


# -- filtered subscriptions ------------------------------------------------------------------

# A subscription as a tag expression, and as a SQL92 one that selects the same messages.
FILTERS = {"tag": ("tagA", pb.FilterType.TAG), "sql92": ("TAGS = 'tagA'", pb.FilterType.SQL)}


async def filtered(
    system: System,
    *,
    rounds: int,
    slot_s: float,
    rate: float = 50.0,
    match_every: int = 10,
    await_ms: int = 10_000,
    consumers: int = 2,
) -> dict:
    """Consumers whose subscription matches one message in ``match_every``, while ``rate``
    messages a second go to random brokers: what a filter costs the notify path. A probe
    carries no filter, so each arrival may wake one; the pops that follow find nothing for
    most. Per filter kind and mode: broker requests per delivered message, false empties (an
    empty answer while a matching message had waited 100 ms), latency."""
    rng = random.Random(11)

    def slot_of(kind: str, expression: str, filter_type: int):
        async def slot(mode: str, round_no: int, tally: ModeTally) -> None:
            topic = f"filtered-{kind}-{mode}-{round_no}"
            await system.create_topic(topic)
            available: dict[str, float] = {}
            crowd = Consumers(
                system.proxies[mode].address["grpc"], f"filtered-{kind}-{mode}", topic, tally,
                available, await_ms, track_early=True, expression=expression,
                filter_type=filter_type,
            )  # fmt: skip
            crowd.start(consumers)
            await asyncio.sleep(0.5)  # consumers are polling
            started = time.perf_counter()
            sent = 0
            while time.perf_counter() < started + slot_s:
                matching = sent % match_every == 0
                msg_id = uuid.uuid4().hex.upper()
                await rng.choice(system.broker_clients).send(
                    topic, b"x" * 64, tag="tagA" if matching else "tagB",
                    properties={Prop.UNIQ_KEY: msg_id},
                )  # fmt: skip
                if matching:
                    if msg_id in crowd.early:
                        tally.latencies.append(0.0)
                    else:
                        available[msg_id] = time.perf_counter()
                sent += 1
                await asyncio.sleep(max(0.0, started + sent / rate - time.perf_counter()))
            drain_until = time.perf_counter() + await_ms / 1000 + 1
            while available and time.perf_counter() < drain_until:  # noqa: ASYNC110 - bounded
                await asyncio.sleep(0.05)
            tally.undelivered += len(available)
            await crowd.stop()

        return slot

    out: dict[str, dict] = {}
    for kind, (expression, filter_type) in FILTERS.items():
        tallies = await _interleaved(system, rounds, slot_of(kind, expression, filter_type))
        await _final_scrape(system, tallies, await_ms / 1000 + 1)
        out[kind] = {mode: t.summary() for mode, t in tallies.items()}
    return out


# -- 2. busy --------------------------------------------------------------------------------


async def busy(
    system: System,
    *,
    rounds: int,
    slot_s: float,
    rate: int,
    consumers: int = 64,
    await_ms: int = 10_000,
) -> dict:
    """Many consumers, producers at a steady high rate (batches straight to the brokers)."""

    async def slot(mode: str, round_no: int, tally: ModeTally) -> None:
        topic = f"busy-{mode}-{round_no}"
        await system.create_topic(topic)
        crowd = Consumers(
            system.proxies[mode].address["grpc"], f"busy-{mode}", topic, tally, {}, await_ms
        )
        setup_t0, setup_cpu0 = time.perf_counter(), system.proxies[mode].cpu_seconds()
        await crowd.start_prepared(consumers)
        tally.setup_seconds += time.perf_counter() - setup_t0
        tally.setup_cpu += system.proxies[mode].cpu_seconds() - setup_cpu0
        batch = [BatchEntry(b"x" * 64, {}) for _ in range(10)]
        interval = len(batch) * len(system.broker_clients) / rate

        async def produce(client) -> None:
            next_at = time.perf_counter()
            end = next_at + slot_s
            while next_at < end:
                try:
                    await client.send_batch(topic, batch)
                except BrokerError as exc:
                    # A loaded real broker sheds sends (flow control); skip, as a producer
                    # would retry elsewhere. The delivered rate shows the shortfall.
                    if exc.code != ResponseCode.SYSTEM_BUSY:
                        raise
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

        await asyncio.gather(*(produce(c) for c in system.broker_clients))
        await asyncio.sleep(1.0)  # let consumers catch up
        await crowd.stop()

    tallies = await _interleaved(system, rounds, slot)
    await _final_scrape(system, tallies, await_ms / 1000 + 1)
    return {mode: t.summary() for mode, t in tallies.items()}


# -- 3. idle fan-in -------------------------------------------------------------------------


async def _in_flight(proxy) -> int:
    status = await proxy_status(proxy)
    if "workers" in status:  # a supervisor: the sum over its workers
        return sum(sum(w["status"]["receive"]["in_flight"].values()) for w in status["workers"])
    return sum(status["receive"]["in_flight"].values())


async def _ramp(proxy, crowd: Consumers, polls: int) -> int:
    """Start consumers until ``polls`` are in flight (bounded); return how many are."""
    crowd.start(polls - len(crowd.clients))
    ramp_end = time.perf_counter() + 60 + polls / 250  # 20,000 polls: 140 s
    while await _in_flight(proxy) < polls * 0.98 and time.perf_counter() < ramp_end:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    return await _in_flight(proxy)


async def fan_in(system: System, *, polls: int, wakeups: int = 20, await_ms: int = 20_000) -> dict:
    """``polls`` idle long polls on each proxy in turn: memory, parked requests, wake-up.

    Memory per poll is the slope of the proxy's RSS between half and all of the polls, so
    the one-time growth of the first polls (grpcio's and the allocator's arenas) is not
    spread over them; the growth from no polls at all is reported beside it."""
    results = {}
    modes = list(system.modes)
    random.shuffle(modes)
    for mode in modes:
        proxy = system.proxies[mode]
        topic, group = f"fanin-{mode}-{polls}", f"fanin-{mode}-{polls}"
        await system.create_topic(topic)
        tally = ModeTally()
        tally.before = await scrape(proxy)
        rss_before = proxy.rss_bytes()
        workers = system.proxy_specs[mode][1]
        # 16 connections per worker: the kernel spreads connections over the workers' shared
        # port, so each worker gets a share of the polls.
        crowd = Consumers(proxy.address["grpc"], group, topic, tally, {}, await_ms, batch=1,
                          connections=16 * workers if workers > 1 else 1)  # fmt: skip
        half = await _ramp(proxy, crowd, polls // 2)
        rss_half = proxy.rss_bytes()
        in_flight = await _ramp(proxy, crowd, polls)
        rss_with = proxy.rss_bytes()
        parked = await system.parked(group, topic)
        # What holding them costs: the proxy's CPU over one long-poll period, in which every
        # poll ends empty once and its consumer sends the next.
        cpu0, empties0, held_from = proxy.cpu_seconds(), tally.empties, time.perf_counter()
        await asyncio.sleep(await_ms / 1000)
        idle_cpu = (proxy.cpu_seconds() - cpu0) / (time.perf_counter() - held_from)
        renewals = tally.empties - empties0
        latencies = []
        for _ in range(wakeups):
            crowd.received.clear()
            start = time.perf_counter()
            await random.choice(system.broker_clients).send(topic, b"wake")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(crowd.received.wait(), await_ms / 1000)
                latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.2)
        await crowd.stop()
        await asyncio.sleep(await_ms / 1000 + 1)  # the polls' parked remnants time out
        tally.after = await scrape(proxy)
        results[mode] = {
            "polls_requested": polls,
            "polls_in_flight": in_flight,
            "proxy_rss_mb_before": round(rss_before / 2**20, 1),
            "proxy_rss_mb_with_polls": round(rss_with / 2**20, 1),
            "proxy_kb_per_poll": round((rss_with - rss_half) / max(in_flight - half, 1) / 1024, 2),
            "proxy_kb_per_poll_from_zero": round(
                (rss_with - rss_before) / max(in_flight, 1) / 1024, 2
            ),
            "broker_parked_pops": parked["pops"],
            "broker_parked_notifications": parked["notifications"],
            **gc_pauses(tally.before or {}, tally.after or {}),
            "idle_cpu_cores": round(idle_cpu, 3),
            "idle_cpu_us_per_poll_s": round(idle_cpu * 1e6 / max(in_flight, 1), 2),
            "empty_answers_in_period": renewals,
            "wakeups": len(latencies),
            "wakeup_ms_p50": ms(statistics.median(latencies)) if latencies else None,
            "wakeup_ms_p99": ms(percentile(latencies, 0.99)),
            "wakeup_ms_max": ms(max(latencies)) if latencies else None,
            "wakeup_ms": [ms(x) for x in latencies],
            "handed_back": (tally.after or {}).get("rocketmq_proxy_nacks_total", 0.0)
            - (tally.before or {}).get("rocketmq_proxy_nacks_total", 0.0),
            "too_many_requests": tally.too_many,
            "delivered": tally.delivered,
            "broker_requests": round(tally.broker_requests),
            "broker_requests_per_message": (
                round(tally.broker_requests / tally.delivered, 2) if tally.delivered else None
            ),
            "coupled_share": _coupled_share(tally.before, tally.after),
        }
    return results


def _coupled_share(before: dict | None, after: dict | None) -> float | None:
    """Share of the receive requests answered between two scrapes that were served in
    coupled mode (adaptive's choice; 0 or 1 for the fixed modes)."""
    before, after = before or {}, after or {}
    served = {k: v - before.get(k, 0.0) for k, v in after.items() if k.startswith("receive:")}
    total = sum(served.values())
    if not total:
        return None
    return round(sum(v for k, v in served.items() if k.startswith("receive:coupled:")) / total, 3)


# -- 4. phased ------------------------------------------------------------------------------


async def _modes_now(proxy, group: str) -> dict[str, str]:
    """The adaptive switch's mode for each topic of ``group`` (empty for fixed modes)."""
    status = await proxy_status(proxy)
    return {e["topic"]: e["mode"] for e in status["receive"]["adaptive"] if e["group"] == group}


async def phased(
    system: System,
    *,
    quiet_s: float,
    busy_s: float,
    rate: int,
    busy_consumers: int,
    busy_batch: int,
    work_ms: float,
    idle_polls: int,
    wakeups: int = 10,
    await_ms: int = 10_000,
    idle_await_ms: int = 20_000,
) -> dict:
    """One (group, topic) per mode that changes phase: quiet (2 consumers, a message every
    200-500 ms), then busy (``busy_consumers`` consumers receiving ``busy_batch`` at a time
    and spending ``work_ms`` on each message, slower than the ``rate`` msg/s produced, so a
    backlog builds; it is drained at the end of the phase), then idle
    (``idle_polls`` idle long polls, ``wakeups`` messages). Each phase is measured on its
    own: delivered, broker requests (from the proxy's metrics, scraped at the phase's ends,
    so requests still parked from one phase count in the next), TOO_MANY_REQUESTS, latency,
    and the share of receives served in coupled mode (adaptive's choice)."""
    rng = random.Random(11)
    modes = list(system.modes)
    random.shuffle(modes)
    results: dict[str, dict] = {}
    for mode in modes:
        results[mode] = await _phased_mode(
            system, mode, rng, quiet_s, busy_s, rate, busy_consumers, busy_batch, work_ms,
            idle_polls, wakeups, await_ms, idle_await_ms,
        )  # fmt: skip
    return results


async def _phased_mode(
    system: System,
    mode: str,
    rng: random.Random,
    quiet_s: float,
    busy_s: float,
    rate: int,
    busy_consumers: int,
    busy_batch: int,
    work_ms: float,
    idle_polls: int,
    wakeups: int,
    await_ms: int,
    idle_await_ms: int,
) -> dict[str, dict]:
    proxy = system.proxies[mode]
    topic, group = f"phased-{mode}", f"phased-{mode}"
    await system.create_topic(topic)
    grpc = proxy.address["grpc"]
    phases: dict[str, dict] = {}
    # Adaptive's mode for the key while the phase's consumers still poll (a key leaves
    # /v1/status one window after its last request).
    under_load: dict[str, str | None] = {}

    async def note(phase: str) -> None:
        under_load[phase] = (await _modes_now(proxy, group)).get(topic)

    async def measure(name: str, tally: ModeTally, body) -> None:
        tally.before = await scrape(proxy)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        await body(tally)
        tally.seconds = time.perf_counter() - t0
        tally.after = await scrape(proxy)
        summary = tally.summary()
        del summary["slots"]
        phases[name] = summary | {
            "coupled_share": _coupled_share(tally.before, tally.after),
            "adaptive_mode_at_end": under_load.get(name),
            # Messages popped for a poll that no longer waited (its client left, say),
            # made visible again a second later.
            "handed_back": round(
                tally.after.get("rocketmq_proxy_nacks_total", 0.0)
                - tally.before.get("rocketmq_proxy_nacks_total", 0.0)
            ),
            "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        }

    async def quiet(tally: ModeTally) -> None:
        available: dict[str, float] = {}
        crowd = Consumers(grpc, group, topic, tally, available, await_ms, track_early=True)
        crowd.start(2)
        await asyncio.sleep(0.5)
        end = time.perf_counter() + quiet_s
        while time.perf_counter() < end:
            await asyncio.sleep(rng.uniform(0.2, 0.5))
            msg_id = uuid.uuid4().hex.upper()
            await rng.choice(system.broker_clients).send(
                topic, b"x" * 64, properties={Prop.UNIQ_KEY: msg_id}
            )
            if msg_id in crowd.early:
                tally.latencies.append(0.0)
            else:
                available[msg_id] = time.perf_counter()
        drain_until = time.perf_counter() + await_ms / 1000 + 1
        while available and time.perf_counter() < drain_until:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        tally.undelivered += len(available)
        await note("quiet")
        await crowd.stop()

    async def busy_phase(tally: ModeTally) -> None:
        # Consumers slower than the producers: a backlog builds, so first pops find
        # messages (where adaptive may switch to coupled).
        crowd = Consumers(
            grpc, group, topic, tally, {}, await_ms, batch=busy_batch, work_s=work_ms / 1000
        )
        crowd.start(busy_consumers)
        batch = [BatchEntry(b"x" * 64, {}) for _ in range(10)]
        interval = len(batch) * len(system.broker_clients) / rate

        async def produce(client) -> None:
            next_at = time.perf_counter()
            end = next_at + busy_s
            while next_at < end:
                await client.send_batch(topic, batch)
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

        await asyncio.gather(*(produce(c) for c in system.broker_clients))
        await note("busy")
        # Drain the backlog (bounded): the idle phase starts with nothing to find.
        drain_until, last = time.perf_counter() + 60, -1
        while tally.delivered != last and time.perf_counter() < drain_until:
            last = tally.delivered
            await asyncio.sleep(1.0)
        await crowd.stop()

    async def idle(tally: ModeTally) -> None:
        crowd = Consumers(grpc, group, topic, tally, {}, idle_await_ms, batch=1)
        await _ramp(proxy, crowd, idle_polls)
        for _ in range(wakeups):
            crowd.received.clear()
            start = time.perf_counter()
            await rng.choice(system.broker_clients).send(topic, b"wake")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(crowd.received.wait(), idle_await_ms / 1000)
                tally.latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.2)
        await note("idle")
        await crowd.stop()
        await asyncio.sleep(idle_await_ms / 1000 + 1)  # parked remnants time out

    await measure("quiet", ModeTally(), quiet)
    await measure("busy", ModeTally(), busy_phase)
    await measure("idle", ModeTally(), idle)
    return phases


# -- 5. overhead ----------------------------------------------------------------------------


async def _fill(system: System, topic: str, messages: int) -> None:
    batch = [BatchEntry(b"x" * 128, {}) for _ in range(32)]
    per_broker = messages // (len(batch) * len(system.broker_clients))

    async def fill(client) -> None:
        for _ in range(per_broker):
            await client.send_batch(topic, batch)

    await asyncio.gather(*(fill(c) for c in system.broker_clients))


def _path_proxy(path: str) -> str | None:
    """The proxy a path of the overhead scenario goes through: "proxy" the notify proxy,
    "proxy-w<N>" the notify proxy of N workers (``bench_proxy --workers``), "direct" none."""
    return None if path == "direct" else "notify" + path.removeprefix("proxy")


class Unfinished(Exception):
    """A consume did not take every message in its time (a proxy that cannot serve it)."""


async def _consume(
    system: System,
    proxy: str | None,
    topic: str,
    group: str,
    total: int,
    workers: int,
    limit_s: float = 300.0,
) -> tuple[float, list[float]]:
    """Pop and ack ``total`` messages with ``workers`` in parallel, through the proxy
    labelled ``proxy`` in ``system.proxies`` (clients of ``CLIENT_CLASS``), or straight to
    the brokers when it is None; return messages/s, timed to the moment the last message
    is acked (workers still parked in a long poll then are cancelled, not waited for), and
    the latency of every receive (pop on the direct path) that returned messages.
    Unfinished when ``limit_s`` passes first."""
    consumed = 0
    all_done = asyncio.Event()
    latencies: list[float] = []

    def count(n: int) -> None:
        nonlocal consumed
        consumed += n
        if consumed >= total:
            all_done.set()

    async def via_proxy(i: int) -> None:
        # A connection per worker task, as separate consumers have: a proxy of several
        # workers gets them spread over its workers by the kernel.
        assert proxy is not None
        client = CLIENT_CLASS[0](
            system.proxies[proxy].address["grpc"], f"over-{proxy}-{i}", own_connection=True
        )
        try:
            while consumed < total:
                t0 = time.perf_counter()
                result = await client.receive(group, topic, await_ms=5000, batch=32)
                if result.messages:
                    latencies.append(time.perf_counter() - t0)
                    await client.ack(group, topic, result.messages)
                    count(len(result.messages))
        finally:
            await client.close()

    async def direct(i: int) -> None:
        broker = system.broker_clients[i % len(system.broker_clients)]
        while consumed < total:
            t0 = time.perf_counter()
            result = await broker.pop(group, topic, max_nums=32, invisible_ms=30_000)
            if not result.messages:
                broker = system.broker_clients[(i := i + 1) % len(system.broker_clients)]
                continue
            latencies.append(time.perf_counter() - t0)
            await asyncio.gather(
                *(broker.ack(group, topic, m.properties["POP_CK"]) for m in result.messages)
            )
            count(len(result.messages))

    worker = direct if proxy is None else via_proxy
    start = time.perf_counter()
    tasks = [asyncio.ensure_future(worker(i)) for i in range(workers)]
    try:
        await asyncio.wait_for(all_done.wait(), limit_s)
        elapsed = time.perf_counter() - start
    except TimeoutError:
        raise Unfinished(f"{consumed} of {total} messages in {limit_s:.0f} s") from None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return consumed / elapsed, latencies


@contextlib.asynccontextmanager
async def _profiled(pid: int, out: str | None):
    """py-spy samples process ``pid`` while the block runs, when ``out`` names a file
    (a speedscope JSON, plus a raw collapsed-stack file beside it for text summaries)."""
    if out is None:
        yield
        return
    spies = [
        await asyncio.create_subprocess_exec(
            "py-spy", "record", "-p", str(pid), "-r", "250", "--nonblocking",
            "-f", fmt, "-o", path,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        for fmt, path in (("speedscope", out), ("raw", out + ".raw"))
    ]  # fmt: skip
    await asyncio.sleep(1.0)  # py-spy attaches before the measured work starts
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for spy in spies:
            try:
                await asyncio.wait_for(spy.wait(), 30)
            except TimeoutError:
                spy.kill()
                await spy.wait()


def _cpu_seconds(system: System, proxy: str = "notify") -> dict[str, float]:
    """CPU seconds so far of a notify proxy (with its workers), all brokers, and this
    load generator."""
    return {
        "proxy": system.proxies[proxy].cpu_seconds(),
        "brokers": sum(b.cpu_seconds() for b in system.brokers),
        "load_generator": time.process_time(),
    }


async def overhead(
    system: System, *, rounds: int, messages: int, workers: int = 16, profile: str | None = None
) -> dict:
    """Pop+ack throughput through the proxy (notify mode) against straight to the brokers,
    and the CPU each process spent per 1,000 messages on each path. With ``profile`` (a
    directory), py-spy samples the proxy during the proxy path's last round. With notify
    proxies of several workers in ``system`` (``notify-w<N>``), their paths ``proxy-w<N>``
    run in the same interleaved rounds."""
    paths = ["proxy", "direct"] + [
        "proxy" + label.removeprefix("notify") for label in system.modes
        if label.startswith("notify-w")
    ]  # fmt: skip
    rates: dict[str, list[float]] = {path: [] for path in paths}
    cpu: dict[str, dict[str, float]] = {path: {} for path in paths}
    latencies: dict[str, list[float]] = {path: [] for path in paths}
    per_request = 32 * len(system.broker_clients)
    total = messages // per_request * per_request
    for round_no in range(rounds):
        for path in random.sample(paths, len(paths)):
            topic, group = f"over-{path}-{round_no}", f"over-{path}"
            await system.create_topic(topic)
            await _fill(system, topic, total)
            profile_to = None
            if profile and path == "proxy" and round_no == rounds - 1:
                profile_to = f"{profile}/proxy-overhead.speedscope.json"
            async with _profiled(system.proxies["notify"].pid, profile_to):
                proxy = _path_proxy(path)
                before = _cpu_seconds(system, proxy or "notify")
                rate, waits = await _consume(system, proxy, topic, group, total, workers)
                after = _cpu_seconds(system, proxy or "notify")
                rates[path].append(rate)
                latencies[path] += waits
            for who, seconds in after.items():
                spent = (seconds - before[who]) * 1e6 / total  # ms per 1,000 messages
                cpu[path][who] = cpu[path].get(who, 0.0) + spent / rounds
    proxy_rate, direct_rate = statistics.median(rates["proxy"]), statistics.median(rates["direct"])
    return {
        "proxy_msgs_per_s": round(proxy_rate),
        "direct_msgs_per_s": round(direct_rate),
        "proxy_share_of_direct": round(proxy_rate / direct_rate, 3),
        "cpu_ms_per_1000": {
            path: {who: round(ms_, 1) for who, ms_ in spent.items()} for path, spent in cpu.items()
        },
        "msgs_per_s": {path: round(statistics.median(r)) for path, r in rates.items()},
        "receive_ms_p50": {path: ms(percentile(w, 0.5)) for path, w in latencies.items()},
        "receive_ms_p99": {path: ms(percentile(w, 0.99)) for path, w in latencies.items()},
        "rounds": rates,
    }
