"""POP semantics of the broker stub, end to end over the remoting protocol."""

from __future__ import annotations

import asyncio
import base64
import time

import orjson

from broker_stub import BrokerConfig, StubCluster
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.message import BatchEntry, Prop
from proxy.remoting.popinfo import PopCheckpointInfo
from tests.integration._util import checkpoint, pop_until_empty, wait_until

T = "TopicPop"
G = "GroupPop"


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_send_then_pop_carries_message_and_checkpoint(broker, client):
    sent = await client.send(T, b"hello", tag="TagA", keys=["k1", "k2"])
    before = now_ms()
    result = await client.pop(G, T, invisible_ms=5000)
    after = now_ms()

    assert result.code == ResponseCode.SUCCESS
    assert len(result.messages) == 1
    msg = result.messages[0]
    assert msg.body == b"hello"
    assert msg.topic == T
    assert msg.tags == "TagA"
    assert msg.keys == ["k1", "k2"]
    assert msg.properties[Prop.UNIQ_KEY] == sent.msg_id
    assert msg.msg_id == sent.msg_id
    assert msg.offset_msg_id == sent.offset_msg_id
    assert msg.queue_id == sent.queue_id
    assert msg.queue_offset == sent.queue_offset
    assert msg.reconsume_times == 0

    assert result.invisible_time == 5000
    assert before <= result.pop_time <= after
    ck = checkpoint(msg)
    assert ck.broker_name == broker.name
    assert ck.queue_id == sent.queue_id
    assert ck.queue_offset == sent.queue_offset
    assert ck.start_offset == sent.queue_offset
    assert ck.invisible_time == 5000
    assert ck.pop_time == result.pop_time
    assert ck.retry == 0


async def test_pop_any_queue_collects_across_queues(broker, client):
    queues = broker.config.default_queue_nums
    assert queues > 1
    sent = {}
    for qid in range(queues):
        result = await client.send(T, f"q{qid}".encode(), queue_id=qid)
        assert result.queue_id == qid
        sent[result.msg_id] = qid

    result = await client.pop(G, T, queue_id=-1, max_nums=32)

    assert {m.msg_id: m.queue_id for m in result.messages} == sent
    for msg in result.messages:
        ck = checkpoint(msg)
        assert (ck.queue_id, ck.queue_offset) == (msg.queue_id, msg.queue_offset)


async def test_max_msg_nums_is_respected(client):
    ids = {(await client.send(T, b"m%d" % i)).msg_id for i in range(10)}

    first = await client.pop(G, T, max_nums=3)
    assert len(first.messages) == 3
    assert first.rest_num == 7

    got = list(first.messages)
    for _ in range(10):
        result = await client.pop(G, T, max_nums=3)
        if not result.found:
            break
        assert 1 <= len(result.messages) <= 3
        got.extend(result.messages)
    assert sorted(m.msg_id for m in got) == sorted(ids)


async def test_tag_filter_returns_only_matching_and_skips_the_rest_for_good(broker, client):
    tags = ["a", "b", "c", "a", None, "b", "d"]
    sent = [await client.send(T, b"x", tag=tag, queue_id=0) for tag in tags]
    wanted = {s.msg_id for s, tag in zip(sent, tags, strict=True) if tag in ("a", "b")}

    result = await client.pop(G, T, expression="a || b", invisible_ms=300)
    assert {m.msg_id for m in result.messages} == wanted
    assert all(m.tags in ("a", "b") for m in result.messages)
    for msg in result.messages:
        await client.ack(G, T, msg.properties[Prop.POP_CK])

    # The skipped ones are consumed for this group: not now, not after the invisible time.
    assert not (await client.pop(G, T)).found
    late = await client.pop(G, T, poll_ms=600)
    assert not late.found
    assert broker.pop.checkpoint_count == 0


async def test_two_consumers_of_one_group_never_share_a_message(broker):
    setup = BrokerClient(broker.name, broker.address)
    a = BrokerClient(broker.name, broker.address)
    b = BrokerClient(broker.name, broker.address)
    try:
        ids = [(await setup.send(T, b"%d" % i)).msg_id for i in range(200)]
        assert len(set(ids)) == 200
        got_a, got_b = await asyncio.wait_for(
            asyncio.gather(
                pop_until_empty(a, G, T, max_nums=7), pop_until_empty(b, G, T, max_nums=7)
            ),
            5,
        )
    finally:
        for c in (setup, a, b):
            await c.close()
    ids_a = [m.msg_id for m in got_a]
    ids_b = [m.msg_id for m in got_b]
    assert len(ids_a) == len(set(ids_a))
    assert len(ids_b) == len(set(ids_b))
    assert not set(ids_a) & set(ids_b)
    assert set(ids_a) | set(ids_b) == set(ids)
    assert ids_a and ids_b  # both really took part


