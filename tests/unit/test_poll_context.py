"""PollContext, what every poll mode works through: which broker the first pop goes to,
the deadline every wait keeps, and the pop that is never lost (a pop the poll stops
waiting for hands back what it brings, with the reason it was left)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.processor.consumer import Popped
from proxy.receive.context import PollContext
from testkit.waits import wait_until
from tests.support.scripted import Pool, ScriptedBroker, message, request


class HandedBack(list[tuple[str, str]]):
    """The context's hand-back callback: (message id, reason) of each message."""

    def __call__(self, popped: list[Popped], reason: str) -> None:
        self.extend((p.msg_id, reason) for p in popped)


async def context(
    *brokers: ScriptedBroker,
    polling_s: float = 1.0,
    hint: str | None = "a",
    named_only: bool = False,
    index: int = 0,
    broker_timeout_s: float = 1.0,
) -> tuple[PollContext, HandedBack]:
    pool = Pool(*brokers)
    back = HandedBack()
    req = request(polling_s, hint, named_only=named_only)
    route = await pool.route(req.topic)
    ctx = PollContext(req, route, pool.as_broker_pool(), back, index, broker_timeout_s)
    return ctx, back


def names(brokers) -> list[str]:
    return [b.name for b in brokers]


def first(ctx: PollContext) -> str | None:
    broker = ctx.first_broker()
    return broker.name if broker is not None else None


async def test_the_first_pop_goes_to_the_named_broker_else_round_robin():
    a, b, c = ScriptedBroker("a"), ScriptedBroker("b"), ScriptedBroker("c")
    named, _ = await context(a, b, c, hint="b", index=2)
    assert first(named) == "b"

    for index, expected in [(0, "a"), (1, "b"), (2, "c"), (4, "b")]:
        ctx, _ = await context(a, b, c, hint=None, index=index)
        assert first(ctx) == expected
    unknown, _ = await context(a, b, c, hint="gone", index=1)
    assert first(unknown) == "b"  # a name not in the route: round robin
    assert names(unknown.brokers_from(unknown.brokers[2])) == ["c", "a", "b"]
    empty, _ = await context()
    assert first(empty) is None


async def test_a_push_consumer_poll_keeps_to_its_named_broker():
    a, b = ScriptedBroker("a"), ScriptedBroker("b")
    only_b, _ = await context(a, b, hint="b", named_only=True)
    assert names(only_b.brokers) == ["b"]
    # A named broker the route no longer has: every broker, rather than none.
    moved, _ = await context(a, b, hint="gone", named_only=True)
    assert names(moved.brokers) == ["a", "b"]


async def test_a_pop_returns_the_brokers_messages_and_counts_itself():
    a = ScriptedBroker("a", holds=[message("a", 1), message("a", 2)])
    ctx, back = await context(a)

    got = await ctx.pop(ctx.brokers[0])

    assert [m.message.msg_id for m in got] == ["a-1", "a-2"]
    assert {m.broker for m in got} == {"a"} and ctx.pops == 1 and back == []


async def test_a_broker_that_fails_or_is_unknown_gives_an_empty_pop_not_an_error():
    down = ScriptedBroker("a", holds=[message("a", 1)], down=True)
    ctx, back = await context(down)
    assert await ctx.pop(ctx.brokers[0]) == [] and ctx.pops == 1

    ctx, _ = await context(ScriptedBroker("a"))
    ctx.pool = Pool().as_broker_pool()  # the pool has lost the broker since the route
    assert await ctx.pop(ctx.brokers[0]) == [] and ctx.pops == 0
    assert back == []


async def test_a_pop_past_the_deadline_and_the_broker_timeout_is_handed_back_when_it_comes():
    slow = ScriptedBroker("a", holds=[message("a", 1)], pop_delay_s=0.6)
    ctx, back = await context(slow, polling_s=0.2, broker_timeout_s=0.1)
    loop = ctx.loop
    started = loop.time()

    assert await ctx.pop(ctx.brokers[0]) == []
    assert loop.time() - started < 0.5  # gave up at the broker timeout, not the pop's end

    await wait_until(lambda: back == [("a-1", "deadline")], timeout=3)


async def test_a_patient_pop_waits_out_the_poll_not_the_broker_timeout():
    """Sent to a broker that has just said hasMsg: slowness, not a hang (context.pop)."""
    slow = ScriptedBroker("a", holds=[message("a", 1)], pop_delay_s=0.3)
    ctx, back = await context(slow, polling_s=2.0, broker_timeout_s=0.1)

    got = await ctx.pop(ctx.brokers[0], patient=True)

    assert [m.message.msg_id for m in got] == ["a-1"] and back == []


async def test_a_cancelled_pop_hands_back_what_it_brings():
    slow = ScriptedBroker("a", holds=[message("a", 1)], pop_delay_s=0.3)
    ctx, back = await context(slow, polling_s=2.0)
    pop = asyncio.ensure_future(ctx.pop(ctx.brokers[0]))
    await wait_until(lambda: slow.pops == 1)

    pop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pop

    await wait_until(lambda: back == [("a-1", "cancelled")], timeout=3)


async def test_waits_end_at_the_deadline_or_at_once_on_stop():
    ctx, _ = await context(ScriptedBroker("a"), polling_s=0.3)
    loop = ctx.loop
    started = loop.time()
    assert await ctx.wait_has_msg() is False
    assert 0.25 <= loop.time() - started < 1.0
    assert ctx.remaining_s == 0.0

    ctx, _ = await context(ScriptedBroker("a"), polling_s=30.0)
    waiting = asyncio.ensure_future(ctx.wait_has_msg())
    await asyncio.sleep(0)  # one loop turn: the wait has begun, the stop ends it mid-wait
    ctx.stop()
    assert await asyncio.wait_for(waiting, 1) is False
    assert ctx.remaining_s == 0.0 and await ctx.pop(ctx.brokers[0], poll_ms=1000) == []


async def test_has_msg_wakes_the_wait():
    ctx, _ = await context(ScriptedBroker("a"), polling_s=30.0)
    waiting = asyncio.ensure_future(ctx.wait_has_msg())
    await asyncio.sleep(0)  # one loop turn: the wait has begun, hasMsg wakes it mid-wait
    ctx.has_msg("a")
    assert await asyncio.wait_for(waiting, 1) is True


async def test_wait_done_leaves_the_future_alone():
    ctx, _ = await context(ScriptedBroker("a"), polling_s=30.0)
    future: asyncio.Future[None] = ctx.loop.create_future()
    assert await ctx.wait_done(future, 0.05) is False
    assert not future.cancelled()  # still the caller's to finish
    ctx.loop.call_later(0.05, future.set_result, None)
    assert await ctx.wait_done(future, 5) is True


async def test_the_first_pops_outcome_is_told_once():
    ctx, _ = await context(ScriptedBroker("a"))
    heard: list[bool] = []
    ctx.on_first_pop = heard.append
    ctx.first_pop_done(True)
    ctx.first_pop_done(False)
    assert heard == [True] and ctx.short_polling_hit
