"""Bad requests and bad bytes: the broker answers with RocketMQ's codes, or closes only the
offending connection, and keeps serving everyone else."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from proxy.remoting.answers import BrokerError
from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand, decode, encode
from proxy.remoting.message import Prop
from proxy.remoting.popinfo import PopCheckpointInfo
from tests.support.remoting import pop_fields

T = "TopicBad"
G = "GroupBad"
TIMEOUT = 3.0


@pytest.fixture
async def raw(broker, client):
    """A RemotingClient to the broker, with topic T created (4 queues)."""
    await client.send(T, b"seed")
    remoting = RemotingClient(broker.address)
    yield remoting
    await remoting.close()


async def call(remoting: RemotingClient, code: int, fields: dict, body: bytes = b""):
    return await remoting.invoke(RemotingCommand(code, fields, body), TIMEOUT)


async def test_unknown_request_code(raw):
    response = await call(raw, 9999, {})
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "9999" in (response.remark or "")


async def test_pop_more_than_32(raw):
    response = await call(raw, RequestCode.POP_MESSAGE, pop_fields(G, T, maxMsgNums=33))
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "32" in response.remark


async def test_pop_32_is_allowed(raw):
    response = await call(raw, RequestCode.POP_MESSAGE, pop_fields(G, T, maxMsgNums=32))
    assert response.code == ResponseCode.SUCCESS


async def test_missing_required_field(raw):
    fields = pop_fields(G, T)
    del fields["consumerGroup"]
    response = await call(raw, RequestCode.POP_MESSAGE, fields)
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "consumerGroup" in response.remark


async def test_non_numeric_queue_id(raw):
    response = await call(raw, RequestCode.POP_MESSAGE, pop_fields(G, T, queueId="one"))
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "queueId" in response.remark


async def test_send_to_bad_topic_name(broker, raw):
    fields = {"a": "PG", "b": "bad topic!", "c": "TBW102", "d": "4", "e": "-1", "f": "0"}
    fields |= {"g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false"}
    response = await call(raw, RequestCode.SEND_MESSAGE_V2, fields, b"x")
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "bad topic!" in response.remark
    assert broker.topics.get("bad topic!") is None


async def test_pop_on_unknown_topic(raw):
    response = await call(raw, RequestCode.POP_MESSAGE, pop_fields(G, "NoSuchTopic"))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST


@pytest.mark.parametrize("queue_id", ["4", "99", "-2"])
async def test_pop_queue_id_out_of_range(raw, queue_id):
    response = await call(raw, RequestCode.POP_MESSAGE, pop_fields(G, T, queueId=queue_id))
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "queueId" in response.remark


async def test_illegal_filter_expression(raw):
    response = await call(raw, RequestCode.POP_MESSAGE, pop_fields(G, T, exp="||"))
    assert response.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


async def test_trailing_or_in_filter_is_skipped_as_rocketmq_does(client):
    """RocketMQ's FilterAPI drops empty pieces: "a || " subscribes to tag a only."""
    sent = {tag: await client.send(T, b"x", tag=tag) for tag in ("a", "b")}
    result = await client.pop(G, T, expression="a || ")
    assert [m.msg_id for m in result.messages] == [sent["a"].msg_id]


async def test_ack_with_malformed_extra_info(raw):
    fields = {
        "consumerGroup": G,
        "topic": T,
        "queueId": "0",
        "extraInfo": "not a checkpoint",
        "offset": "0",
    }
    response = await call(raw, RequestCode.ACK_MESSAGE, fields)
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert "extraInfo" in response.remark


async def test_ack_with_offset_beyond_max(broker, raw, client):
    result = await client.pop(G, T)
    msg = result.messages[0]
    info = PopCheckpointInfo.parse(msg.properties[Prop.POP_CK])
    beyond = broker.store.max_offset(T, info.queue_id) + 5
    fields = {
        "consumerGroup": G,
        "topic": T,
        "queueId": str(info.queue_id),
        "extraInfo": msg.properties[Prop.POP_CK],
        "offset": str(beyond),
    }
    response = await call(raw, RequestCode.ACK_MESSAGE, fields)
    assert response.code == ResponseCode.NO_MESSAGE
    # The real checkpoint is untouched: acking the right offset still works.
    assert broker.pop.checkpoint_count == 1
    await client.ack(G, T, msg.properties[Prop.POP_CK])
    assert broker.pop.checkpoint_count == 0


