"""The renewer of push consumers' handles: renewal when due, the current checkpoint on
settle, hand-back when the client goes, the bound on state."""

from __future__ import annotations

import asyncio
import contextlib

from proxy.config import LimitsConfig
from proxy.processor.consumer import Popped
from proxy.processor.renewal import HandleRenewer
from proxy.remoting.popinfo import PopCheckpointInfo
from testkit.waits import wait_until


class _Broker:
    def __init__(self) -> None:
        self.changes: list[tuple[str, int]] = []

    async def change_invisible_time(
        self, group, topic, extra_info, invisible_ms, timeout, lite_topic=None
    ):
        self.changes.append((extra_info, invisible_ms))
        old = PopCheckpointInfo.parse(extra_info)
        return PopCheckpointInfo(
            old.queue_offset, NOW[0], invisible_ms, old.revive_qid, old.retry,
            old.broker_name, old.queue_id, old.queue_offset,
        ).encode()  # fmt: skip


class _Consumer:
    broker_timeout_s = 1.0

    def __init__(self) -> None:
        self.client = _Broker()
        self.handed_back: list[tuple[list[Popped], str, int | None]] = []

    async def broker(self, name, topic):
        return self.client

    def hand_back(self, messages, reason, invisible_ms=None):
        self.handed_back.append((messages, reason, invisible_ms))


NOW = [1_000_000]


def popped(offset: int, pop_time: int = 1_000_000, invisible: int = 60_000) -> Popped:
    ck = PopCheckpointInfo(offset, pop_time, invisible, 3, 0, "broker-a", 1, offset)
    return Popped("broker-a", "G", "T", ck.encode(), 100 + offset, f"id{offset}")


def renewer(consumer, **kw) -> HandleRenewer:
    return HandleRenewer(consumer, clock_ms=lambda: NOW[0], **kw)


async def test_a_handle_is_renewed_when_due_and_settled_with_its_current_checkpoint():
    consumer = _Consumer()
    r = renewer(consumer)
    r.add("c1", popped(5), 0)
    NOW[0] = 1_000_000 + 40_000  # 20 s before visible: not due
    await r.renew_due()
    assert consumer.client.changes == []
    NOW[0] = 1_000_000 + 51_000  # within 10 s: due
    await r.renew_due()
    assert [ms for _, ms in consumer.client.changes] == [r.slice_ms]  # one slice more
    current = await r.begin_settle("G", PopCheckpointInfo.parse(popped(5).checkpoint))
    assert current is not None
    assert PopCheckpointInfo.parse(current.popped.checkpoint).pop_time == NOW[0]
    r.end_settle(current, settled=True)
    assert await r.begin_settle("G", PopCheckpointInfo.parse(popped(5).checkpoint)) is None
    assert r.size == 0


async def test_a_client_that_goes_has_its_messages_handed_back():
    consumer = _Consumer()
    r = renewer(consumer, clear_invisible_ms=1000)
    r.add("c1", popped(1), 0)
    r.add("c2", popped(2), 0)
    r.client_gone("c1")
    [(messages, reason, invisible)] = consumer.handed_back
    assert [m.msg_id for m in messages] == ["id1"] and reason == "client_gone"
    assert invisible == 1000
    assert r.size == 1


async def test_state_is_bounded():
    consumer = _Consumer()
    r = renewer(consumer, max_handles=2)
    for offset in range(3):
        r.add("c1", popped(offset), 0)
    assert r.size == 2 and r.dropped == 1


async def test_past_the_longest_renewal_a_message_goes_back_with_its_back_off():
    consumer = _Consumer()
    r = renewer(consumer, max_time_ms=10_000)
    NOW[0] = 1_000_000
    r.add("c1", popped(7, invisible=15_000), 2)
    NOW[0] = 1_000_000 + 11_000
    await r.renew_due()
    assert [ms for _, ms in consumer.client.changes] == [10_000]  # 3rd attempt: 10 s
    assert r.size == 0


