"""Metrics and event records that a scripted scenario produces, checked against what
happened."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from proxy.api.v2 import definition_pb2 as pb
from testkit.event_log import part_files, read_records
from testkit.metrics_text import total
from testkit.waits import wait_until
from tests.support.brokers import send_to

T, G = "T", "G"


def read_events(directory) -> list[dict]:
    files = part_files(Path(directory) / "proxy=test-proxy-0")
    assert files, list(Path(directory).rglob("*"))
    return read_records(files)


def value(app, name: str, **labels) -> float:
    """The sum of ``app``'s samples called ``name`` whose labels include ``labels``."""
    return total(app.metrics.render()[0], name, **labels)


async def test_scenario_metrics_and_events(start_proxy, lean, tmp_path):
    app = await start_proxy(mode="notify", event_log_dir=str(tmp_path))
    client = lean(app)
    # 1. two messages wait on broker-a: the first pop finds them (a short-polling hit)
    await send_to(app, "broker-a", b"one")
    await send_to(app, "broker-a", b"two")
    hit = await client.receive(G, T, await_ms=1000, broker="broker-a")
    assert len(hit.messages) == 2
    # 2. nothing anywhere: probes to all three brokers, then empty
    empty = await client.receive(G, T, await_ms=400, broker="broker-a")
    assert empty.status == pb.Code.MESSAGE_NOT_FOUND
    # 3. a message lands on broker-c while the poll waits: the empty poll's probes linger,
    # parked on all three, so this poll skips its first pop and watches them
    poll = asyncio.ensure_future(client.receive(G, T, await_ms=3000, broker="broker-a"))
    await wait_until(lambda: app.engine.hub.watchers == 3)  # waiting on all three
    await send_to(app, "broker-c", b"three")
    late = await poll
    assert [m.body for m in late.messages] == [b"three"]
    # 4. a bad request
    bad = await client.receive(G, T, await_ms=1000, invisible_ms=1000)
    assert bad.status == pb.Code.ILLEGAL_INVISIBLE_TIME

    receive_total = "rocketmq_proxy_receive_total"
    common = dict(group=G, topic=T, mode="notify", is_long_polling="true")
    assert value(app, receive_total, **common, is_short_polling_hit="true", result="found") == 1
    assert value(app, receive_total, **common, is_short_polling_hit="false", result="found") == 1
    assert value(app, receive_total, **common, is_short_polling_hit="false", result="empty") == 1
    assert value(app, receive_total, **common, result="error") == 1
    assert value(app, receive_total) == 4
    assert value(app, "rocketmq_proxy_receive_wait_seconds_count", mode="notify") == 4
    assert value(app, "rocketmq_proxy_notifications_total", broker="broker-c", has_msg="true") >= 1
    assert value(app, "rocketmq_proxy_long_polls_in_flight") == 0
    pops = value(
        app,
        "rocketmq_proxy_rpc_latency_seconds_count",
        protocol_type="remoting",
        request_code="pop_message",
    )
    assert pops == 1 + 1 + 1  # hit; empty's first pop; late: the pop on broker-c only
    grpc_receives = value(
        app,
        "rocketmq_proxy_rpc_latency_seconds_count",
        protocol_type="grpc",
        request_code="receive_message",
    )
    assert grpc_receives == 4

    # the ops server serves the same numbers
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{app.http_port}"
        async with http.get(f"{base}/metrics") as r:
            assert r.status == 200 and receive_total in await r.text()
        async with http.get(f"{base}/readyz") as r:
            assert r.status == 200
        async with http.get(f"{base}/v1/status") as r:
            status = await r.json()
            assert status["receive"]["in_flight"] == {"notify": 0}
            assert set(status["brokers"]) == {"broker-a", "broker-b", "broker-c"}

    await app.stop()  # closes the event log: its files are complete now
    events = await asyncio.to_thread(read_events, tmp_path)
    assert [e["result"] for e in events] == ["found", "empty", "found", "illegal_invisible_time"]
    first, second, third, fourth = events
    assert first["messages"] == 2 and first["is_short_polling_hit"] is True
    assert first["pops"] == 1 and first["notifications"] == 0 and first["broker"] == "broker-a"
    assert second["messages"] == 0 and second["notifications"] == 3 and second["broker"] is None
    assert second["polling_ms"] == 400 and second["wait_ms"] >= 350
    assert third["broker"] == "broker-c" and third["pops"] == 1 and third["notifications"] == 0
    assert third["is_short_polling_hit"] is False and third["wait_ms"] < 1500
    assert fourth["messages"] == 0
    for event in events:
        assert event["proxy"] == "test-proxy-0" and event["mode"] == "notify"
        assert event["group"] == G and event["topic"] == T and event["is_long_polling"] is True
        assert set(event) == {
            "ts",
            "proxy",
            "group",
            "topic",
            "mode",
            "is_long_polling",
            "is_short_polling_hit",
            "polling_ms",
            "wait_ms",
            "messages",
            "result",
            "pops",
            "notifications",
            "broker",
        }


