"""POP semantics both backends share: send, pop, filters, acks, invisible time, retry, DLQ."""

from __future__ import annotations

import asyncio
import base64
import time

import orjson

from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import now_ms
from proxy.remoting.message import BatchEntry, Prop, decode_messages
from proxy.remoting.popinfo import PopCheckpointInfo, retry_flag
from rocketmq_local.admin import max_offset, wait_visible
from testkit.waits import pop_all, wait_until
from tests.conformance._util import SHORT_INVISIBLE_MS, pop_eventually, wait_offset
from tests.support.remoting import pop_fields

HEADER_KEYS = {"popTime", "invisibleTime", "reviveQid", "restNum", "startOffsetInfo",
               "msgOffsetInfo"}  # fmt: skip


def ck(msg) -> PopCheckpointInfo:
    return PopCheckpointInfo.parse(msg.properties[Prop.POP_CK])


async def raw_pop(client, group: str, topic: str, **over) -> RemotingCommand:
    return await client.remoting.invoke(
        RemotingCommand(RequestCode.POP_MESSAGE, pop_fields(group, topic, **over)), 10.0
    )


async def fresh(backend, queues: int = 4, retry_max_times: int = 16) -> tuple[str, str]:
    topic, group = backend.unique("T"), backend.unique("G")
    await backend.create_topic(topic, queues)
    await backend.create_group(group, retry_max_times)
    return topic, group