# -- raw sockets ------------------------------------------------------------------------------


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def read_frame(reader: asyncio.StreamReader) -> RemotingCommand:
    (length,) = struct.unpack(">i", await reader.readexactly(4))
    return decode(await reader.readexactly(length))


async def assert_closed(reader: asyncio.StreamReader) -> None:
    """The broker closed the connection: EOF (or a reset) within a bounded time."""
    try:
        data = await asyncio.wait_for(reader.read(65536), 2.0)
    except ConnectionResetError:
        return
    assert data == b""


async def test_oneway_request_gets_no_response(broker):
    reader, writer = await asyncio.open_connection(*host_port(broker.address))
    try:
        oneway = RemotingCommand(RequestCode.HEART_BEAT, {}, b"{}", opaque=101, flag=FLAG_ONEWAY)
        oneway_unknown = RemotingCommand(9999, {}, opaque=102, flag=FLAG_ONEWAY)
        normal = RemotingCommand(RequestCode.HEART_BEAT, {}, b"{}", opaque=103)
        writer.write(encode(oneway) + encode(oneway_unknown) + encode(normal))
        await writer.drain()
        response = await asyncio.wait_for(read_frame(reader), 2.0)
        assert response.opaque == 103
        assert response.code == ResponseCode.SUCCESS
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.2)
    finally:
        writer.close()


async def bad_bytes_close_only_that_connection(broker, client, bad: bytes) -> None:
    """Send ``bad`` on one raw connection; it closes while another raw connection and the
    typed client keep working, and a message sent before is not lost."""
    before = await client.send(T, b"before", queue_id=2)
    victim_r, victim_w = await asyncio.open_connection(*host_port(broker.address))
    other_r, other_w = await asyncio.open_connection(*host_port(broker.address))
    try:
        ping = RemotingCommand(RequestCode.HEART_BEAT, {}, b"{}", opaque=1)
        other_w.write(encode(ping))
        assert (await asyncio.wait_for(read_frame(other_r), 2.0)).opaque == 1

        victim_w.write(bad)
        await victim_w.drain()
        await assert_closed(victim_r)

        ping.opaque = 2
        other_w.write(encode(ping))
        assert (await asyncio.wait_for(read_frame(other_r), 2.0)).opaque == 2
    finally:
        victim_w.close()
        other_w.close()

    after = await client.send(T, b"after", queue_id=2)
    got = await client.pop(G, T, queue_id=2)
    ids = [m.msg_id for m in got.messages]
    assert before.msg_id in ids
    assert after.msg_id in ids


async def test_oversized_frame_closes_that_connection_only(broker, client):
    await bad_bytes_close_only_that_connection(broker, client, b"\x7f\xff\xff\xff" + b"\0" * 64)


async def test_garbage_json_header_closes_that_connection_only(broker, client):
    header = b"this is {not json"
    frame = struct.pack(">iI", 4 + len(header), len(header)) + header
    await bad_bytes_close_only_that_connection(broker, client, frame)


async def test_header_longer_than_frame_closes_that_connection_only(broker, client):
    header = b'{"code":34}'
    frame = struct.pack(">iI", 4 + len(header), 1000) + header
    await bad_bytes_close_only_that_connection(broker, client, frame)


async def test_send_with_body_over_4_mib_is_illegal(broker, client):
    with pytest.raises(BrokerError) as err:
        await client.send(T, b"x" * (4 * 1024 * 1024 + 1))
    assert err.value.code == ResponseCode.MESSAGE_ILLEGAL
    # The connection survives and exactly-at-the-limit bodies are fine.
    sent = await client.send(T, b"y" * (4 * 1024 * 1024), queue_id=3)
    got = await client.pop(G, T, queue_id=3)
    assert [m.msg_id for m in got.messages] == [sent.msg_id]
    assert len(got.messages[0].body) == 4 * 1024 * 1024