async def test_two_groups_each_get_every_message(client):
    ids = {(await client.send(T, b"%d" % i)).msg_id for i in range(20)}
    got1 = await pop_until_empty(client, "G1", T)
    got2 = await pop_until_empty(client, "G2", T)
    assert sorted(m.msg_id for m in got1) == sorted(ids)
    assert sorted(m.msg_id for m in got2) == sorted(ids)


async def test_ack_prevents_redelivery(broker, client):
    await client.send(T, b"once")
    result = await client.pop(G, T, invisible_ms=300)
    assert result.found
    assert broker.pop.checkpoint_count == 1
    await client.ack(G, T, result.messages[0].properties[Prop.POP_CK])
    assert broker.pop.checkpoint_count == 0

    await asyncio.sleep(0.6)  # well past the invisible time
    again = await client.pop(G, T, poll_ms=400)
    assert not again.found
    assert broker.store.max_offset(f"%RETRY%{G}_{T}", 0) == 0


async def test_unacked_message_is_redelivered(client):
    """The control for the ack test: without an ack the same message does come back."""
    sent = await client.send(T, b"again")
    assert (await client.pop(G, T, invisible_ms=300)).found
    again = await client.pop(G, T, poll_ms=2000)
    assert [m.msg_id for m in again.messages] == [sent.msg_id]


async def test_change_invisible_time_new_handle_acks(broker, client):
    await client.send(T, b"change")
    result = await client.pop(G, T, invisible_ms=300)
    msg = result.messages[0]
    old = msg.properties[Prop.POP_CK]

    new = await client.change_invisible_time(G, T, old, 500)
    new_ck = PopCheckpointInfo.parse(new)
    assert new != old
    assert new_ck.invisible_time == 500
    assert new_ck.queue_offset == msg.queue_offset
    assert new_ck.queue_id == msg.queue_id
    assert new_ck.pop_time >= result.pop_time

    await client.ack(G, T, new)
    assert broker.pop.checkpoint_count == 0
    late = await client.pop(G, T, poll_ms=900)  # past both expiries
    assert not late.found


async def test_change_invisible_time_extends_invisibility(client):
    sent = await client.send(T, b"extend")
    result = await client.pop(G, T, invisible_ms=200)
    await client.change_invisible_time(G, T, result.messages[0].properties[Prop.POP_CK], 900)
    changed_at = time.monotonic()

    # The old expiry (200 ms) passes with nothing redelivered ...
    early = await client.pop(G, T, poll_ms=500)
    assert not early.found
    # ... and the new one brings it back.
    late = await client.pop(G, T, poll_ms=2000)
    elapsed = time.monotonic() - changed_at
    assert [m.msg_id for m in late.messages] == [sent.msg_id]
    assert late.messages[0].reconsume_times == 1
    assert 0.8 <= elapsed < 2.0


async def test_redelivery_through_retry_topic(broker, client):
    sent = await client.send(T, b"retry me", tag="TagR", keys=["key"])
    first = await client.pop(G, T, invisible_ms=250)
    assert first.messages[0].reconsume_times == 0

    second = await client.pop(G, T, invisible_ms=250, poll_ms=2000)
    assert len(second.messages) == 1
    msg = second.messages[0]
    assert msg.reconsume_times == 1
    assert msg.msg_id == sent.msg_id
    assert msg.body == b"retry me"
    assert msg.tags == "TagR"
    assert msg.topic == T
    assert checkpoint(msg).retry == 1
    assert checkpoint(msg).broker_name == broker.name

    third = await client.pop(G, T, invisible_ms=250, poll_ms=2000)
    assert len(third.messages) == 1
    msg = third.messages[0]
    assert msg.reconsume_times == 2
    assert msg.msg_id == sent.msg_id
    assert checkpoint(msg).retry == 1

    await client.ack(G, T, msg.properties[Prop.POP_CK])
    assert broker.pop.checkpoint_count == 0
    after = await client.pop(G, T, poll_ms=700)
    assert not after.found