async def test_send_then_pop_from_a_named_queue(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    sent = await client.send(topic, b"hello", tag="TagA", keys=["k1", "k2"], queue_id=2)
    assert sent.queue_id == 2
    assert sent.queue_offset == 0
    assert len(sent.offset_msg_id) == 32
    await wait_visible(client, topic, [sent])
    before = now_ms()
    result = await client.pop(group, topic, queue_id=2, invisible_ms=5000)
    after = now_ms()

    assert result.code == ResponseCode.SUCCESS
    [msg] = result.messages
    assert (msg.body, msg.topic, msg.tags, msg.keys) == (b"hello", topic, "TagA", ["k1", "k2"])
    assert msg.properties[Prop.UNIQ_KEY] == sent.msg_id
    assert msg.offset_msg_id == sent.offset_msg_id
    assert (msg.queue_id, msg.queue_offset, msg.reconsume_times) == (2, 0, 0)
    assert result.invisible_time == 5000
    assert before <= result.pop_time <= after
    info = ck(msg)
    assert (info.broker_name, info.queue_id, info.queue_offset, info.start_offset) == (
        backend.broker.name, 2, 0, 0)  # fmt: skip
    assert (info.pop_time, info.invisible_time, info.retry) == (result.pop_time, 5000, 0)


async def test_pop_response_headers(backend):
    """The header a client decodes: the six fields on a find (no orderCountInfo for a
    plain pop), the same with empty offset infos when nothing is found, and the broker
    leaves POP_CK out of normal messages (clients build it from the offset infos)."""
    topic, group = await fresh(backend)
    client = backend.client()
    empty = await raw_pop(client, group, topic)
    assert empty.code == ResponseCode.POLLING_TIMEOUT
    assert empty.remark == "NO_MESSAGE_IN_QUEUE"
    assert set(empty.fields) == HEADER_KEYS
    assert (empty.fields["startOffsetInfo"], empty.fields["msgOffsetInfo"]) == ("", "")
    assert empty.fields["restNum"] == "0"

    sent = [await client.send(topic, body, queue_id=1) for body in (b"a", b"b")]
    await wait_visible(client, topic, sent)
    found = await raw_pop(client, group, topic, queueId=1, invisibleTime=7000)
    assert found.code == ResponseCode.SUCCESS
    assert set(found.fields) == HEADER_KEYS
    assert found.fields["startOffsetInfo"] == "0 1 0"
    assert found.fields["msgOffsetInfo"] == "0 1 0,1"
    assert found.fields["invisibleTime"] == "7000"
    assert found.fields["restNum"] == "0"
    records = decode_messages(found.body)
    assert [m.body for m in records] == [b"a", b"b"]
    assert all(Prop.POP_CK not in m.properties for m in records)
    assert all(m.topic == topic for m in records)


async def test_pop_any_queue_collects_across_queues(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    sent = {}
    results = []
    for qid in range(4):
        result = await client.send(topic, f"q{qid}".encode(), queue_id=qid)
        assert result.queue_id == qid
        sent[result.msg_id] = qid
        results.append(result)
    await wait_visible(client, topic, results)

    result = await client.pop(group, topic, queue_id=-1, max_nums=32)

    assert {m.msg_id: m.queue_id for m in result.messages} == sent
    for msg in result.messages:
        info = ck(msg)
        assert (info.queue_id, info.queue_offset, info.retry) == (msg.queue_id, msg.queue_offset, 0)
        assert info.broker_name == backend.broker.name


async def test_max_msg_nums_is_respected(backend):
    topic, group = await fresh(backend, queues=1)
    client = backend.client()
    results = [await client.send(topic, b"m%d" % i) for i in range(10)]
    ids = {r.msg_id for r in results}
    await wait_visible(client, topic, results)

    first = await client.pop(group, topic, max_nums=3)
    assert len(first.messages) == 3
    assert first.rest_num == 7
    got = list(first.messages) + await pop_all(client, group, topic, max_nums=3)
    assert sorted(m.msg_id for m in got) == sorted(ids)


async def test_new_group_with_init_mode_max_reads_from_the_start(backend):
    """initMode MAX (1) for a group that never popped: while the queue still holds its
    first message both start at offset 0, not at the end."""
    topic, group = await fresh(backend, queues=1)
    client = backend.client()
    results = [await client.send(topic, b"%d" % i) for i in range(3)]
    ids = [r.msg_id for r in results]
    await wait_visible(client, topic, results)
    result = await client.pop(group, topic, init_mode=1)
    assert [m.msg_id for m in result.messages] == ids


async def test_two_groups_each_get_every_message(backend):
    topic, g1 = await fresh(backend)
    g2 = backend.unique("G")
    client = backend.client()
    results = [await client.send(topic, b"%d" % i) for i in range(12)]
    ids = {r.msg_id for r in results}
    await wait_visible(client, topic, results)
    assert sorted(m.msg_id for m in await pop_all(client, g1, topic)) == sorted(ids)
    assert sorted(m.msg_id for m in await pop_all(client, g2, topic)) == sorted(ids)


async def test_two_consumers_of_one_group_never_share_a_message(backend):
    topic, group = await fresh(backend)
    setup, a, b = backend.client(), backend.client(), backend.client()
    results = [await setup.send(topic, b"%d" % i) for i in range(60)]
    ids = [r.msg_id for r in results]
    await wait_visible(setup, topic, results)
    got_a, got_b = await asyncio.wait_for(
        asyncio.gather(pop_all(a, group, topic, max_nums=5), pop_all(b, group, topic, max_nums=5)),
        30,
    )
    ids_a, ids_b = [m.msg_id for m in got_a], [m.msg_id for m in got_b]
    assert len(ids_a) == len(set(ids_a)) and len(ids_b) == len(set(ids_b))
    assert not set(ids_a) & set(ids_b)
    assert set(ids_a) | set(ids_b) == set(ids)


async def test_tag_filter_returns_only_matching_and_skips_the_rest_for_good(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    tags = ["a", "b", "c", "a", None, "b", "d"]
    sent = [await client.send(topic, b"x", tag=tag, queue_id=0) for tag in tags]
    wanted = [s.msg_id for s, tag in zip(sent, tags, strict=True) if tag in ("a", "b")]
    await wait_visible(client, topic, sent)

    result = await client.pop(group, topic, expression="a || b",
                              invisible_ms=SHORT_INVISIBLE_MS)  # fmt: skip
    assert [m.msg_id for m in result.messages] == wanted
    # Ack all but one (the control): the control comes back, the skipped ones never do.
    control = result.messages[-1]
    for msg in result.messages[:-1]:
        await client.ack(group, topic, msg.properties[Prop.POP_CK])
    back = await pop_eventually(client, group, topic, expression="a || b")
    assert [m.msg_id for m in back.messages] == [control.msg_id]
    assert back.messages[0].reconsume_times == 1
    await client.ack(group, topic, back.messages[0].properties[Prop.POP_CK])
    assert not (await client.pop(group, topic, expression="*")).found


async def test_ack_prevents_redelivery(backend):
    topic, group = await fresh(backend, queues=1)
    client = backend.client()
    acked = await client.send(topic, b"acked")
    control = await client.send(topic, b"control")
    await wait_visible(client, topic, [acked, control])
    result = await client.pop(group, topic, invisible_ms=SHORT_INVISIBLE_MS)
    assert [m.msg_id for m in result.messages] == [acked.msg_id, control.msg_id]
    await client.ack(group, topic, result.messages[0].properties[Prop.POP_CK])

    back = await pop_eventually(client, group, topic)
    assert [m.msg_id for m in back.messages] == [control.msg_id]
    await client.ack(group, topic, back.messages[0].properties[Prop.POP_CK])
    assert not (await client.pop(group, topic)).found


async def test_change_invisible_time(backend):
    """The new handle acks the message; a longer invisible time holds it back past the
    old expiry (the control, popped with it, comes back first), then it returns."""
    topic, group = await fresh(backend, queues=1)
    client = backend.client()
    sent = [await client.send(topic, body) for body in (b"changed", b"acked", b"control")]
    await wait_visible(client, topic, sent)
    result = await client.pop(group, topic, invisible_ms=SHORT_INVISIBLE_MS)
    changed, acked, control = result.messages
    old = acked.properties[Prop.POP_CK]
    new = await client.change_invisible_time(group, topic, old, 60_000)
    new_ck = PopCheckpointInfo.parse(new)
    assert new != old
    assert (new_ck.invisible_time, new_ck.queue_offset, new_ck.queue_id) == (
        60_000, acked.queue_offset, acked.queue_id)  # fmt: skip
    assert new_ck.pop_time >= result.pop_time
    await client.ack(group, topic, new)

    long_ms = 12_000 if backend.real else 2_000
    changed_at = time.monotonic()
    await client.change_invisible_time(group, topic, changed.properties[Prop.POP_CK], long_ms)

    first = await pop_eventually(client, group, topic)
    assert [m.msg_id for m in first.messages] == [control.msg_id]
    assert time.monotonic() - changed_at < long_ms / 1000
    await client.ack(group, topic, first.messages[0].properties[Prop.POP_CK])

    second = await pop_eventually(client, group, topic)
    assert [m.msg_id for m in second.messages] == [changed.msg_id]
    assert second.messages[0].reconsume_times == 1
    assert time.monotonic() - changed_at >= long_ms / 1000 - 0.1
    await client.ack(group, topic, second.messages[0].properties[Prop.POP_CK])
    assert not (await client.pop(group, topic)).found


async def test_redelivery_through_the_v2_retry_topic(backend):
    """An unacked message comes back from ``%RETRY%<group>+<topic>`` (V2: retry flag 2),
    reconsumeTimes + 1 each time; the broker writes POP_CK into those records itself."""
    topic, group = await fresh(backend, queues=1)
    client = backend.client()
    sent = await client.send(topic, b"retry me", tag="TagR", keys=["key"])
    await wait_visible(client, topic, [sent])
    first = await client.pop(group, topic, invisible_ms=SHORT_INVISIBLE_MS)
    assert first.messages[0].reconsume_times == 0

    raws: list[RemotingCommand] = []

    async def popped() -> bool:
        raws[:] = [await raw_pop(client, group, topic, invisibleTime=SHORT_INVISIBLE_MS)]
        return raws[0].code == ResponseCode.SUCCESS

    for attempt in (1, 2):
        await wait_until(popped, timeout=30, step=0.1, what=f"redelivery {attempt}")
        [raw] = raws
        [record] = decode_messages(raw.body)
        assert record.reconsume_times == attempt
        assert record.topic == topic
        assert record.properties[Prop.UNIQ_KEY] == sent.msg_id
        assert (record.body, record.tags, record.keys) == (b"retry me", "TagR", ["key"])
        assert raw.fields["startOffsetInfo"].startswith("2 0 ")
        info = PopCheckpointInfo.parse(record.properties[Prop.POP_CK])
        assert (info.retry, info.broker_name, info.queue_id) == (2, backend.broker.name, 0)
        assert info.pop_time == int(raw.fields["popTime"])
        assert retry_flag(f"%RETRY%{group}+{topic}") == info.retry

    await client.ack(group, topic, record.properties[Prop.POP_CK])
    assert not (await client.pop(group, topic)).found


async def send_back(client, group: str, topic: str, msg, delay_level: int) -> RemotingCommand:
    fields = {
        "offset": str(msg.commit_log_offset),
        "group": group,
        "delayLevel": str(delay_level),
        "originMsgId": msg.msg_id,
        "originTopic": topic,
    }
    return await client.remoting.invoke(
        RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, fields), 10.0
    )


async def test_dead_letter_queue_after_the_groups_retry_max_times(backend):
    """Revivals never dead-letter (reconsumeTimes passes retryMaxTimes); the group's
    retryMaxTimes decides when CONSUMER_SEND_MSG_BACK moves the message to %DLQ%<group>."""
    topic, group = await fresh(backend, queues=1, retry_max_times=1)
    client = backend.client()
    sent = await client.send(topic, b"doomed")
    await wait_visible(client, topic, [sent])
    dlq = f"%DLQ%{group}"
    attempts = [await client.pop(group, topic, invisible_ms=SHORT_INVISIBLE_MS)]
    for _ in range(2):
        attempts.append(await pop_eventually(client, group, topic, invisible_ms=SHORT_INVISIBLE_MS))
    assert [a.messages[0].reconsume_times for a in attempts] == [0, 1, 2]
    assert {a.messages[0].msg_id for a in attempts} == {sent.msg_id}
    assert await max_offset(client, dlq) == 0  # past retryMaxTimes, still not dead

    # reconsumeTimes 2 >= retryMaxTimes 1: a send-back with delay level 0 dead-letters it.
    last = attempts[-1].messages[0]
    response = await send_back(client, group, topic, last, 0)
    assert response.code == ResponseCode.SUCCESS, response.remark
    await client.ack(group, topic, last.properties[Prop.POP_CK])
    await wait_offset(client, dlq, 1)

    reader = backend.unique("DlqReader")
    dead = await pop_eventually(client, reader, dlq, deadline_s=10)
    [msg] = dead.messages
    assert (msg.msg_id, msg.body, msg.reconsume_times) == (sent.msg_id, b"doomed", 3)


async def test_send_back_before_retry_max_times_does_not_dead_letter(backend):
    topic, group = await fresh(backend, queues=1, retry_max_times=3)
    client = backend.client()
    await wait_visible(client, topic, [await client.send(topic, b"not yet")])
    [msg] = (await client.pop(group, topic)).messages
    dlq = f"%DLQ%{group}"
    # reconsumeTimes 0 < retryMaxTimes 3: to %RETRY%<group> (after a 10 s delay), not the DLQ
    response = await send_back(client, group, topic, msg, 0)
    assert response.code == ResponseCode.SUCCESS, response.remark
    # delay level -1 dead-letters whatever the count; the store keeps the order of the two,
    # so once this one is in the DLQ the first would be too had it gone there.
    response = await send_back(client, group, topic, msg, -1)
    assert response.code == ResponseCode.SUCCESS, response.remark
    await wait_offset(client, dlq, 1)
    assert await max_offset(client, dlq) == 1


async def test_batch_send_lands_consecutively_in_one_queue(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    entries = [BatchEntry(b"b%d" % i, {Prop.TAGS: f"t{i}"}) for i in range(5)]
    sent = await client.send_batch(topic, entries, queue_id=3)
    assert sent.queue_id == 3
    assert len(sent.offset_msg_id.split(",")) == 5
    await wait_visible(client, topic, [sent])

    msgs = (await client.pop(group, topic, queue_id=3)).messages
    assert [m.body for m in msgs] == [e.body for e in entries]
    assert [m.tags for m in msgs] == [f"t{i}" for i in range(5)]
    assert {m.queue_id for m in msgs} == {3}
    assert [m.queue_offset for m in msgs] == list(range(sent.queue_offset, sent.queue_offset + 5))
    assert len({m.msg_id for m in msgs}) == 5
    other = await pop_all(client, backend.unique("Other"), topic)
    assert sorted(m.msg_id for m in other) == sorted(m.msg_id for m in msgs)


def bitset(indexes: list[int]) -> str:
    """base64 of Java ``BitSet.toByteArray()``: little-endian bits, no trailing zero bytes."""
    value = sum(1 << i for i in indexes)
    raw = value.to_bytes((value.bit_length() + 7) // 8, "little")
    return base64.b64encode(raw).decode()


async def test_batch_ack(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    sent = [await client.send(topic, b"%d" % i, queue_id=1) for i in range(3)]
    await wait_visible(client, topic, sent)
    result = await client.pop(group, topic, queue_id=1, invisible_ms=SHORT_INVISIBLE_MS)
    msgs = result.messages
    assert [m.msg_id for m in msgs] == [s.msg_id for s in sent]
    info = ck(msgs[0])
    body = {
        "brokerName": backend.broker.name,
        "acks": [
            {
                "c": group,
                "t": topic,
                "r": "0",
                "so": info.start_offset,
                "q": info.queue_id,
                "rq": info.revive_qid,
                "pt": info.pop_time,
                "it": info.invisible_time,
                "b": bitset([m.queue_offset - info.start_offset for m in (msgs[0], msgs[2])]),
            }
        ],
    }
    response = await client.remoting.invoke(
        RemotingCommand(RequestCode.BATCH_ACK_MESSAGE, {}, orjson.dumps(body)), 10.0
    )
    assert response.code == ResponseCode.SUCCESS

    # Only the one left out comes back.
    again = await pop_eventually(client, group, topic)
    assert [m.msg_id for m in again.messages] == [msgs[1].msg_id]
    await client.ack(group, topic, again.messages[0].properties[Prop.POP_CK])
    assert not (await client.pop(group, topic)).found
