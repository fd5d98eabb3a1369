"""Transactions, timed messages and recall on the broker side, both backends: a half message
is invisible until committed, a rolled-back one is never delivered, an open one is checked
with the producer group's connection, a timed message is delivered at its time, a recalled
one never.

Bounds: the stub and the session's real brokers (``rocketmq_local/launcher.py``) check half
messages older than 3 s every second; RocketMQ's timer has a 1 s precision (a message may
come out up to 1 s before its time, the slot it floors to), and a pop sees it soon after.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from proxy.remoting.answers import BrokerError
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    RequestCode,
    ResponseCode,
)
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import CheckTransactionStateHeader, EndTransactionHeader, now_ms
from proxy.remoting.message import MessageExt, Prop, decode_messages
from proxy.remoting.recall import RecallHandle
from rocketmq_local.launcher import OP_BATCH_THREAD
from testkit.waits import pop_all, wait_until
from tests.conformance._util import pop_eventually

TIMER_PRECISION_MS = 1000
LATE_BOUND_MS = 3000  # a timed message is popped at most this long after its time
CHECK_BOUND_S = 15.0  # 3 s timeout + 1 s interval, with room for a busy machine


async def fresh(backend) -> tuple[str, str]:
    topic, group = backend.unique("T"), backend.unique("G")
    await backend.create_topic(topic, 1)
    await backend.create_group(group)
    return topic, group


async def send_half(client: BrokerClient, topic: str, body: bytes, group: str):
    return await client.send(
        topic,
        body,
        properties={Prop.TRANSACTION_PREPARED: "true", Prop.PRODUCER_GROUP: group},
        producer_group=group,
        sys_flag=TRANSACTION_PREPARED_TYPE,
    )


def end_header(sent, group: str, topic: str, resolution: int, from_check: bool = False):
    return EndTransactionHeader(
        producer_group=group,
        tran_state_table_offset=sent.queue_offset,
        commit_log_offset=sent.commit_log_offset,
        commit_or_rollback=resolution,
        msg_id=sent.msg_id,
        topic=topic,
        from_transaction_check=from_check,
        transaction_id=sent.msg_id,
    )


async def test_half_message_is_invisible_until_commit(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    pgroup = backend.unique("P")
    sent = await send_half(client, topic, b"half", pgroup)
    await asyncio.sleep(1.0)  # room for the half message to show, were it visible
    assert await pop_all(client, group, topic) == []
    await client.end_transaction(end_header(sent, pgroup, topic, TRANSACTION_COMMIT_TYPE))
    [msg] = (await pop_eventually(client, group, topic)).messages
    assert msg.body == b"half"
    assert msg.properties[Prop.UNIQ_KEY] == sent.msg_id
    assert msg.topic == topic


async def test_rolled_back_half_message_is_never_delivered(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    pgroup = backend.unique("P")
    sent = await send_half(client, topic, b"rolled back", pgroup)
    await client.end_transaction(end_header(sent, pgroup, topic, TRANSACTION_ROLLBACK_TYPE))
    marker = await client.send(topic, b"marker")
    got = (await pop_eventually(client, group, topic)).messages
    await asyncio.sleep(1.0)  # room for the rolled-back message to show, were it delivered
    got += await pop_all(client, group, topic)
    assert [m.properties[Prop.UNIQ_KEY] for m in got] == [marker.msg_id]


async def test_open_half_message_is_checked_with_its_producer_group(backend):
    topic, group = await fresh(backend)
    pgroup = backend.unique("P")
    checks: asyncio.Queue[RemotingCommand] = asyncio.Queue()

    def on_request(cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            checks.put_nowait(cmd)
        return None

    broker = backend.broker
    producer = BrokerClient(broker.name, broker.address, server_handler=on_request)
    try:
        await producer.heartbeat(f"conformance-{pgroup}", [pgroup])
        sent = await send_half(producer, topic, b"orphan", pgroup)
        start = time.monotonic()
        cmd = await asyncio.wait_for(checks.get(), CHECK_BOUND_S)
        waited = time.monotonic() - start
        header = CheckTransactionStateHeader.decode(cmd.ext_fields)
        [half] = decode_messages(cmd.body)
        # A real broker puts the half message back at the end of the half queue before it
        # checks it: the check's offsets, not the send's, are what END_TRANSACTION names.
        assert header.commit_log_offset >= sent.commit_log_offset
        assert half.properties[Prop.UNIQ_KEY] == sent.msg_id
        assert half.properties.get(Prop.REAL_TOPIC, half.topic) == topic
        assert half.properties[Prop.PRODUCER_GROUP] == pgroup
        assert half.body == b"orphan"
        assert waited >= 2.0  # not before the transaction timeout (3 s, less slack)
        checked = dataclasses.replace(
            sent,
            offset_msg_id=header.offset_msg_id or "",
            queue_offset=header.tran_state_table_offset,
        )
        assert checked.commit_log_offset == header.commit_log_offset
        await producer.end_transaction(
            end_header(checked, pgroup, topic, TRANSACTION_COMMIT_TYPE, from_check=True)
        )
        [msg] = (await pop_eventually(producer, group, topic)).messages
        assert msg.properties[Prop.UNIQ_KEY] == sent.msg_id
        # The committed message keeps the number of the check it was ended on: the proxy's
        # tests read it to tell a first check answered from a lost one.
        assert half.properties[Prop.TRANSACTION_CHECK_TIMES] == "1"
        assert msg.properties[Prop.TRANSACTION_CHECK_TIMES] == "1"
    finally:
        await producer.close()


async def test_timed_message_is_delivered_at_its_time(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    deliver_ms = now_ms() + 3000
    sent = await client.send(topic, b"timed", properties={Prop.TIMER_DELIVER_MS: str(deliver_ms)})
    assert await pop_all(client, group, topic) == []
    got: list[MessageExt] = []

    async def delivered() -> bool:
        got.extend(await pop_all(client, group, topic))
        return bool(got)

    left_s = (deliver_ms + LATE_BOUND_MS + 2000 - now_ms()) / 1000
    await wait_until(delivered, timeout=left_s, step=0.1, what="the timed message")
    arrived = now_ms()
    assert [m.properties[Prop.UNIQ_KEY] for m in got] == [sent.msg_id]
    assert deliver_ms - TIMER_PRECISION_MS <= arrived <= deliver_ms + LATE_BOUND_MS


async def test_recalled_timed_message_is_never_delivered(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    deliver_ms = now_ms() + 3000
    recalled = await client.send(
        topic, b"recalled", properties={Prop.TIMER_DELIVER_MS: str(deliver_ms)}
    )
    kept = await client.send(topic, b"kept", properties={Prop.TIMER_DELIVER_MS: str(deliver_ms)})
    assert recalled.recall_handle
    handle = RecallHandle.decode(recalled.recall_handle)
    assert (handle.topic, handle.broker, handle.msg_id) == (
        topic,
        backend.broker.name,
        recalled.msg_id,
    )
    assert await client.recall(topic, topic, recalled.recall_handle) == recalled.msg_id
    got = (await pop_eventually(client, group, topic, deadline_s=10.0)).messages
    await asyncio.sleep(1.5)  # room for the recalled message to show, were it delivered
    got += await pop_all(client, group, topic)
    assert [m.properties[Prop.UNIQ_KEY] for m in got] == [kept.msg_id]
    # Once its time is past, a handle cannot be recalled.
    try:
        await client.recall(topic, topic, kept.recall_handle or "")
    except BrokerError as exc:
        assert exc.code == ResponseCode.ILLEGAL_OPERATION
    else:
        raise AssertionError("a recall after the delivery time succeeded")


def _runnable(pid: int, tid: int) -> bool:
    """Whether a thread is running or waiting for a core (state R), not sleeping."""
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "R"


@pytest.mark.real
@pytest.mark.parametrize("backend", ["real"], indirect=True)
async def test_a_real_brokers_op_batch_thread_sleeps_after_a_transaction(backend, real_cluster):
    """RocketMQ 5.5.0's op-batch thread loops without waiting once a broker has ended a
    transaction and its op queue has been quiet for longer than transactionOpBatchInterval,
    unless the broker's settings keep its next wake-up ahead (``rocketmq_local/launcher.py``,
    ``_broker_conf``). After a commit, sampled 60 times over 3 s, it is runnable in few
    samples; a looping thread is runnable in every one, however loaded the machine. Fails if
    the settings go, or if RocketMQ renames the thread (then look again whether it loops)."""
    topic, group = await fresh(backend)
    client = backend.client()
    pgroup = backend.unique("P")
    sent = await send_half(client, topic, b"ended", pgroup)
    await client.end_transaction(end_header(sent, pgroup, topic, TRANSACTION_COMMIT_TYPE))
    await pop_eventually(client, group, topic)
    threads = [
        (broker, tid)
        for broker in real_cluster.brokers
        for tid in broker.process.threads_named(OP_BATCH_THREAD)
    ]
    assert {broker.name for broker, _ in threads} == {b.name for b in real_cluster.brokers}
    runnable = {(broker.name, tid): 0 for broker, tid in threads}
    for _ in range(60):
        for broker, tid in threads:
            runnable[broker.name, tid] += _runnable(broker.process.pid, tid)
        await asyncio.sleep(0.05)
    assert all(count <= 30 for count in runnable.values()), runnable