async def test_dead_letter_queue_after_max_attempts():
    template = BrokerConfig(max_reconsume_times=2, retry_first_probability=1.0)
    async with StubCluster(1, template=template) as cluster:
        broker = cluster.brokers[0]
        client = BrokerClient(broker.name, broker.address)
        try:
            sent = await client.send(T, b"doomed")
            attempts = []
            for _ in range(3):
                result = await client.pop(G, T, invisible_ms=200, poll_ms=2000)
                assert len(result.messages) == 1
                attempts.append(result.messages[0].reconsume_times)
                assert result.messages[0].msg_id == sent.msg_id
            assert attempts == [0, 1, 2]

            # The third expiry sends it to the DLQ instead of the retry topic.
            dlq = f"%DLQ%{G}"
            await wait_until(lambda: broker.store.max_offset(dlq, 0) == 1, timeout=2.0)
            assert not (await client.pop(G, T, poll_ms=300)).found

            dead = await client.pop("DlqReader", dlq)
            assert len(dead.messages) == 1
            assert dead.messages[0].msg_id == sent.msg_id
            assert dead.messages[0].body == b"doomed"
            assert dead.messages[0].reconsume_times == 3
        finally:
            await client.close()


async def test_batch_send_lands_consecutively_in_one_queue(client):
    entries = [BatchEntry(b"b%d" % i, {Prop.TAGS: f"t{i}"}) for i in range(5)]
    sent = await client.send_batch(T, entries)
    assert len(sent.offset_msg_id.split(",")) == 5

    result = await client.pop(G, T, queue_id=sent.queue_id)
    msgs = result.messages
    assert [m.body for m in msgs] == [e.body for e in entries]
    assert [m.tags for m in msgs] == [f"t{i}" for i in range(5)]
    assert {m.queue_id for m in msgs} == {sent.queue_id}
    assert [m.queue_offset for m in msgs] == list(range(sent.queue_offset, sent.queue_offset + 5))
    assert msgs[0].msg_id == sent.msg_id
    assert len({m.msg_id for m in msgs}) == 5
    # Nothing else landed anywhere: another group finds exactly these five.
    other = await pop_until_empty(client, "Other", T)
    assert sorted(m.msg_id for m in other) == sorted(m.msg_id for m in msgs)


async def test_timed_delivery(client):
    sent_at = time.monotonic()
    deliver_at = now_ms() + 500
    sent = await client.send(T, b"later", properties={Prop.TIMER_DELIVER_MS: str(deliver_at)})

    assert not (await client.pop(G, T)).found
    result = await client.pop(G, T, poll_ms=2000)
    elapsed = time.monotonic() - sent_at
    assert [m.msg_id for m in result.messages] == [sent.msg_id]
    assert result.messages[0].body == b"later"
    assert now_ms() >= deliver_at
    assert 0.4 <= elapsed < 1.5


def bitset(indexes: list[int]) -> str:
    """base64 of Java ``BitSet.toByteArray()``: little-endian bits, no trailing zero bytes."""
    value = sum(1 << i for i in indexes)
    raw = value.to_bytes((value.bit_length() + 7) // 8, "little")
    return base64.b64encode(raw).decode()


async def test_batch_ack(broker, client):
    sent = [await client.send(T, b"%d" % i, queue_id=1) for i in range(3)]
    result = await client.pop(G, T, queue_id=1, invisible_ms=300)
    msgs = result.messages
    assert [m.msg_id for m in msgs] == [s.msg_id for s in sent]
    ck = checkpoint(msgs[0])
    acked = [msgs[0], msgs[2]]
    body = {
        "brokerName": broker.name,
        "acks": [
            {
                "c": G,
                "t": T,
                "r": "0",
                "so": ck.start_offset,
                "q": ck.queue_id,
                "rq": ck.revive_qid,
                "pt": ck.pop_time,
                "it": ck.invisible_time,
                "b": bitset([m.queue_offset - ck.start_offset for m in acked]),
            }
        ],
    }
    response = await client.remoting.invoke(
        RemotingCommand(RequestCode.BATCH_ACK_MESSAGE, {}, orjson.dumps(body)), 3.0
    )
    assert response.code == ResponseCode.SUCCESS

    # Only the one left out comes back after the invisible time.
    again = await client.pop(G, T, poll_ms=2000)
    assert [m.msg_id for m in again.messages] == [msgs[1].msg_id]
    assert not (await client.pop(G, T)).found
