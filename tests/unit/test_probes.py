"""The probe hub: one probe per key shared by its watchers, one hasMsg for one watcher, a
probe as long as the longest watch, turns when probes per broker are capped, and recovery
from a probe loop that fails (its watchers still hear hasMsg)."""

from __future__ import annotations

import asyncio

from proxy.receive.probes import ProbeHub, Watch
from proxy.remoting.answers import NotificationResult
from testkit.waits import wait_until
from tests.support.scripted import Pool, ScriptedBroker, message


class _Broker:
    """A broker client that always has a message."""

    async def notification(self, group, topic, *, poll_ms, order, timeout):
        return NotificationResult(has_msg=True, polling_full=False)


class _PoolWithADefect:
    """A pool whose first look-up raises what no broker error would: a defect in our
    code. This is the only way to make the loop itself fail; the probes after it are
    real hub code."""

    def __init__(self) -> None:
        self.lookups = 0

    def broker(self, name):
        self.lookups += 1
        if self.lookups == 1:
            raise RuntimeError("a defect")
        return _Broker()


async def test_a_probe_that_raises_is_logged_reported_and_started_again(caplog):
    outcomes: list[tuple[str, str]] = []
    hub = ProbeHub(
        _PoolWithADefect(),  # type: ignore[arg-type]
        error_backoff_s=0.05,
        on_result=lambda broker, outcome: outcomes.append((broker, outcome)),
    )
    loop = asyncio.get_running_loop()
    heard: asyncio.Future[str] = loop.create_future()

    def hear(broker: str) -> None:
        if not heard.done():
            heard.set_result(broker)

    hub.watch(("broker-a", "g", "t"), loop.time() + 5, hear, lambda _broker: None)
    try:
        assert await asyncio.wait_for(heard, 2) == "broker-a"
    finally:
        await hub.close()
    assert outcomes[0] == ("broker-a", "error")
    assert "probe of ('broker-a', 'g', 't') failed" in caplog.text


# -- sharing and fairness, on scripted brokers ------------------------------------------------


class Heard:
    """A watcher's callbacks: the brokers it heard hasMsg from, the probes sent for it."""

    def __init__(self) -> None:
        self.brokers: list[str] = []
        self.probes = 0

    def has_msg(self, broker: str) -> None:
        self.brokers.append(broker)

    def probe_sent(self, broker: str) -> None:
        self.probes += 1


def watch(hub: ProbeHub, broker: str, seconds: float, topic: str = "t") -> tuple[Watch, Heard]:
    heard = Heard()
    deadline = asyncio.get_running_loop().time() + seconds
    return hub.watch((broker, "g", topic), deadline, heard.has_msg, heard.probe_sent), heard


async def test_one_has_msg_wakes_the_oldest_watcher_and_the_next_probe_waits_for_its_pop():
    b = ScriptedBroker("b")
    hub = ProbeHub(Pool(b).as_broker_pool(), broker_timeout_s=2.0)
    try:
        first, heard_first = watch(hub, "b", 5)
        second, heard_second = watch(hub, "b", 5)
        await wait_until(lambda: b.probes == 1)
        assert hub.probes_in_flight == 1 and heard_first.probes == 1

        b.put(message("b", 1))
        await wait_until(lambda: heard_first.brokers == ["b"])
        await asyncio.sleep(0.1)  # room for a wrong wake or probe: none may come in it
        assert heard_second.brokers == [] and b.probes == 1  # waiting for the first's pop

        b.holds.clear()  # the first watcher popped it
        b.arrived.clear()
        hub.release(first)
        await wait_until(lambda: b.probes == 2)  # probing again, for the second
        assert heard_second.brokers == []
        hub.release(second)
    finally:
        await hub.close()
    assert hub.watchers == 0 and hub.probes_in_flight == 0


async def test_a_probe_is_held_as_long_as_its_longest_watcher_and_no_longer():
    b = ScriptedBroker("b")
    hub = ProbeHub(Pool(b).as_broker_pool(), broker_timeout_s=1.0)
    try:
        short, _ = watch(hub, "b", 0.2)
        await wait_until(lambda: b.probes == 1)
        long, _ = watch(hub, "b", 0.8)
        # The probe parked for the short watch ends at 0.2 s; the long one gets another.
        await wait_until(lambda: b.probes == 2, timeout=2)
        await wait_until(lambda: hub.probes_in_flight == 0, timeout=2)
        assert b.probes == 2  # nothing probed past the last deadline
        # The last probe may answer a moment before the long deadline (its poll time is
        # whole milliseconds) and end with that watch still listed; the poll's release
        # takes it out, as a NotifyPoll does when it answers.
        hub.release(short)
        hub.release(long)
        assert hub.watchers == 0
    finally:
        await hub.close()


async def test_with_one_probe_per_broker_keys_take_turns():
    """max_per_broker=1: the second key waits in the broker's queue, and the first gives
    its place up after slice_s, so both are probed within a few slices."""
    b = ScriptedBroker("b")
    hub = ProbeHub(Pool(b).as_broker_pool(), max_per_broker=1, slice_s=0.2)
    try:
        _, heard_one = watch(hub, "b", 5, topic="t1")
        _, heard_two = watch(hub, "b", 5, topic="t2")
        await wait_until(lambda: heard_one.probes == 1)
        assert heard_two.probes == 0 and hub.probes_in_flight == 1

        await wait_until(lambda: heard_two.probes >= 1, timeout=2)  # its turn came
        await wait_until(lambda: heard_one.probes >= 2, timeout=2)  # and back again
        assert hub.probes_in_flight <= 1
    finally:
        await hub.close()


async def test_a_lingering_probe_stays_parked_for_the_next_poll_and_stops_on_an_unheard_message():
    """linger_s: once its last watch is released, the key's probe is sent again and stays
    parked, so the consumer's next poll finds it (and skips its first pop); a message it
    hears with nobody watching ends it, for that next poll's first pop to take."""
    b = ScriptedBroker("b")
    hub = ProbeHub(Pool(b).as_broker_pool(), max_poll_ms=20_000, linger_s=2.0)
    try:
        first, heard = watch(hub, "b", 5)
        await wait_until(lambda: hub.parked(("b", "g", "t")))
        b.put(message("b", 1))
        await wait_until(lambda: heard.brokers == ["b"])
        b.holds.clear()  # popped
        b.arrived.clear()
        hub.release(first)  # the poll answered: nobody watches now

        await wait_until(lambda: b.probes == 2 and hub.parked(("b", "g", "t")))
        second, heard_second = watch(hub, "b", 5)
        assert b.probes == 2  # the next poll joins the parked probe: no request
        hub.release(second)

        b.put(message("b", 2))  # nobody watching
        await wait_until(lambda: hub.probes_in_flight == 0)
        assert b.probes == 2 and not hub.parked(("b", "g", "t"))
        assert heard_second.brokers == []
    finally:
        await hub.close()


async def test_without_linger_a_probe_ends_with_its_last_poll():
    b = ScriptedBroker("b")
    hub = ProbeHub(Pool(b).as_broker_pool(), linger_s=0.0)
    try:
        only, heard = watch(hub, "b", 5)
        await wait_until(lambda: hub.parked(("b", "g", "t")))
        b.put(message("b", 1))
        await wait_until(lambda: heard.brokers == ["b"])
        hub.release(only)
        await wait_until(lambda: hub.probes_in_flight == 0)
        assert b.probes == 1
    finally:
        await hub.close()
