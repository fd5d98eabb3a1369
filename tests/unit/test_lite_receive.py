"""The lite poll (receive/lite.py) with scripted brokers: instant pops on every broker, then
parked ones; what a client does not get is handed back with its lite topic; and the
translations of the lite activity and the group config."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

import pytest

from proxy.api.errors import ApiError
from proxy.api.lite import LiteActivity, offset_option
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.brokers import BrokerPool
from proxy.groups import DEFAULT_LITE_QUOTA, GroupConfig
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.lite import LiteReceiver
from proxy.receive.types import ReceiveRequest
from proxy.remoting.answers import PopResult
from proxy.remoting.lite import LiteAction, OffsetOption, OffsetType
from proxy.remoting.message import MessageExt, Prop
from proxy.remoting.popinfo import PopCheckpointInfo
from testkit.waits import wait_until

Code = pb.Code


def lite_message(broker: str, lite: str, offset: int) -> MessageExt:
    ck = PopCheckpointInfo(0, 1, 30_000, 999, 0, broker, 0, offset).encode()
    return MessageExt(
        topic="P",
        body=b"x",
        properties={Prop.POP_CK: ck, Prop.LITE_TOPIC: lite, Prop.UNIQ_KEY: f"{broker}{offset}"},
    )


@dataclass
class ScriptedBroker:
    """Answers lite pops from a script: per call, (delay s, messages)."""

    name: str
    script: list[tuple[float, list[MessageExt]]]
    calls: list[int] = field(default_factory=list)  # poll_ms of each call

    async def pop_lite(self, client_id, group, topic, *, poll_ms, on_late=None, **_):
        self.calls.append(poll_ms)
        delay, messages = self.script.pop(0) if self.script else (poll_ms / 1000, [])
        await asyncio.sleep(delay)  # the scripted time the broker takes to answer
        return PopResult(code=0, messages=messages)


@dataclass
class Route:
    readable: list


@dataclass
class BrokerRouteStub:
    name: str


class Pool:
    def __init__(self, brokers: list[ScriptedBroker]) -> None:
        self.brokers = {b.name: b for b in brokers}

    async def route(self, topic):
        return Route([BrokerRouteStub(n) for n in self.brokers])

    def broker(self, name):
        return self.brokers.get(name)


class Consumer:
    def __init__(self) -> None:
        self.handed_back: list[tuple[str, str | None, str]] = []
        self.dead_lettered: list[tuple[str, str | None]] = []

    def hand_back(self, popped, reason, invisible_ms=None):
        self.handed_back.extend((p.msg_id, p.lite_topic, reason) for p in popped)

    async def divert_exhausted(self, messages, max_attempts):
        deliver = []
        for popped, reconsume_times in messages:
            deliver.append(reconsume_times + 1 <= max_attempts)
            if not deliver[-1]:
                self.dead_lettered.append((popped.msg_id, popped.lite_topic))
        return deliver


def receiver_over(brokers: list[ScriptedBroker], consumer: Consumer, **options) -> LiteReceiver:
    """A LiteReceiver over the scripted brokers; the fakes stand in for the pool and the
    consumer processor, which they imitate only as far as the receiver uses them."""
    pool = cast(BrokerPool, Pool(brokers))
    return LiteReceiver(pool, cast(ConsumerProcessor, consumer), **options)


def request(batch: int = 32, polling_ms: int = 1000, push: bool = False) -> ReceiveRequest:
    loop = asyncio.get_running_loop()
    return ReceiveRequest(
        group="G",
        topic="P",
        expression="*",
        batch_size=batch,
        invisible_ms=30_000,
        polling_ms=polling_ms,
        answer_by=loop.time() + polling_ms / 1000,
        arrived_at=loop.time(),
        broker_hint="a",
        named_broker_only=push,
    )


async def test_instant_pops_on_every_broker_and_the_rest_over_the_batch_goes_back():
    a = ScriptedBroker("a", [(0, [lite_message("a", "x", 0), lite_message("a", "x", 1)])])
    b = ScriptedBroker("b", [(0, [lite_message("b", "y", 0)])])
    consumer = Consumer()
    receiver = receiver_over([a, b], consumer, broker_timeout_s=1.0)

    result = await receiver.receive(request(batch=2), "client")

    assert result.is_short_polling_hit and len(result.messages) == 2
    assert a.calls == [0] and b.calls == [0]
    assert all(m.lite for m in result.messages)
    delivered = {m.message.msg_id for m in result.messages}
    assert [reason for _, _, reason in consumer.handed_back] == ["over_batch"]
    handed = {msg_id for msg_id, _, _ in consumer.handed_back}
    assert delivered | handed == {"a0", "a1", "b0"} and not delivered & handed


async def test_the_first_parked_pop_with_messages_answers_and_a_late_one_is_handed_back():
    a = ScriptedBroker("a", [(0, []), (0.1, [lite_message("a", "x", 5)])])
    b = ScriptedBroker("b", [(0, []), (0.4, [lite_message("b", "y", 7)])])
    consumer = Consumer()
    receiver = receiver_over([a, b], consumer, broker_timeout_s=1.0)

    result = await receiver.receive(request(polling_ms=2000), "client")

    assert [m.message.properties[Prop.LITE_TOPIC] for m in result.messages] == ["x"]
    assert not result.is_short_polling_hit and result.pops == 4
    assert a.calls[1] > 1000 and b.calls[1] > 1000  # parked for the time left
    # b's parked pop still brings a message: it goes back, with its lite topic.
    await wait_until(lambda: bool(consumer.handed_back), timeout=1, what="a hand-back")
    assert consumer.handed_back == [("b7", "y", "deadline")]


async def test_a_message_past_its_last_attempt_goes_to_the_dead_letter_queue():
    tired = lite_message("a", "x", 2)
    tired.reconsume_times = 16  # its 17th delivery, past the 16 its group allows
    a = ScriptedBroker("a", [(0, [lite_message("a", "x", 1), tired])])
    consumer = Consumer()
    receiver = receiver_over([a], consumer, broker_timeout_s=1.0)
    req = request()
    req.max_attempts = 16

    result = await receiver.receive(req, "client")

    assert [m.message.msg_id for m in result.messages] == ["a1"]
    assert consumer.dead_lettered == [("a2", "x")]


async def test_a_push_poll_parks_one_pop_on_its_named_broker_only():
    """One broker: no instant pop first (a parked pop answers at once when there are
    messages), one request per poll as the Apache proxy makes."""
    a = ScriptedBroker("a", [(0.05, [lite_message("a", "x", 1)])])
    b = ScriptedBroker("b", [])
    receiver = receiver_over([a, b], Consumer(), broker_timeout_s=1.0)

    result = await receiver.receive(request(push=True), "client")

    assert len(result.messages) == 1 and result.pops == 1
    assert len(a.calls) == 1 and a.calls[0] > 500 and b.calls == []


async def test_a_late_pop_passes_its_messages_to_the_clients_parked_poll():
    """The first poll answers from a; b's parked pop brings a message after it: the same
    client's next poll, parked now, answers with it rather than it going back."""
    a = ScriptedBroker("a", [(0, []), (0.05, [lite_message("a", "x", 1)]), (0, [])])
    b = ScriptedBroker("b", [(0, []), (0.3, [lite_message("b", "y", 2)]), (0, [])])
    consumer = Consumer()
    receiver = receiver_over([a, b], consumer, broker_timeout_s=1.0)

    first = await receiver.receive(request(polling_ms=2000), "client")
    second = await receiver.receive(request(polling_ms=2000), "client")

    assert [m.message.msg_id for m in first.messages] == ["a1"]
    assert [m.message.msg_id for m in second.messages] == ["b2"]
    assert consumer.handed_back == []


