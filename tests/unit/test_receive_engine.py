"""The heart of the proxy, pinned with scripted brokers: ReceiveEngine in notify mode, with
its PollContext and the shared ProbeHub, against fakes of the broker clients (the
integration and conformance suites run the same code against stubs and real RocketMQ).

Each scripted broker answers POP with the messages it holds (after ``pop_delay_s``) and
NOTIFICATION with hasMsg once it holds some, else at the end of the probe's poll time, as
a broker parks a probe. What the tests pin: the first pop (to the named broker, a
short-polling hit when it has messages); a probe to every broker otherwise; the hasMsg that
wakes the poll pops *that* broker; a pop that answers after the poll has answered is
handed back; a poll with nothing anywhere answers empty at its deadline, not later; the
in-flight limit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from proxy.brokers import BrokerRoute, TopicRoute
from proxy.config import ReceiveConfig, ReceiveMode
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.engine import ReceiveEngine, TooManyRequests
from proxy.receive.types import ReceiveRequest
from proxy.remoting.broker_client import NotificationResult, PopResult
from proxy.remoting.message import MessageExt, Prop
from proxy.remoting.popinfo import PopCheckpointInfo
from tests.support.waits import wait_until

PERM_READ_WRITE = 6


def message(broker: str, offset: int) -> MessageExt:
    ck = PopCheckpointInfo(0, 1, 30_000, 0, 0, broker, 0, offset).encode()
    return MessageExt(
        topic="T", body=b"x", properties={Prop.POP_CK: ck, Prop.UNIQ_KEY: f"{broker}-{offset}"}
    )


@dataclass
class ScriptedBroker:
    name: str
    holds: list[MessageExt] = field(default_factory=list)
    pop_delay_s: float = 0.0
    pops: int = 0
    probes: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, msg: MessageExt) -> None:
        self.holds.append(msg)
        self.arrived.set()

    async def pop(self, group, topic, *, max_nums, poll_ms=0, on_late=None, **_):
        self.pops += 1
        await asyncio.sleep(self.pop_delay_s)
        taken, self.holds = self.holds[:max_nums], self.holds[max_nums:]
        if not self.holds:
            self.arrived.clear()
        return PopResult(code=0, messages=taken)

    async def notification(self, group, topic, *, poll_ms=0, order=False, timeout=None, **_):
        self.probes += 1
        if not self.holds:
            try:
                await asyncio.wait_for(self.arrived.wait(), poll_ms / 1000)
            except TimeoutError:
                return NotificationResult(has_msg=False)
        return NotificationResult(has_msg=True)


class Pool:
    def __init__(self, *brokers: ScriptedBroker) -> None:
        self.brokers = {b.name: b for b in brokers}

    async def route(self, topic: str) -> TopicRoute:
        routes = tuple(BrokerRoute(n, f"{n}:10911", 4, 4, PERM_READ_WRITE) for n in self.brokers)
        return TopicRoute(topic, routes)

    def broker(self, name: str) -> ScriptedBroker | None:
        return self.brokers.get(name)


class Consumer(ConsumerProcessor):
    """The processor with its broker calls recorded instead of made."""

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool, broker_timeout_s=1.0, hand_back_invisible_ms=100)  # type: ignore[arg-type]
        self.back: list[tuple[str, str]] = []

    def hand_back(self, messages, reason, invisible_ms=None):
        self.back.extend((m.msg_id, reason) for m in messages)


@pytest.fixture
async def engine_for():
    engines: list[ReceiveEngine] = []

    def make(*brokers: ScriptedBroker, **settings) -> ReceiveEngine:
        pool = Pool(*brokers)
        config = ReceiveConfig(mode=ReceiveMode.NOTIFY, **settings)
        engine = ReceiveEngine(config, pool, Consumer(pool), ProxyMetrics())  # type: ignore[arg-type]
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.close()


def request(polling_s: float = 2.0, broker: str | None = "a") -> ReceiveRequest:
    now = asyncio.get_running_loop().time()
    return ReceiveRequest(
        group="G",
        topic="T",
        expression="*",
        batch_size=16,
        invisible_ms=30_000,
        polling_ms=int(polling_s * 1000),
        answer_by=now + polling_s,
        arrived_at=now,
        broker_hint=broker,
    )


def ids(result) -> list[str]:
    return [m.message.msg_id for m in result.messages]


async def test_the_first_pop_goes_to_the_named_broker_and_a_find_is_a_hit(engine_for):
    a, b = ScriptedBroker("a"), ScriptedBroker("b", holds=[message("b", 1)])
    engine = engine_for(a, b)

    result = await engine.receive(request(broker="b"))

    assert ids(result) == ["b-1"]
    assert result.is_short_polling_hit and result.pops == 1 and result.probes == 0
    assert (a.pops, a.probes, b.probes) == (0, 0, 0)


async def test_an_empty_first_pop_probes_every_broker_and_pops_the_one_that_has_msg(engine_for):
    a, b, c = ScriptedBroker("a"), ScriptedBroker("b"), ScriptedBroker("c")
    engine = engine_for(a, b, c)
    loop = asyncio.get_running_loop()
    poll = asyncio.ensure_future(engine.receive(request(polling_s=5.0)))
    await wait_until(lambda: engine.hub.probes_in_flight == 3)
    assert (a.probes, b.probes, c.probes) == (1, 1, 1)

    c.put(message("c", 7))
    sent = loop.time()
    result = await asyncio.wait_for(poll, 5)

    assert ids(result) == ["c-7"]
    assert not result.is_short_polling_hit
    assert (a.pops, b.pops, c.pops) == (1, 0, 1)  # the first pop (a), then the woken broker
    assert result.pops == 2 and result.probes == 3
    assert loop.time() - sent < 2.5  # woken, not waiting out the 5 s poll


async def test_a_pop_answering_after_the_poll_stopped_waiting_is_handed_back(engine_for):
    """b says hasMsg, but its pop is slower than the poll's time and the broker timeout
    both: the poll answers empty, and the message that pop brings later goes back at
    once. (A pop within the broker timeout is waited for, past the poll's time: a late
    answer delivered beats a hand-back, docs/design.md.)"""
    a, b = ScriptedBroker("a"), ScriptedBroker("b", pop_delay_s=0.8)
    engine = engine_for(a, b, broker_timeout_s=0.2)
    b.put(message("b", 3))

    result = await engine.receive(request(polling_s=0.3))

    assert result.messages == [] and b.pops == 1
    consumer = engine.consumer
    await wait_until(lambda: bool(consumer.back), timeout=3)
    assert consumer.back == [("b-3", "deadline")]


async def test_nothing_anywhere_answers_empty_at_the_deadline(engine_for):
    engine = engine_for(ScriptedBroker("a"), ScriptedBroker("b"))
    loop = asyncio.get_running_loop()
    started = loop.time()

    result = await engine.receive(request(polling_s=0.4))
    took = loop.time() - started

    assert result.messages == [] and not result.is_short_polling_hit
    assert 0.35 <= took < 1.5, took  # at its deadline (0.4 s): not early, not much later
    assert engine.in_flight_total == 0 and engine.hub.watchers == 0


async def test_polls_past_the_in_flight_limit_are_refused(engine_for):
    engine = engine_for(ScriptedBroker("a"), max_in_flight=1)
    first = asyncio.ensure_future(engine.receive(request(polling_s=1.0)))
    await wait_until(lambda: engine.in_flight_total == 1)

    with pytest.raises(TooManyRequests):
        await engine.receive(request(polling_s=1.0))

    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert engine.in_flight_total == 0


async def test_polls_of_one_key_share_one_probe_per_broker(engine_for):
    """Probes are the hub's, not the poll's: ten polls of (G, T) park one NOTIFICATION per
    broker between them, and the one message a broker gets wakes them all to pop it."""
    a, b = ScriptedBroker("a"), ScriptedBroker("b")
    engine = engine_for(a, b)
    polls = [asyncio.ensure_future(engine.receive(request(polling_s=3.0))) for _ in range(10)]
    await wait_until(lambda: engine.hub.watchers == 20)

    assert (a.probes, b.probes) == (1, 1) and engine.hub.probes_in_flight == 2
    b.put(message("b", 9))
    await wait_until(lambda: any(p.done() for p in polls), timeout=2.5)
    done = [p.result() for p in polls if p.done()]
    assert [ids(r) for r in done if r.messages] == [["b-9"]]  # delivered once

    for p in polls:
        p.cancel()
    await asyncio.gather(*polls, return_exceptions=True)
