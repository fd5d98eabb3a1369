"""A fleet of proxies, brokers and consumers on simulated time, through the real receive code.

Every proxy is a real ``ReceiveEngine`` (with its real ``ProbeHub``, ``MissMemory``,
``AdaptiveSwitch`` and ``ConsumerProcessor``) whose broker pool hands out simulated brokers
(``bench/sim/brokers.py``). Every consumer is a loop that does what a SimpleConsumer
does: a ReceiveMessage with a 20 s await (the proxy turns it into a ``ReceiveRequest`` as
``proxy/api/receive.py`` does), an ack of what it got, and at once the next receive; after
TOO_MANY_REQUESTS it waits a second. Producers send each sampled key's messages as a
Poisson stream to a random broker. Time is simulated (``bench/sim/vloop.py``), so nothing
sleeps and a run takes as long as the proxy code in it takes to run.

Sampling. A fleet of K keys (group, topic) with C consumers each is played as ``sampled``
keys with all their C consumers, on all P proxies and all B brokers. Keys share nothing
in the receive code: probes, watches, miss memory and the adaptive switch are per key,
and a consumer polls one key. They meet only at limits. A broker's 100,000 parked
requests is scaled: a simulated broker refuses once its sampled parked requests times
K / sampled reach it. So is ``receive.max_probes_per_broker`` (times sampled / K; the
sample must be large enough for that to stay a few probes, ``simulate.py`` sizes it). A
proxy's 20,000 polls in flight is not played (a sample's polls per proxy vary far more
than a whole fleet's): polls per proxy are reported, scaled, against it. Every per-broker
and per-proxy count reported is the sampled count times K / sampled. Keys are
exchangeable (same C, same rate, same spread law), so the sample's share of a full
table is, in expectation, the share every key would get; what the sample cannot show is
the variance between brokers from the 1 - sampled / K keys it leaves out. The per-key
limit of 1,024 needs no scaling: a sampled key has all its consumers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import cast

from bench.sim import vloop
from bench.sim.brokers import FleetLedger, SimBroker, SimMessage, SimPool
from bench.sim.peers import SimFabric
from proxy.brokers import BrokerPool
from proxy.config import ReceiveConfig, ReceiveMode
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.engine import ReceiveEngine, TooManyRequests
from proxy.receive.types import ReceiveRequest
from proxy.remoting.message import Prop

PROXY_MAX_IN_FLIGHT = ReceiveConfig().max_in_flight


@dataclass
class Scenario:
    mode: str = "notify"  # notify | coupled | slicing | adaptive
    proxies: int = 10
    brokers: int = 4
    keys: int = 100  # active (group, topic) keys in the fleet
    consumers: int = 10  # per key
    sampled: int = 4  # keys played (the rest scaled, see the module doc)
    rate: float = 0.05  # messages per second per key, Poisson, to a random broker
    await_s: float = 20.0  # the consumers' long-polling time
    warmup_s: float = 25.0
    measure_s: float = 40.0
    spread: str = "random"  # random | even | affinity:D (consumers of a key on D proxies)
    probe_cap: int = 0  # receive.max_probes_per_broker (0: no cap, today's design)
    probe_slice_s: float = 5.0  # receive.probe_slice_s (only with a cap)
    rtt_s: float = 0.0005  # proxy-broker round trip
    shared: bool = False  # notify with one prober per key in the fleet (receive/shared.py)
    peer_hop_s: float = 0.0005  # one way between two proxies, with shared
    seed: int = 1
    send_interval: tuple[float, float] | None = None  # uniform gaps instead of Poisson
    extra: dict = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.keys / self.sampled


class _NullMetrics:
    def __getattr__(self, name):
        return _noop


def _noop(*_args, **_kwargs) -> None:
    return None


def _proxies_of(scn: Scenario, key_index: int, rng: random.Random) -> list[int]:
    """The proxies the balancer sends key ``key_index``'s consumers to, consumer by
    consumer."""
    p = scn.proxies
    if scn.spread == "random":
        return [rng.randrange(p) for _ in range(scn.consumers)]
    if scn.spread == "even":
        return [(key_index * scn.consumers + j) % p for j in range(scn.consumers)]
    if scn.spread.startswith("affinity:"):
        d = min(int(scn.spread.split(":")[1]), p)

        def weight(proxy: int) -> bytes:
            return hashlib.blake2b(f"{key_index}/{proxy}".encode(), digest_size=8).digest()

        chosen = sorted(range(p), key=weight)[:d]
        return [chosen[j % d] for j in range(scn.consumers)]
    raise ValueError(f"unknown spread {scn.spread!r}")


@dataclass
class _Tally:
    receives: int = 0
    empties: int = 0
    false_empties: int = 0
    too_many: int = 0
    found: int = 0


async def _play(scn: Scenario) -> dict:
    loop = asyncio.get_running_loop()
    rng = random.Random(scn.seed)
    ledger = FleetLedger()
    brokers = [
        SimBroker(f"broker-{b:02d}", ledger, scale=scn.scale, rtt_s=scn.rtt_s)
        for b in range(scn.brokers)
    ]
    # The simulated pool and null metrics stand in for what the engine uses of the real ones.
    pool = cast(BrokerPool, SimPool(brokers))
    names = [b.name for b in brokers]
    by_name = {b.name: b for b in brokers}
    config = ReceiveConfig(mode=ReceiveMode(scn.mode))
    # Not played: a sample's polls per proxy vary far more than a whole fleet's, so a
    # scaled limit would refuse polls a real proxy takes. Reported instead (polls per
    # proxy, scaled) against the real limit.
    config.max_in_flight = 1 << 30
    if scn.probe_cap:
        config.max_probes_per_broker = max(1, round(scn.probe_cap * scn.sampled / scn.keys))
        config.probe_slice_s = scn.probe_slice_s
    engines = []
    fabric = SimFabric([f"proxy-{p:03d}" for p in range(scn.proxies)], scn.peer_hop_s)
    for proxy_id in fabric.ids:
        processor = ConsumerProcessor(pool, broker_timeout_s=3.0, hand_back_invisible_ms=1_000)
        engine = ReceiveEngine(
            config,
            pool,
            processor,
            cast(ProxyMetrics, _NullMetrics()),
            clock=loop.time,
            links=fabric.links(proxy_id) if scn.shared else None,
        )
        if engine.shared is not None:
            fabric.hubs[proxy_id] = engine.shared
        engines.append(engine)
    tally = _Tally()
    stopping = False
    msg_ids = iter(range(1, 1 << 62))

    async def consume(engine: ReceiveEngine, group: str, topic: str) -> None:
        turn = rng.randrange(scn.brokers)
        await asyncio.sleep(rng.uniform(0, scn.await_s))  # steady state: polls staggered
        while not stopping:
            now = loop.time()
            turn += 1
            req = ReceiveRequest(
                group=group,
                topic=topic,
                expression="*",
                batch_size=32,
                invisible_ms=30_000,
                polling_ms=int(scn.await_s * 1000),
                answer_by=now + scn.await_s,
                arrived_at=now,
                broker_hint=names[turn % scn.brokers],
            )
            try:
                result = await engine.receive(req)
            except TooManyRequests:
                tally.too_many += 1
                await asyncio.sleep(1.0)
                continue
            tally.receives += 1
            now = loop.time()
            if not result.messages:
                tally.empties += 1
                oldest = ledger.oldest_visible_since((group, topic))
                if oldest is not None and now - oldest >= 0.1:
                    tally.false_empties += 1
                continue
            tally.found += 1
            broker = by_name[result.messages[0].broker]
            cks = []
            for polled in result.messages:
                ck = polled.message.properties[Prop.POP_CK]
                cks.append(ck)
                msg = broker.message(ck)
                if msg is not None and not msg.delivered:
                    msg.delivered = True
                    if ledger.measuring:
                        ledger.latencies.append(now - msg.sent_at)
                        ledger.delivered += 1
                elif ledger.measuring:
                    ledger.redelivered += 1
            await broker.ack_batch(cks)

    async def produce(group: str, topic: str) -> None:
        while not stopping:
            if scn.send_interval is not None:
                gap = rng.uniform(*scn.send_interval)
            else:
                gap = rng.expovariate(scn.rate) if scn.rate > 0 else 3600.0
            await asyncio.sleep(gap)
            now = loop.time()
            broker = rng.choice(brokers)
            broker.put(SimMessage(next(msg_ids), (group, topic), broker.name, now, now))

    tasks = []
    for k in range(scn.sampled):
        group, topic = f"g{k}", f"t{k}"
        for proxy in _proxies_of(scn, k, rng):
            tasks.append(asyncio.ensure_future(consume(engines[proxy], group, topic)))
        if scn.rate > 0 or scn.send_interval is not None:
            tasks.append(asyncio.ensure_future(produce(group, topic)))

    await asyncio.sleep(scn.warmup_s)
    for b in brokers:
        b.reset_stats()
    tally = _Tally()  # the warm-up's counts dropped (consume() reads the name each time)
    ledger.measuring = True
    fabric.counting = True
    in_flight_samples: list[int] = []
    fleet_parked = {"notifications": 0, "pops": 0}
    steps = 40
    for _ in range(steps):
        await asyncio.sleep(scn.measure_s / steps)
        in_flight_samples.append(max(e.in_flight_total for e in engines))
        for kind in fleet_parked:
            total = sum(getattr(b, kind).size for b in brokers)
            fleet_parked[kind] = max(fleet_parked[kind], total)
    ledger.measuring = False
    fabric.counting = False
    out = _summary(scn, brokers, ledger, tally, in_flight_samples)
    # between proxies (shared): what each proxy sends, scaled to the fleet's keys
    per_proxy = scn.scale / scn.proxies / scn.measure_s
    out["peer_messages_per_proxy_per_s"] = round(sum(fabric.messages.values()) * per_proxy, 1)
    out["peer_bytes_per_proxy_per_s"] = round(fabric.bytes * per_proxy)
    out["peer_messages"] = {k: round(v * per_proxy, 1) for k, v in fabric.messages.items()}
    out["fallbacks"] = sum(e.shared.fallbacks for e in engines if e.shared is not None)
    # on all brokers together, the most seen at any of the 40 sampling moments (scaled)
    out["fleet_parked_notifications"] = round(fleet_parked["notifications"] * scn.scale)
    out["fleet_parked_pops"] = round(fleet_parked["pops"] * scn.scale)

    stopping = True
    for engine in engines:
        engine.stop_polls()
    for task in tasks:
        task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    # A consumer or producer that died of anything but its cancellation is a defect of the
    # simulation (or of the proxy code it plays): never report numbers made without it.
    failures = [
        o
        for o in outcomes
        if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError)
    ]
    if failures:
        raise RuntimeError(f"{len(failures)} simulated clients failed") from failures[0]
    for engine in engines:
        await engine.close()
        await engine.consumer.close(grace_s=0.1)
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _summary(scn, brokers, ledger, tally, in_flight_samples) -> dict:
    s = scn.scale
    t = scn.measure_s
    n_b = len(brokers)
    req_keys = brokers[0].requests.keys()
    requests = {k: sum(b.requests[k] for b in brokers) for k in req_keys}
    total_requests = sum(requests.values())
    lat = ledger.latencies

    def ms(x):
        return None if x is None else round(x * 1000, 1)

    return {
        "scenario": {k: v for k, v in asdict(scn).items() if k != "extra"} | scn.extra,
        # per broker, scaled to the whole fleet's keys
        "parked_notifications_mean": round(
            statistics.mean(b.notifications.mean_size(t) for b in brokers) * s
        ),
        "parked_notifications_max": round(max(b.notifications.max_size for b in brokers) * s),
        "parked_pops_mean": round(statistics.mean(b.pops.mean_size(t) for b in brokers) * s),
        "parked_pops_max": round(max(b.pops.max_size for b in brokers) * s),
        "polling_full_per_s": round(
            sum(b.pops.refused + b.notifications.refused for b in brokers) * s / n_b / t, 1
        ),
        "polling_full_per_key_limit_per_s": round(
            sum(b.pops.refused_per_key + b.notifications.refused_per_key for b in brokers)
            * s
            / n_b
            / t,
            1,
        ),
        "broker_requests_per_s": round(total_requests * s / n_b / t, 1),
        "requests": {k: round(v * s / n_b / t, 1) for k, v in requests.items()},
        # per delivered message and per poll
        "delivered": ledger.delivered,
        "redelivered": ledger.redelivered,
        "broker_requests_per_message": (
            round(total_requests / ledger.delivered, 2) if ledger.delivered else None
        ),
        "receives": tally.receives,
        "empties": tally.empties,
        "false_empties": tally.false_empties,
        "too_many_requests_per_s": round(tally.too_many * s / t, 1),
        "latency_ms": {
            "p50": ms(_pct(lat, 0.5)),
            "p99": ms(_pct(lat, 0.99)),
            "max": ms(max(lat) if lat else None),
        },
        # per proxy, scaled
        "polls_per_proxy_max": round(statistics.mean(in_flight_samples) * s),
    }


def run(scn: Scenario) -> dict:
    """Play ``scn``; the summary, with the wall time it took."""
    logging.getLogger("proxy").setLevel(logging.WARNING)
    started = time.perf_counter()
    out = vloop.run(_play(scn))
    out["wall_s"] = round(time.perf_counter() - started, 2)
    return out