async def test_a_cancelled_receive_is_recorded_as_cancelled(start_proxy, lean, tmp_path):
    app = await start_proxy(mode="notify", event_log_dir=str(tmp_path))
    poll = asyncio.ensure_future(lean(app).receive(G, T, await_ms=5000))
    await wait_until(lambda: value(app, "rocketmq_proxy_long_polls_in_flight") == 1)
    poll.cancel()
    await wait_until(lambda: value(app, "rocketmq_proxy_receive_total") == 1)

    assert value(app, "rocketmq_proxy_receive_total", result="error") == 1
    await app.stop()
    [event] = await asyncio.to_thread(read_events, tmp_path)
    assert (event["result"], event["messages"]) == ("cancelled", 0)


async def test_readyz_turns_false_at_once_on_stop(start_proxy):
    app = await start_proxy(mode="notify")
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{app.http_port}/readyz"
        async with http.get(url) as r:
            assert r.status == 200
        app.ready = False  # what stop() does first
        async with http.get(url) as r:
            assert r.status == 503


class _StreamBreaksAfter:
    """A ServicerContext whose stream breaks at the ``n``-th write, as when the client's
    connection drops mid-answer. grpc gives no way to make a real stream fail at a chosen
    write, so the activity is driven directly with this stand-in; everything behind it
    (engine, brokers, hand-back, record) is real."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.written: list = []

    def invocation_metadata(self):
        return (("x-mq-client-id", "breaking-client"),)

    def time_remaining(self):
        return None

    async def write(self, response) -> None:
        if len(self.written) + 1 == self.n:
            raise ConnectionResetError("stream broke")
        self.written.append(response)


async def test_a_stream_that_breaks_mid_answer_records_what_was_written(
    start_proxy, lean, tmp_path
):
    """Two messages popped, the stream breaks writing the second: the record says one
    message and write_failed (not found with two), and the second is handed back."""
    from testkit.lean_client import receive_request

    app = await start_proxy(mode="notify", event_log_dir=str(tmp_path), hand_back_invisible_ms=200)
    await send_to(app, "broker-a", b"one")
    await send_to(app, "broker-a", b"two")
    context = _StreamBreaksAfter(3)  # status, first message, then the second fails
    request = receive_request(G, T, await_ms=1000, broker="broker-a")
    try:
        await app.receive.receive_message(request, context)
    except ConnectionResetError:
        pass
    else:
        raise AssertionError("the broken write did not surface")
    [status, first] = context.written
    assert status.status.code == pb.Code.OK and first.message.body in (b"one", b"two")

    assert value(app, "rocketmq_proxy_nacks_total", reason="write_failed") == 1
    assert value(app, "rocketmq_proxy_receive_total", result="error") == 1
    assert value(app, "rocketmq_proxy_receive_total", result="found") == 0
    other = b"two" if first.message.body == b"one" else b"one"
    again = await lean(app).receive(G, T, await_ms=3000, broker="broker-a")
    assert [m.body for m in again.messages] == [other]  # back within the 0.2 s hand-back
    await app.stop()
    [broken, _] = await asyncio.to_thread(read_events, tmp_path)
    assert (broken["result"], broken["messages"], broken["broker"]) == (
        "write_failed",
        1,
        "broker-a",
    )