class _FailingAcks(_Consumer):
    """Acks fail while ``failing``, as with a broker that does not answer in time."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True
        self.acked: list[PopCheckpointInfo] = []

    async def ack(self, group, topic, checkpoints, lite_topics):
        from proxy.remoting.client import RemotingError

        if self.failing:
            return [RemotingError("broker-a did not answer in time") for _ in checkpoints]
        self.acked.extend(checkpoints)
        return [None for _ in checkpoints]


async def renewed_once(consumer: _Consumer, offset: int) -> tuple[HandleRenewer, Popped]:
    """A renewer holding the message at ``offset``, renewed once: the broker now knows only
    its new checkpoint. The message as delivered (the client's handle) comes back too."""
    r = renewer(consumer)
    NOW[0] = 1_000_000
    original = popped(offset)
    r.add("c1", original, 0)
    NOW[0] = 1_000_000 + 51_000
    await r.renew_due()
    assert len(consumer.client.changes) == 1
    return r, original


async def test_a_failed_ack_of_a_renewed_message_keeps_its_renewal_for_the_retry():
    """apache/rocketmq#11174: the Apache proxy drops a renewed message's current handle when
    the ack fails, so the client's retry (with its original, replaced handle) has no effect
    and the message is consumed again. Here the retry settles the current checkpoint."""
    from proxy.api.ack import AckActivity
    from proxy.api.v2 import definition_pb2 as pb
    from proxy.api.v2 import service_pb2 as api

    consumer = _FailingAcks()
    r, original = await renewed_once(consumer, 7)
    activity = AckActivity(consumer, 16, r, LimitsConfig())  # type: ignore[arg-type]
    handle = f"{original.checkpoint} {original.commit_log_offset}"
    request = api.AckMessageRequest(
        group=pb.Resource(name="G"),
        topic=pb.Resource(name="T"),
        entries=[api.AckMessageEntry(message_id="id7", receipt_handle=handle)],
    )
    failed = await activity.ack_message(request, None)  # type: ignore[arg-type]
    assert failed.status.code != pb.Code.OK
    assert r.size == 1  # still renewed: the retry needs its current checkpoint
    consumer.failing = False
    retried = await activity.ack_message(request, None)  # type: ignore[arg-type]
    assert retried.status.code == pb.Code.OK
    assert [ck.pop_time for ck in consumer.acked] == [NOW[0]]  # the renewed checkpoint
    assert r.size == 0


async def test_a_retry_while_the_first_ack_is_in_flight_gets_the_current_checkpoint_too():
    """The client's deadline (3 s) can end before the proxy's ack to a slow broker does;
    the client retries at once, with its original handle, while the first ack is still in
    flight. The retry must still get the current checkpoint (it used to find the renewal
    taken by the first try, and answer that the handle had expired: the Python client then
    gives up, and the message comes back), and no renewal may change the checkpoint under
    the ack in flight."""
    consumer = _Consumer()
    r, original = await renewed_once(consumer, 9)
    ck = PopCheckpointInfo.parse(original.checkpoint)
    first = await r.begin_settle("G", ck)  # the first ack, in flight
    NOW[0] += 25_000
    await r.renew_due()  # due again, but its ack is in flight: not renewed
    assert len(consumer.client.changes) == 1
    retry = await r.begin_settle("G", ck)
    assert first is not None and retry is first
    r.end_settle(first, settled=False)  # the first try timed out
    r.end_settle(retry, settled=True)
    assert r.size == 0


def _ack_request(handle: Popped):
    from proxy.api.v2 import definition_pb2 as pb
    from proxy.api.v2 import service_pb2 as api

    return api.AckMessageRequest(
        group=pb.Resource(name="G"),
        topic=pb.Resource(name="T"),
        entries=[
            api.AckMessageEntry(
                message_id=handle.msg_id,
                receipt_handle=f"{handle.checkpoint} {handle.commit_log_offset}",
            )
        ],
    )


async def test_a_retry_of_an_ack_that_settled_after_the_client_gave_up_is_answered_ok():
    """The proxy's ack reaches a slow broker just after the client's deadline: the message
    is acked and its renewal ends, and the client, which saw DEADLINE_EXCEEDED, retries with
    its original handle, long expired. That retry used to be answered INVALID_RECEIPT_HANDLE
    (the Python client logs "give up retrying"; seen in CI). It is answered OK, without
    acking again; past ``acked_memory_s`` the proxy forgets, and the expiry stands."""
    from proxy.api.ack import AckActivity
    from proxy.api.v2 import definition_pb2 as pb

    consumer = _FailingAcks()
    consumer.failing = False
    r, original = await renewed_once(consumer, 11)
    r.acked_memory_s = 0.2
    activity = AckActivity(consumer, 16, r, LimitsConfig())  # type: ignore[arg-type]
    first = await activity.ack_message(_ack_request(original), None)  # type: ignore[arg-type]
    assert first.status.code == pb.Code.OK and r.size == 0
    retried = await activity.ack_message(_ack_request(original), None)  # type: ignore[arg-type]
    assert retried.status.code == pb.Code.OK
    assert len(consumer.acked) == 1  # answered from memory
    # Another delivery at the same offset (a stub restarted empty) is not taken for it.
    other = await activity.ack_message(_ack_request(popped(11, pop_time=999_000)), None)  # type: ignore[arg-type]
    assert other.status.code == pb.Code.INVALID_RECEIPT_HANDLE  # its own, expired handle
    await asyncio.sleep(0.3)  # past acked_memory_s (0.2 s): the proxy forgets the ack
    late = await activity.ack_message(_ack_request(original), None)  # type: ignore[arg-type]
    assert late.status.code == pb.Code.INVALID_RECEIPT_HANDLE


async def test_an_ack_cancelled_in_flight_leaves_the_renewal_going():
    """The client's deadline cancels the ack's handler while the broker has not answered:
    the renewal must go on (renewable again, and found by the retry), not stay marked as
    being settled, which would stop its renewals for good."""
    from proxy.api.ack import AckActivity

    consumer = _FailingAcks()
    r, original = await renewed_once(consumer, 12)
    started = asyncio.Event()

    async def stuck(group, topic, checkpoints, lite_topics):
        started.set()
        await asyncio.sleep(3600)  # a broker that never answers the ack

    consumer.ack = stuck  # type: ignore[method-assign]
    activity = AckActivity(consumer, 16, r, LimitsConfig())  # type: ignore[arg-type]
    call = asyncio.ensure_future(activity.ack_message(_ack_request(original), None))  # type: ignore[arg-type]
    await started.wait()
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    renewal = await r.begin_settle("G", PopCheckpointInfo.parse(original.checkpoint))
    assert renewal is not None and renewal.settling == 1  # only this one: the cancelled ended


class _SilentLinks:
    """Fleet links to a member that never answers (``FleetSettles`` waits ``ask_s``)."""

    self_id = "127.0.0.1:1"

    def members(self):
        return [self.self_id, "127.0.0.1:2"]

    def send(self, peer, message):
        return True

    async def flush(self, peer, timeout_s):
        return True


async def test_an_ack_cancelled_while_a_later_entry_is_looked_up_ends_the_earlier_settles():
    """A batch ack whose client gives up while its second entry waits on the fleet member
    that renews it: the first entry's settle, begun already, ends too, so its renewal goes
    on; it would otherwise never be renewed again."""
    from proxy.api.ack import AckActivity
    from proxy.api.v2 import service_pb2 as api
    from proxy.fleet.settle import FleetSettles

    consumer = _FailingAcks()
    r, first = await renewed_once(consumer, 13)
    elsewhere = popped(14)  # renewed by the silent member, its handle says
    request = _ack_request(first)
    request.entries.append(
        api.AckMessageEntry(
            message_id=elsewhere.msg_id,
            receipt_handle=f"{elsewhere.checkpoint} {elsewhere.commit_log_offset} 127.0.0.1:2",
        )
    )
    settles = FleetSettles(_SilentLinks(), r, ask_s=30.0)
    activity = AckActivity(consumer, 16, r, LimitsConfig(), settles)  # type: ignore[arg-type]
    call = asyncio.ensure_future(activity.ack_message(request, None))  # type: ignore[arg-type]
    # The first entry looked up, the second waiting on its renewer's LENT.
    await wait_until(lambda: bool(settles._asks), timeout=1, what="the second entry's ask")
    assert next(iter(r._handles.values())).settling == 1
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    assert next(iter(r._handles.values())).settling == 0


class _SlowBroker(_Broker):
    """A change of invisible time that is answered only once ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()

    async def change_invisible_time(self, *args, **kwargs):
        await self.answer.wait()
        return await super().change_invisible_time(*args, **kwargs)


async def test_a_settle_or_hand_over_between_a_rounds_start_and_its_renewals_waits_for_them():
    """A round picks its due messages and starts their renewals; a settle or a hand-over
    that runs before those renewals begin must still wait for them. Taking the checkpoint
    they are about to replace would settle (or hand the heir) a dead checkpoint, and the
    renewal's new one would bring the message back: consumed twice."""
    consumer = _Consumer()
    consumer.client = _SlowBroker()
    r = renewer(consumer)
    NOW[0] = 1_000_000
    r.add("c1", popped(4), 0)
    NOW[0] = 1_000_000 + 51_000
    # Scheduled in this order: the round picks the message and starts its renewal, and
    # the settle and the hand-over run before that renewal has begun.
    round_ = asyncio.ensure_future(r.renew_due())
    ck = PopCheckpointInfo.parse(popped(4).checkpoint)
    settling = asyncio.ensure_future(r.begin_settle("G", ck))
    leaving = asyncio.ensure_future(r.hand_over())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not settling.done() and not leaving.done()  # both wait for the renewal
    consumer.client.answer.set()
    await round_
    current = await settling
    assert current is not None and current.checkpoint.pop_time == NOW[0]  # the renewed one
    assert await leaving == []  # being settled: not handed over
    r.end_settle(current, settled=False)
    handed = await r.hand_over()
    assert [e.checkpoint.pop_time for e in handed] == [NOW[0]]
    await r.renew_due()  # left: renews nothing more
    assert len(consumer.client.changes) == 1


async def test_a_round_cancelled_before_its_renewals_start_leaves_no_mark():
    """The proxy closing cancels the renewal loop: a round cancelled after it marked its
    due messages and before their renewals began must not leave them marked, or no later
    round would renew them and every settle of them would wait for nothing."""
    consumer = _Consumer()
    r = renewer(consumer)
    NOW[0] = 1_000_000
    r.add("c1", popped(6), 0)
    NOW[0] = 1_000_000 + 51_000  # due
    round_ = asyncio.ensure_future(r.renew_due())
    await asyncio.sleep(0)  # the round marks the message and starts its renewal's task
    round_.cancel()  # before that task has run a step
    with contextlib.suppress(asyncio.CancelledError):
        await round_
    ck = PopCheckpointInfo.parse(popped(6).checkpoint)
    loop = asyncio.get_running_loop()
    started = loop.time()
    settling = await r.begin_settle("G", ck)
    assert loop.time() - started < 0.5  # no renewal to wait for (it waited 2 s for none)
    assert settling is not None and consumer.client.changes == []  # it never ran
    r.end_settle(settling, settled=False)
    await r.renew_due()  # the next round renews it
    assert [ms for _, ms in consumer.client.changes] == [r.slice_ms]