async def test_a_late_pop_goes_back_when_no_poll_of_its_client_is_parked():
    a = ScriptedBroker("a", [(0, []), (0.05, [lite_message("a", "x", 1)]), (0, [])])
    b = ScriptedBroker("b", [(0, []), (0.2, [lite_message("b", "y", 2)]), (0, [])])
    consumer = Consumer()
    receiver = receiver_over([a, b], consumer, broker_timeout_s=1.0)

    await receiver.receive(request(polling_ms=2000), "client")
    other = asyncio.ensure_future(receiver.receive(request(polling_ms=2000), "another"))
    await wait_until(lambda: bool(consumer.handed_back), timeout=1, what="a hand-back")
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other

    assert consumer.handed_back[0] == ("b2", "y", "deadline")


async def test_a_poll_with_nothing_anywhere_answers_empty_by_its_time():
    a, b = ScriptedBroker("a", []), ScriptedBroker("b", [])
    receiver = receiver_over([a, b], Consumer(), broker_timeout_s=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()

    result = await receiver.receive(request(polling_ms=300), "client")

    assert result.messages == [] and loop.time() - started < 1.0


async def test_a_cancelled_poll_hands_back_what_its_pops_still_bring():
    a = ScriptedBroker("a", [(0.2, [lite_message("a", "x", 3)])])
    consumer = Consumer()
    receiver = receiver_over([a], consumer, broker_timeout_s=1.0)
    task = asyncio.ensure_future(receiver.receive(request(polling_ms=2000), "client"))
    await wait_until(lambda: len(a.calls) == 1)  # its pop is out
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: bool(consumer.handed_back), timeout=1, what="a hand-back")
    assert consumer.handed_back == [("a3", "x", "cancelled")]


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (pb.OffsetOption(policy=pb.OffsetOption.LAST), OffsetOption(OffsetType.POLICY, 0)),
        (pb.OffsetOption(policy=pb.OffsetOption.MIN), OffsetOption(OffsetType.POLICY, 1)),
        (pb.OffsetOption(policy=pb.OffsetOption.MAX), OffsetOption(OffsetType.POLICY, 2)),
        (pb.OffsetOption(offset=42), OffsetOption(OffsetType.OFFSET, 42)),
        (pb.OffsetOption(tail_n=3), OffsetOption(OffsetType.TAIL_N, 3)),
        (pb.OffsetOption(timestamp=1700), OffsetOption(OffsetType.TIMESTAMP, 1700)),
    ],
)
def test_offset_options_as_the_broker_reads_them(option, expected):
    assert offset_option(option) == expected


