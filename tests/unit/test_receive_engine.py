"""The heart of the proxy, pinned with scripted brokers: ReceiveEngine in notify mode, with
its PollContext and the shared ProbeHub, against fakes of the broker clients (the
integration and conformance suites run the same code against stubs and real RocketMQ).

The scripted brokers are tests/support/scripted.py's. What the tests pin: the first pop
(to the named broker, a short-polling hit when it has messages); a probe to every broker
otherwise; the hasMsg that wakes the poll pops *that* broker; a pop that answers after the
poll has answered is handed back; a poll with nothing anywhere answers empty at its
deadline, not later; the in-flight limit.
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.config import ReceiveConfig, ReceiveMode
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.engine import ReceiveEngine, TooManyRequests
from testkit.waits import wait_until
from tests.support.scripted import Pool, ScriptedBroker, message, request


class Consumer(ConsumerProcessor):
    """The processor with its broker calls recorded instead of made."""

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool.as_broker_pool(), broker_timeout_s=1.0, hand_back_invisible_ms=100)
        self.back: list[tuple[str, str]] = []

    def hand_back(self, messages, reason, invisible_ms=None):
        self.back.extend((m.msg_id, reason) for m in messages)


@pytest.fixture
async def engine_for():
    engines: list[ReceiveEngine] = []

    def make(*brokers: ScriptedBroker, **settings) -> ReceiveEngine:
        pool = Pool(*brokers)
        config = ReceiveConfig(mode=ReceiveMode.NOTIFY, **settings)
        engine = ReceiveEngine(config, pool.as_broker_pool(), Consumer(pool), ProxyMetrics())
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.close()


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
