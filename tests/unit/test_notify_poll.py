"""NotifyPoll, the long-polling task of pop-with-notify, on scripted brokers: the first
pop, the watch on every broker, the pop of the broker that said hasMsg, the pauses after
empty pops (a real broker says hasMsg for messages a tag filter then drops), the cap on
probes, and no watch left behind, nor the poll itself."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import pytest

from proxy.receive.context import PollContext
from proxy.receive.misses import MissMemory
from proxy.receive.notify import NotifyPoll
from proxy.receive.probes import ProbeHub
from testkit.waits import wait_until
from tests.support.scripted import Pool, ScriptedBroker, message, request


@pytest.fixture
async def hub_for():
    hubs: list[ProbeHub] = []

    def make(pool: Pool) -> ProbeHub:
        hub = ProbeHub(pool.as_broker_pool(), broker_timeout_s=1.0)
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        await hub.close()


async def context(
    pool: Pool, polling_s: float, hint: str = "a", *, fifo: bool = False
) -> PollContext:
    req = request(polling_s, hint)
    req.fifo = fifo
    route = await pool.route(req.topic)
    return PollContext(req, route, pool.as_broker_pool(), lambda *_: None, 0, 1.0)


def ids(messages) -> list[str]:
    return [m.message.msg_id for m in messages]


async def test_a_first_pop_that_finds_messages_watches_nothing(hub_for):
    a, b = ScriptedBroker("a", holds=[message("a", 1)]), ScriptedBroker("b")
    pool = Pool(a, b)
    hub = hub_for(pool)
    ctx = await context(pool, 2.0)

    got = await NotifyPoll(ctx, hub, MissMemory(), max_probes=8).run()

    assert ids(got) == ["a-1"] and ctx.short_polling_hit
    assert hub.probes_sent == 0 and (a.probes, b.probes) == (0, 0)


async def test_the_broker_that_says_has_msg_is_popped_and_every_watch_is_released(hub_for):
    a, b, c = ScriptedBroker("a"), ScriptedBroker("b"), ScriptedBroker("c")
    pool = Pool(a, b, c)
    hub = hub_for(pool)
    ctx = await context(pool, 5.0)
    poll = asyncio.ensure_future(NotifyPoll(ctx, hub, MissMemory(), max_probes=8).run())
    await wait_until(lambda: hub.watchers == 3)

    b.put(message("b", 4))
    got = await asyncio.wait_for(poll, 3)

    assert ids(got) == ["b-4"] and not ctx.short_polling_hit
    assert (a.pops, b.pops, c.pops) == (1, 1, 0)  # the first pop, then the one that fired
    assert ctx.probes == 3 and hub.watchers == 0


async def test_empty_pops_after_has_msg_are_paced_and_remembered_for_the_next_poll(hub_for):
    """b says hasMsg for everything (filtered traffic) and its pops find nothing. Probing
    again at once after every empty pop would pop it hundreds of times a second; the poll
    pauses longer after each miss (notify.MISS_BACKOFF_S: 0, 0.05, 0.1, 0.2, 0.4 s), and
    the next poll of the subscription starts from the pause it reached."""
    a, b = ScriptedBroker("a"), ScriptedBroker("b", always_has_msg=True)
    pool = Pool(a, b)
    hub = hub_for(pool)
    misses = MissMemory()

    ctx = await context(pool, 1.2)
    assert await NotifyPoll(ctx, hub, misses, max_probes=100).run() == []
    # Misses at about 0, 0, 0.05, 0.15, 0.35, 0.75 and 1.15 s: seven, not hundreds.
    assert 4 <= b.pops <= 10, b.pops
    streak = misses.streak(("b", "G", "T", "*"), ctx.loop.time())
    assert streak == b.pops

    before = b.pops
    ctx = await context(pool, 0.5)
    assert await NotifyPoll(ctx, hub, misses, max_probes=100).run() == []
    assert 1 <= b.pops - before <= 2  # at the longest pause (0.4 s) from its first miss
    assert hub.watchers == 0


async def test_a_poll_sends_no_more_probes_than_its_cap(hub_for):
    b = ScriptedBroker("b", always_has_msg=True)
    pool = Pool(b)
    hub = hub_for(pool)
    ctx = await context(pool, 0.6, hint="b")
    loop = ctx.loop
    started = loop.time()

    assert await NotifyPoll(ctx, hub, MissMemory(), max_probes=2).run() == []

    assert ctx.probes == 2 and b.probes == 2
    assert b.pops == 3  # the first pop, and one after each hasMsg
    assert loop.time() - started >= 0.55  # then it waited out its time: no probe left
    assert hub.watchers == 0


async def test_a_message_arriving_while_a_broker_is_paused_is_still_found(hub_for):
    """A miss pauses the re-watch of that broker only: the other brokers' watches stay,
    and after the pause the paused broker is watched again."""
    a, b = ScriptedBroker("a"), ScriptedBroker("b", always_has_msg=True)
    c = ScriptedBroker("c")
    pool = Pool(a, b, c)
    hub = hub_for(pool)
    ctx = await context(pool, 3.0)
    poll = asyncio.ensure_future(NotifyPoll(ctx, hub, MissMemory(), max_probes=100).run())
    await wait_until(lambda: b.pops >= 3)  # b is missing, and pausing

    c.put(message("c", 2))
    got = await asyncio.wait_for(poll, 3)

    assert ids(got) == ["c-2"]
    assert hub.watchers == 0


async def test_a_poll_skips_its_first_pop_while_every_brokers_probe_is_parked(hub_for):
    """The probes of the first poll are parked on a and b: neither broker has anything for
    (G, T), so the second poll watches at once instead of popping b (its named broker)."""
    a, b = ScriptedBroker("a"), ScriptedBroker("b")
    pool = Pool(a, b)
    hub = hub_for(pool)
    misses = MissMemory()
    first_ctx = await context(pool, 5.0, hint="a")
    first = asyncio.ensure_future(NotifyPoll(first_ctx, hub, misses, max_probes=8).run())
    await wait_until(lambda: hub.parked(("a", "G", "T")) and hub.parked(("b", "G", "T")))
    assert (a.pops, b.pops) == (1, 0)

    second_ctx = await context(pool, 5.0, hint="b")
    second = asyncio.ensure_future(NotifyPoll(second_ctx, hub, misses, max_probes=8).run())
    await wait_until(lambda: hub.watchers == 4)
    assert (a.pops, b.pops) == (1, 0) and (a.probes, b.probes) == (1, 1)
    assert not second_ctx.short_polling_hit

    b.put(message("b", 5))
    done, _ = await asyncio.wait([first, second], timeout=3, return_when=asyncio.FIRST_COMPLETED)
    assert [ids(d.result()) for d in done] == [["b-5"]] and b.pops == 1
    for poll in (first, second):
        poll.cancel()
    await asyncio.gather(first, second, return_exceptions=True)


async def test_a_poll_pops_first_when_a_probe_is_not_parked(hub_for):
    """b's probe has answered hasMsg (its message is being popped by the first poll): a
    poll arriving then pops first, as nothing says b is empty."""
    a, b = ScriptedBroker("a"), ScriptedBroker("b", pop_delay_s=0.3)
    pool = Pool(a, b)
    hub = hub_for(pool)
    misses = MissMemory()
    first_ctx = await context(pool, 5.0, hint="a")
    first = asyncio.ensure_future(NotifyPoll(first_ctx, hub, misses, max_probes=8).run())
    await wait_until(lambda: hub.parked(("b", "G", "T")))
    b.put(message("b", 1))
    await wait_until(lambda: b.pops == 1)  # the first poll's pop, slow
    assert not hub.parked(("b", "G", "T"))

    second_ctx = await context(pool, 0.4, hint="a")
    assert await NotifyPoll(second_ctx, hub, misses, max_probes=8).run() == []
    assert a.pops == 2  # the second poll's first pop too
    assert ids(await asyncio.wait_for(first, 3)) == ["b-1"]


async def test_a_fifo_poll_always_pops_first(hub_for):
    """An orderly probe leaves out queues blocked by messages in flight: parked, it does
    not say that a pop would find nothing once they are acked."""
    a = ScriptedBroker("a")
    pool = Pool(a)
    hub = hub_for(pool)
    ctx = await context(pool, 5.0, fifo=True)
    first = asyncio.ensure_future(NotifyPoll(ctx, hub, MissMemory(), max_probes=8).run())
    await wait_until(lambda: hub.parked(("a", "G", "T")))

    ctx2 = await context(pool, 0.3, fifo=True)
    assert await NotifyPoll(ctx2, hub, MissMemory(), max_probes=8).run() == []
    assert a.pops == 2
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


def polls_alive() -> int:
    """NotifyPolls the collector can see: with automatic collection off, one that reference
    counting did not free (a reference cycle) stays among them."""
    return sum(1 for o in gc.get_objects() if isinstance(o, NotifyPoll))


@pytest.mark.parametrize("end", ["deadline", "cancelled", "found", "found_while_paused"])
async def test_a_poll_that_ends_is_freed_at_once_not_by_the_full_collection(hub_for, end):
    """However it ends, a poll holds nothing that holds it: the proxy runs a full collection
    only every gc_full_collection_s (proxy/collector.py), and a poll that was a reference
    cycle stayed in memory until then, 1.4 KB per poll (issue 58). ``found_while_paused``:
    it ends while the re-watch of a broker whose pop found nothing is pending."""
    a, b = ScriptedBroker("a"), ScriptedBroker("b", always_has_msg=end == "found_while_paused")
    pool = Pool(a, b)
    hub = hub_for(pool)
    gc.collect()
    gc.disable()
    try:
        before = polls_alive()
        ctx = await context(pool, 0.3 if end == "deadline" else 5.0)
        poll = asyncio.ensure_future(NotifyPoll(ctx, hub, MissMemory(), max_probes=100).run())
        await wait_until(lambda: hub.watchers >= 1)
        if end == "cancelled":
            poll.cancel()
        elif end == "found":
            a.put(message("a", 1))
        elif end == "found_while_paused":
            await wait_until(lambda: b.pops >= 4)  # its pauses are 0.05 s and longer now
            a.put(message("a", 1))
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(poll, 3)
        del poll
        # The loop's own step that resumed this test still holds the ended task's
        # CancelledError (and through its traceback the poll) until it returns: wait
        # for that, not for a collection, which stays off, so a cycle is never freed.
        await wait_until(lambda: polls_alive() == before, timeout=1.0, what="the poll freed")
    finally:
        gc.enable()