@pytest.mark.parametrize(
    "option", [pb.OffsetOption(), pb.OffsetOption(offset=-1), pb.OffsetOption(tail_n=-2)]
)
def test_bad_offset_options_are_illegal_offset(option):
    with pytest.raises(ApiError) as err:
        offset_option(option)
    assert err.value.code == Code.ILLEGAL_OFFSET


def test_the_offset_option_travels_only_with_a_partial_add():
    activity = LiteActivity(processor=None, max_lite_topic_size=64)  # type: ignore[arg-type]
    option = pb.OffsetOption(policy=pb.OffsetOption.MIN)
    add = api.SyncLiteSubscriptionRequest(
        action=pb.LiteSubscriptionAction.PARTIAL_ADD,
        topic=pb.Resource(name="P"),
        group=pb.Resource(name="G"),
        lite_topic_set=["a", "b", "a"],
        offset_option=option,
    )
    sub = activity.translate(add, "cid")
    assert (sub.action, sub.lite_topics, sub.offset_option) == (
        LiteAction.PARTIAL_ADD,
        ("a", "b"),
        OffsetOption(OffsetType.POLICY, 1),
    )
    complete = api.SyncLiteSubscriptionRequest()
    complete.CopyFrom(add)
    complete.action = pb.LiteSubscriptionAction.COMPLETE_ADD
    assert activity.translate(complete, "cid").offset_option is None


def test_group_config_reads_the_lite_attributes():
    config = GroupConfig.from_json(
        {"attributes": {"lite.bind.topic": "P", "lite.sub.client.quota": "7"}}
    )
    assert config.is_lite("P") and not config.is_lite("Q") and config.lite_quota == 7
    plain = GroupConfig.from_json({"consumeMessageOrderly": True})
    assert plain.fifo and not plain.is_lite("P") and plain.lite_quota == DEFAULT_LITE_QUOTA
    huge = GroupConfig.from_json({"attributes": {"lite.sub.client.quota": str(2**40)}})
    assert huge.lite_quota == 2**31 - 1
