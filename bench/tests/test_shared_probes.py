"""The shared probe hub (proxy/receive/shared.py): three proxies' real receive engines on
simulated brokers and simulated links between them (bench/sim), on simulated time.

One prober per key: a poll on a proxy that does not own its key is heard through the
owner's probes, and a broker holds one NOTIFICATION for the key, not one per proxy. When
the owner cannot be heard (silent, its link down, dead, replaced), the poll's proxy probes
for itself within ``fallback_s``, and no message is lost or waits past the poll."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from bench.sim import vloop
from bench.sim.brokers import FleetLedger, SimBroker, SimMessage, SimPool
from bench.sim.fleet import _NullMetrics
from bench.sim.peers import SimFabric
from proxy.brokers import BrokerPool
from proxy.config import ReceiveConfig, ReceiveMode
from proxy.fleet.members import owner_of
from proxy.fleet.messages import PeerKind, PeerMessage
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.engine import ReceiveEngine
from proxy.receive.probes import ProbeHub
from proxy.receive.shared import DEFAULT_FALLBACK_S, HOLD_S, LINGER_S, SharedProbeHub
from proxy.receive.types import ReceiveRequest, ReceiveResult
from testkit.waits import wait_until

IDS = ["proxy-a", "proxy-b", "proxy-c"]
GROUP, TOPIC = "G", "T"
OWNER = owner_of(IDS, GROUP, TOPIC)
SUBSCRIBER = next(i for i in IDS if i != OWNER)


@dataclass
class Fleet:
    fabric: SimFabric
    brokers: list[SimBroker]
    engines: dict[str, ReceiveEngine]
    ids = iter(range(1, 1 << 30))

    def parked(self) -> list[int]:
        """NOTIFICATIONs parked on each broker."""
        return [b.notifications.size for b in self.brokers]

    def put(self, broker: int = 0) -> SimMessage:
        now = asyncio.get_running_loop().time()
        msg = SimMessage(next(self.ids), (GROUP, TOPIC), self.brokers[broker].name, now, now)
        self.brokers[broker].put(msg)
        return msg

    def poll(self, proxy: str, await_s: float = 20.0) -> asyncio.Future[ReceiveResult]:
        now = asyncio.get_running_loop().time()
        req = ReceiveRequest(
            group=GROUP, topic=TOPIC, expression="*", batch_size=32, invisible_ms=30_000,
            polling_ms=int(await_s * 1000), answer_by=now + await_s, arrived_at=now,
            broker_hint=self.brokers[0].name,
        )  # fmt: skip
        return asyncio.ensure_future(self.engines[proxy].receive(req))


def on_fleet(test: Callable[[Fleet], Awaitable[None]]) -> None:
    async def play() -> None:
        ledger = FleetLedger()
        brokers = [SimBroker(f"broker-{b}", ledger) for b in range(3)]
        pool = cast(BrokerPool, SimPool(brokers))
        fabric = SimFabric(IDS, hop_s=0.0005)
        config = ReceiveConfig(mode=ReceiveMode.NOTIFY)
        engines = {}
        for proxy_id in IDS:
            processor = ConsumerProcessor(pool, broker_timeout_s=3.0, hand_back_invisible_ms=1000)
            engine = ReceiveEngine(
                config, pool, processor, cast(ProxyMetrics, _NullMetrics()),
                clock=asyncio.get_running_loop().time, links=fabric.links(proxy_id),
            )  # fmt: skip
            assert engine.shared is not None
            fabric.hubs[proxy_id] = engine.shared
            engines[proxy_id] = engine
        try:
            await test(Fleet(fabric, brokers, engines))
        finally:
            for engine in engines.values():
                engine.stop_polls()
            for engine in engines.values():
                await engine.close()
                await engine.consumer.close(grace_s=0.1)

    vloop.run(play())


async def heard(poll: asyncio.Future[ReceiveResult], msg: SimMessage, within: float) -> float:
    """The poll answers with ``msg`` within ``within`` s of the message; how long it took."""
    loop = asyncio.get_running_loop()
    result = await asyncio.wait_for(poll, within)
    assert [m.broker for m in result.messages] == [msg.broker]
    return loop.time() - msg.sent_at


def test_polls_on_every_proxy_park_one_notification_per_broker_and_each_message_wakes_one():
    async def test(fleet: Fleet) -> None:
        polls = [fleet.poll(p) for p in IDS for _ in range(2)]
        await asyncio.sleep(1)  # simulated time: a whole fallback window, counts settled
        assert fleet.parked() == [1, 1, 1]  # not one per proxy: three without sharing
        subscriber = fleet.engines[SUBSCRIBER].shared
        assert subscriber is not None and subscriber.fallbacks == 0
        msg = fleet.put(broker=1)
        # Simulated time: 200 hops, room for a second poll to be woken if one wrongly were.
        await asyncio.sleep(0.1)
        answered = [p for p in polls if p.done()]
        assert len(answered) == 1  # one message, one poll woken fleet-wide
        assert [m.broker for m in answered[0].result().messages] == [msg.broker]
        assert fleet.parked() == [1, 1, 1]  # probing again for the five still waiting

    on_fleet(test)


def test_a_subscriber_hears_through_the_owner_within_two_hops():
    async def test(fleet: Fleet) -> None:
        poll = fleet.poll(SUBSCRIBER)
        await asyncio.sleep(1)  # simulated time: a whole fallback window, counts settled
        assert fleet.parked() == [1, 1, 1]
        took = await heard(poll, fleet.put(broker=2), within=1)
        # The owner's probe answer, a WAKE (one hop), the subscriber's pop.
        assert took < 0.01, took
        hub = fleet.engines[SUBSCRIBER].shared
        assert hub is not None
        assert (hub.sent[PeerKind.WATCH], hub.sent[PeerKind.DONE]) == (1, 1)

    on_fleet(test)


def test_a_silent_owner_costs_at_most_the_fallback():
    async def test(fleet: Fleet) -> None:
        fleet.fabric.silent.add(OWNER)  # a partition: sends succeed, nothing arrives
        poll = fleet.poll(SUBSCRIBER)
        await asyncio.sleep(0.1)  # simulated time: the message comes mid-poll, not with it
        msg = fleet.put(broker=0)
        took = await heard(poll, msg, within=DEFAULT_FALLBACK_S + 1)
        assert took <= DEFAULT_FALLBACK_S + 0.05, took
        hub = fleet.engines[SUBSCRIBER].shared
        assert hub is not None and hub.fallbacks == 1

    on_fleet(test)


def test_an_owner_killed_mid_poll_costs_nothing_once_its_link_drops():
    async def test(fleet: Fleet) -> None:
        poll = fleet.poll(SUBSCRIBER)
        await asyncio.sleep(1)  # simulated time: a whole fallback window, counts settled
        # SIGKILL: the owner's probes end with its connections, its link goes down.
        owner = fleet.engines[OWNER]
        owner.stop_polls()
        await owner.close()
        fleet.fabric.down.add(OWNER)
        for proxy_id, hub in fleet.fabric.hubs.items():
            if proxy_id != OWNER:
                hub.peer_lost(OWNER)
        # The subscriber's own probes now (the dead owner's stay parked on the brokers
        # until their poll time ends, as a real broker keeps them).
        local = fleet.engines[SUBSCRIBER].hub
        await wait_until(
            lambda: local.probes_in_flight == 3, timeout=0.01, step=0.001, what="own probes"
        )
        took = await heard(poll, fleet.put(broker=1), within=1)
        assert took < 0.01, took

    on_fleet(test)


def test_an_owner_change_moves_the_key_without_a_gap():
    async def test(fleet: Fleet) -> None:
        poll = fleet.poll(SUBSCRIBER)
        await asyncio.sleep(1)  # simulated time: a whole fallback window, counts settled
        fleet.fabric.ids = [i for i in IDS if i != OWNER]  # the owner leaves the members
        for hub in fleet.fabric.hubs.values():
            hub.members_changed()
        await heard(poll, fleet.put(broker=0), within=0.1)
        # The next poll subscribes at the new owner (or is it).
        again = fleet.poll(SUBSCRIBER)
        await asyncio.sleep(1)  # simulated time: a whole fallback window, counts settled
        await heard(again, fleet.put(broker=2), within=0.1)

    on_fleet(test)


def test_a_subscriber_leaves_after_its_last_poll_and_the_owner_stops_probing_for_it():
    async def test(fleet: Fleet) -> None:
        poll = fleet.poll(SUBSCRIBER, await_s=2)
        await asyncio.sleep(1)  # simulated time: a whole fallback window, counts settled
        assert fleet.parked() == [1, 1, 1]
        result = await asyncio.wait_for(poll, 2)
        assert result.messages == []
        await asyncio.sleep(LINGER_S + 0.5)  # simulated: the linger runs out, UNWATCH goes
        owner = fleet.engines[OWNER].shared
        assert owner is not None and owner.watchers == 0  # the UNWATCH arrived
        sent = owner.probes_sent
        # Its parked probes end with their poll time (at most 20 s) and are not sent again.
        await asyncio.sleep(20)  # simulated: the longest poll time (20 s) runs out
        assert fleet.parked() == [0, 0, 0]
        assert owner.probes_sent == sent

    on_fleet(test)


class RecordingLinks:
    """Links that only record what the hub sends (the owner is ``proxy-b``)."""

    self_id = "proxy-a"

    def __init__(self) -> None:
        self.sent: list[PeerMessage] = []

    def members(self) -> list[str]:
        return ["proxy-a", "proxy-b"]

    def send(self, peer: str, message: PeerMessage) -> bool:
        self.sent.append(message)
        return True


def test_a_wake_for_a_broker_no_poll_watches_now_waits_for_the_next_that_does():
    """A poll pauses after an empty pop of a broker before watching it again; a WAKE for
    that broker meanwhile is held for it, not handed back at once (the owner would probe
    again, hear the same message and wake this proxy again, in a loop), and handed back
    with DONE if no poll of that broker comes within HOLD_S."""
    group = next(
        f"g{i}" for i in range(100) if owner_of(["proxy-a", "proxy-b"], f"g{i}", "t") == "proxy-b"
    )

    async def play() -> None:
        links = RecordingLinks()
        pool = cast(BrokerPool, SimPool([]))
        hub = SharedProbeHub(ProbeHub(pool), links)
        loop = asyncio.get_running_loop()
        woken: list[str] = []
        deadline = loop.time() + 20
        other = hub.watch(("b1", group, "t"), deadline, woken.append, lambda _broker: None)
        paused = hub.watch(("b0", group, "t"), deadline, woken.append, lambda _broker: None)
        await asyncio.sleep(0)  # one loop turn: the WATCH goes
        hub.release(paused, missed=True)  # its pop of b0 found nothing: a pause
        hub.receive("proxy-b", PeerMessage(PeerKind.WAKE, group, "t", ("b0",)))
        await asyncio.sleep(0.1)  # simulated: the WAKE is held, not delivered nor handed back
        assert woken == [] and not [m for m in links.sent if m.kind is PeerKind.DONE]
        again = hub.watch(("b0", group, "t"), deadline, woken.append, lambda _broker: None)
        await asyncio.sleep(0)  # one loop turn: the held WAKE is handed over with a call_soon
        assert woken == ["b0"]  # the held WAKE, to the poll that watches b0 again
        hub.release(again)
        assert [m.kind for m in links.sent][-1] is PeerKind.DONE
        # No poll of b0 comes: handed back after HOLD_S.
        hub.receive("proxy-b", PeerMessage(PeerKind.WAKE, group, "t", ("b0",)))
        before = len(links.sent)
        await asyncio.sleep(HOLD_S + 0.01)  # simulated: the hold runs out, DONE goes back
        assert [m.kind for m in links.sent[before:]] == [PeerKind.DONE]
        hub.release(other)
        await hub.close()

    vloop.run(play())
