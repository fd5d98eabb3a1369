"""Every request limit both ways, through a running proxy: the value at the limit passes,
one past it is refused with the Apache RocketMQ proxy 5.5.0's code and message (docs/api.md,
"Request limits"). One table, run on the broker stubs and on real brokers; and, on real
brokers, run through the Apache proxy 5.5.0 itself, which shows the table's codes and
messages are its own.

Limits in time (the delivery time, the deadline a poll needs) are tried a margin either
side, as the clocks of client and proxy move on between sending and checking.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from rocketmq_local import admin
from testkit.lean_client import SettingsClient

Code = pb.Code
KB16 = 16 * 1024
HOUR_MS = 3600 * 1000
# A receive that was let through: it answered, with messages or without.
ACCEPTED = frozenset({Code.OK, Code.MESSAGE_NOT_FOUND})
_ids = itertools.count()


class TableClient(SettingsClient):
    """A client that tells its version (``None``: tells none, as a client older than the
    header) and opens its settings stream before it receives, as the official clients do
    (the Apache proxy serves no receive without them)."""

    def __init__(self, endpoint: str, client_id: str | None, version: str | None) -> None:
        super().__init__(endpoint, client_id)
        told = (("x-mq-client-version", version),) if version else ()
        self.metadata = (*(m for m in self.metadata if m[0] != "x-mq-client-version"), *told)


@dataclass
class Env:
    """One proxy, a client of it and the topics the table uses, with the proxy's polling
    bounds (``min_poll_ms`` + ``reserve_ms``: the least deadline a poll needs)."""

    endpoint: str
    topic: str  # a plain topic
    group: str
    long_topic: str  # 127 characters
    fifo: str
    delay: str
    transaction: str
    lite: str  # a LITE parent topic
    min_poll_ms: int
    reserve_ms: int
    clients: list[TableClient] = field(default_factory=list)
    held: dict[str, pb.Message] = field(default_factory=dict)

    def client(self, client_id: str | None = "limits-client", version: str | None = "5.2.0"):
        client = TableClient(self.endpoint, client_id, version)
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


Answer = tuple[int, str]


def message(topic: str, body: bytes = b"x", props=None, **system) -> pb.Message:
    """A message as the official producers write it; its type follows from its fields."""
    system.setdefault("message_id", f"LIMITS{next(_ids):026d}")
    if "message_type" not in system:
        kind = pb.MessageType.NORMAL
        if "message_group" in system:
            kind = pb.MessageType.FIFO
        elif "delivery_timestamp" in system:
            kind = pb.MessageType.DELAY
        elif "lite_topic" in system:
            kind = pb.MessageType.LITE
        system["message_type"] = kind
    return pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        system_properties=pb.SystemProperties(body_encoding=pb.Encoding.IDENTITY, **system),
        user_properties=props or {},
    )


async def answer(call: Awaitable) -> Answer:
    """The status of a unary call's response (a gRPC error as its code's name)."""
    try:
        response = await call
    except grpc.aio.AioRpcError as exc:
        return -1, f"gRPC {exc.code().name}: {exc.details()}"
    return response.status.code, response.status.message


async def send(env: Env, *messages: pb.Message, client: TableClient | None = None) -> Answer:
    client = client or env.client()
    request = api.SendMessageRequest(messages=list(messages))
    return await answer(client.stub.SendMessage(request, metadata=client.metadata))


def send_one(topic_of: Callable[[Env], str], body: bytes = b"x", props=None, **system):
    async def run(env: Env) -> Answer:
        return await send(env, message(topic_of(env), body, props, **system))

    return run


def in_ms(delta_ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(int(time.time() * 1000) + delta_ms)
    return stamp


def send_timed(ahead_ms: int):
    """A timed message due ``ahead_ms`` from when the row runs."""

    async def run(env: Env) -> Answer:
        return await send(env, message(env.delay, delivery_timestamp=in_ms(ahead_ms)))

    return run


def ms(value: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(value)
    return d


def receive(
    group_of: Callable[[Env], str] = lambda e: e.group,
    *,
    invisible_ms: int | None = 30_000,
    batch: int = 1,
    deadline_s: Callable[[Env], float] | None = None,
    version: str | None = "5.2.0",
    most: int | None = None,
):
    """A receive of the plain topic (``most``: at most this many messages may come)."""

    async def run(env: Env) -> Answer:
        client = env.client(version=version)
        await client.prepare(env.group, env.topic, env.min_poll_ms)
        timeout = deadline_s(env) if deadline_s else env.min_poll_ms / 1000 + 3
        try:
            got = await client.receive(
                group_of(env), env.topic, await_ms=env.min_poll_ms, batch=batch,
                invisible_ms=invisible_ms, timeout_s=timeout,
            )  # fmt: skip
        except grpc.aio.AioRpcError as exc:
            return -1, f"gRPC {exc.code().name}: {exc.details()}"
        if most is not None and len(got.messages) > most:
            return -1, f"{len(got.messages)} messages, more than {most}"
        return got.status, got.message

    return run


async def held_message(env: Env, name: str = "held") -> pb.Message:
    """A message received (not acked) on the plain topic by the table's group, one per
    ``name``."""
    if name not in env.held:
        client = env.client()
        await client.prepare(env.group, env.topic, env.min_poll_ms)
        body = name.encode()
        assert (await send(env, message(env.topic, body)))[0] == Code.OK
        deadline = time.monotonic() + 30
        for broker in itertools.cycle(("broker-a", "broker-b")):
            got = await client.receive(
                env.group, env.topic, await_ms=env.min_poll_ms, batch=32, broker=broker
            )
            held = [m for m in got.messages if m.body == body]
            if held:
                env.held[name] = held[0]
                break
            assert time.monotonic() < deadline, "the message to hold never came"
    return env.held[name]


def expired(handle: str) -> str:
    """The same receipt handle as of a pop long enough ago that it has expired."""
    fields = handle.split(" ")
    fields[1] = str(int(time.time() * 1000) - int(fields[2]) - 60_000)  # retrieve time
    return " ".join(fields)


def change_invisible(invisible_ms: int, *, stale: bool = False, held_as: str = "held"):
    async def run(env: Env) -> Answer:
        held = await held_message(env, held_as)
        client = env.client()
        handle = held.system_properties.receipt_handle
        request = api.ChangeInvisibleDurationRequest(
            group=pb.Resource(name=env.group),
            topic=pb.Resource(name=env.topic),
            receipt_handle=expired(handle) if stale else handle,
            invisible_duration=ms(invisible_ms),
            message_id=held.system_properties.message_id,
        )
        try:
            response = await client.stub.ChangeInvisibleDuration(request, metadata=client.metadata)
        except grpc.aio.AioRpcError as exc:
            return -1, f"gRPC {exc.code().name}: {exc.details()}"
        if response.status.code == Code.OK:  # the client holds the new handle now
            held.system_properties.receipt_handle = response.receipt_handle
        return response.status.code, response.status.message

    return run


async def ack_held(env: Env, *, stale: bool) -> Answer:
    held = await held_message(env)
    client = env.client()
    handle = held.system_properties.receipt_handle
    request = api.AckMessageRequest(
        group=pb.Resource(name=env.group),
        topic=pb.Resource(name=env.topic),
        entries=[
            api.AckMessageEntry(
                message_id=held.system_properties.message_id,
                receipt_handle=expired(handle) if stale else handle,
            )
        ],
    )
    try:
        response = await client.stub.AckMessage(request, metadata=client.metadata)
    except grpc.aio.AioRpcError as exc:
        return -1, f"gRPC {exc.code().name}: {exc.details()}"
    [entry] = response.entries
    # The status clients raise, then the entry's own.
    return response.status.code, f"{response.status.message} / {entry.status.message}"


async def end_transaction(env: Env, *, blank: bool) -> Answer:
    client = env.client()
    half = message(env.transaction, b"half", message_type=pb.MessageType.TRANSACTION)
    sent = await client.stub.SendMessage(
        api.SendMessageRequest(messages=[half]), metadata=client.metadata
    )
    assert sent.status.code == Code.OK, sent.status
    request = api.EndTransactionRequest(
        topic=pb.Resource(name=env.transaction),
        message_id=half.system_properties.message_id,
        transaction_id=" " if blank else sent.entries[0].transaction_id,
        resolution=pb.TransactionResolution.ROLLBACK,
        source=pb.TransactionSource.SOURCE_CLIENT,
    )
    return await answer(client.stub.EndTransaction(request, metadata=client.metadata))


def props_of(total: int, count: int = 1) -> dict[str, str]:
    """``count`` user properties of ``total`` UTF-8 bytes, names and values together."""
    names = [f"p{i:03d}" for i in range(count)]
    left = total - sum(len(n) for n in names)
    values = [left // count + (1 if i < left % count else 0) for i in range(count)]
    return {n: "v" * v for n, v in zip(names, values, strict=True)}


@dataclass(frozen=True)
class Row:
    field: str
    case: str
    run: Callable[[Env], Awaitable[Answer]]
    code: int | frozenset[int]
    message: str | None = None  # None: any text


def ok(field: str, case: str, run, code: int | frozenset[int] = Code.OK) -> Row:
    return Row(field, case, run, code)


def no(field: str, case: str, run, code: int, message: str) -> Row:
    return Row(field, case, run, code, message)


T = lambda e: e.topic  # noqa: E731 - the table reads better with these
TOO_LARGE = Code.MESSAGE_PROPERTIES_TOO_LARGE
# The Apache proxy's text for an expired handle names the Java exception it came from.
EXPIRED = "org.apache.rocketmq.proxy.common.ProxyException: receipt handle is expired"
TOTAL = "the total size of user property is too large, max is 16384"
X127 = "x" * 127

TABLE = [
    # topic
    ok("topic", "127 characters", send_one(lambda e: e.long_topic)),
    no("topic", "128 characters", send_one(lambda e: e.long_topic + "x"), Code.ILLEGAL_TOPIC,
       "The specified topic is longer than topic max length 127."),
    no("topic", "blank", send_one(lambda e: " "), Code.ILLEGAL_TOPIC,
       "The specified topic is blank"),
    no("topic", "illegal character", send_one(lambda e: "a/b"), Code.ILLEGAL_TOPIC,
       "The specified topic[a/b] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
    no("topic", "system topic", send_one(lambda e: "TBW102"), Code.ILLEGAL_TOPIC,
       "cannot access system topic"),
    # group
    ok("group", "120 characters", receive(lambda e: "G" * 120), ACCEPTED),
    no("group", "121 characters", receive(lambda e: "G" * 121), Code.ILLEGAL_CONSUMER_GROUP,
       f"the specified group[{'G' * 121}] is longer than group max length: 120."),
    no("group", "system group", receive(lambda e: "CID_RMQ_SYS_X"), Code.ILLEGAL_CONSUMER_GROUP,
       "cannot use system consumer group"),
    # tag: counts against the 16 KB of user properties, tag and keys
    ok("tag", "16384 bytes", send_one(T, tag="t" * KB16)),
    no("tag", "16385 bytes", send_one(T, tag="t" * (KB16 + 1)), TOO_LARGE, TOTAL),
    no("tag", "'|'", send_one(T, tag="a|b"), Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'"),
    no("tag", "control character", send_one(T, tag="a\x85"), Code.ILLEGAL_MESSAGE_TAG,
       "tag cannot contain control character"),
    # keys: likewise
    ok("keys", "one key of 16384 bytes", send_one(T, keys=["k" * KB16])),
    no("keys", "one key of 16385 bytes", send_one(T, keys=["k" * (KB16 + 1)]), TOO_LARGE, TOTAL),
    no("keys", "blank key", send_one(T, keys=["a", " "]), Code.ILLEGAL_MESSAGE_KEY,
       "key cannot be the char sequence of whitespace"),
    # user properties: how many, and their size with the tag and keys
    ok("properties", "128 properties", send_one(T, props=props_of(1000, 128))),
    no("properties", "129 properties", send_one(T, props=props_of(1000, 129)), TOO_LARGE,
       "too many user properties, max is 128"),
    ok("properties", "16384 bytes", send_one(T, props=props_of(KB16, 4))),
    no("properties", "16385 bytes", send_one(T, props=props_of(KB16 + 1, 4)), TOO_LARGE, TOTAL),
    ok("properties", "with tag and keys, 16384 bytes",
       send_one(T, props=props_of(KB16 - 200), tag="t" * 100, keys=["k" * 60, "k" * 40])),
    no("properties", "with tag and keys, 16385 bytes",
       send_one(T, props=props_of(KB16 - 199), tag="t" * 100, keys=["k" * 60, "k" * 40]),
       TOO_LARGE, TOTAL),
    no("properties", "a system property", send_one(T, props={"UNIQ_KEY": "1"}),
       Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "property is used by system: UNIQ_KEY"),
    no("properties", "control character in a value", send_one(T, props={"a": "b\x01"}),
       Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "the value of property cannot contain control character"),
    # message id
    no("message id", "blank", send_one(T, message_id=" "), Code.ILLEGAL_MESSAGE_ID,
       "message id cannot be empty"),
    # message group: shorter than 64 bytes
    ok("message group", "63 bytes", send_one(lambda e: e.fifo, message_group="g" * 63)),
    no("message group", "64 bytes", send_one(lambda e: e.fifo, message_group="g" * 64),
       Code.ILLEGAL_MESSAGE_GROUP, "message group exceed the max size 64"),
    no("message group", "200 characters", send_one(lambda e: e.fifo, message_group="g" * 200),
       Code.ILLEGAL_MESSAGE_GROUP, "message group exceed the max size 64"),
    no("message group", "blank", send_one(lambda e: e.fifo, message_group="  "),
       Code.ILLEGAL_MESSAGE_GROUP, "message group cannot be the char sequence of whitespace"),
    # delivery time: at most 24 h ahead
    ok("delivery time", "24 h - 1 min ahead", send_timed(24 * HOUR_MS - 60_000)),
    no("delivery time", "24 h + 1 min ahead", send_timed(24 * HOUR_MS + 60_000),
       Code.ILLEGAL_DELIVERY_TIME, "the max delay time of message is too large, max is 86400000"),
    # orphaned transaction recovery: at most 1 h
    ok("transaction recovery", "3600 s",
       send_one(lambda e: e.transaction, message_type=pb.MessageType.TRANSACTION,
                orphaned_transaction_recovery_duration=ms(3600_000))),
    no("transaction recovery", "3601 s",
       send_one(lambda e: e.transaction, message_type=pb.MessageType.TRANSACTION,
                orphaned_transaction_recovery_duration=ms(3601_000)),
       Code.BAD_REQUEST, "the max transaction recovery time of message is too large, max is 3600"),
    # lite topic: at most 64 bytes
    ok("lite topic", "64 bytes", send_one(lambda e: e.lite, lite_topic="l" * 64)),
    no("lite topic", "65 bytes", send_one(lambda e: e.lite, lite_topic="l" * 65),
       Code.ILLEGAL_LITE_TOPIC, "lite topic exceed the max size 64"),
    no("lite topic", "illegal character", send_one(lambda e: e.lite, lite_topic="a.b"),
       Code.ILLEGAL_LITE_TOPIC,
       "lite topic can only contain alphanumeric characters, hyphens(-), and underscores(_)"),
    # body: at most 4 MiB
    ok("body", "4 MiB", send_one(lambda e: e.long_topic, body=b"b" * (4 * 1024 * 1024))),
    no("body", "4 MiB + 1", send_one(T, body=b"b" * (4 * 1024 * 1024 + 1)),
       Code.MESSAGE_BODY_TOO_LARGE, "message body cannot exceed the max 4194304"),
    no("body", "empty", send_one(T, body=b""), Code.MESSAGE_BODY_EMPTY,
       "message body cannot be empty"),
    # invisible time of a receive: 10 s to 12 h
    ok("invisible time", "receive, 10000 ms", receive(invisible_ms=10_000), ACCEPTED),
    no("invisible time", "receive, 9999 ms", receive(invisible_ms=9_999),
       Code.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too small. min is 10000"),
    no("invisible time", "receive, none", receive(invisible_ms=None),
       Code.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too small. min is 10000"),
    ok("invisible time", "receive, 12 h", receive(invisible_ms=12 * HOUR_MS), ACCEPTED),
    no("invisible time", "receive, 12 h + 1 ms", receive(invisible_ms=12 * HOUR_MS + 1),
       Code.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too large. max is 43200000"),
    # batch size: more than 32 is cut to 32, not refused
    ok("batch size", "32", receive(batch=32, most=32), ACCEPTED),
    ok("batch size", "33", receive(batch=33, most=32), ACCEPTED),
    # polling time: the client's deadline must leave the shortest poll
    ok("polling time", "deadline 1 s past the shortest poll",
       receive(deadline_s=lambda e: (e.min_poll_ms + e.reserve_ms) / 1000 + 1), ACCEPTED),
    no("polling time", "deadline short of the shortest poll",
       receive(deadline_s=lambda e: (e.min_poll_ms + e.reserve_ms) / 2000),
       Code.ILLEGAL_POLLING_TIME,
       "The deadline time remaining is not enough for polling, please check network condition"),
    no("polling time", "... from a client older than 5.0.3",
       receive(deadline_s=lambda e: (e.min_poll_ms + e.reserve_ms) / 2000, version="5.0.2"),
       Code.BAD_REQUEST,
       "The deadline time remaining is not enough for polling, please check network condition"),
    # invisible time of a change: 0 to 12 h; then the receipt handle, before and after
    # it expires
    ok("invisible time", "change, 12 h", change_invisible(12 * HOUR_MS)),
    no("invisible time", "change, 12 h + 1 ms", change_invisible(12 * HOUR_MS + 1),
       Code.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too large. max is 43200000"),
    no("invisible time", "change, -1 ms", change_invisible(-1),
       Code.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too small. min is 0"),
    ok("invisible time", "change, 0 ms", change_invisible(0, held_as="other")),
    no("receipt handle", "change, expired", change_invisible(20_000, stale=True),
       Code.INVALID_RECEIPT_HANDLE, EXPIRED),
    no("receipt handle", "ack, expired", lambda e: ack_held(e, stale=True),
       Code.INVALID_RECEIPT_HANDLE, f"INVALID_RECEIPT_HANDLE / {EXPIRED}"),
    ok("receipt handle", "ack, in time", lambda e: ack_held(e, stale=False)),
    # transaction id
    ok("transaction id", "as sent", lambda e: end_transaction(e, blank=False)),
    no("transaction id", "blank", lambda e: end_transaction(e, blank=True),
       Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty"),
    # message type: the topic's
    no("message type", "a FIFO message to a DELAY topic",
       send_one(lambda e: e.delay, message_group="g"), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
       "org.apache.rocketmq.proxy.common.ProxyException: TopicMessageType validate failed, "
       "the expected type is DELAY, but actual type is FIFO"),
    # client id, request shape
    no("client id", "none", lambda e: send(e, message(e.topic), client=e.client(None)),
       Code.CLIENT_ID_REQUIRED, "client id cannot be empty"),
    no("request", "no message", lambda e: send(e), Code.MESSAGE_CORRUPTED, "no message to send"),
    no("request", "two topics", lambda e: send(e, message(e.topic), message(e.fifo)),
       Code.MESSAGE_CORRUPTED, "topic in message is not same"),
]  # fmt: skip


async def run_table(env: Env) -> list[str]:
    """Each row in order; a line for each that did not answer as expected."""
    wrong = []
    for row in TABLE:
        code, text = await row.run(env)
        codes = row.code if isinstance(row.code, frozenset) else {row.code}
        if code not in codes or (row.message is not None and text != row.message):
            want = "/".join(pb.Code.Name(c) for c in sorted(codes))
            got = pb.Code.Name(code) if code in pb.Code.values() else code
            wrong.append(
                f"{row.field}, {row.case}: {got} {text[:200]!r}, not {want} {row.message!r}"
            )
    return wrong


async def typed_topics(create, base: str) -> dict[str, str]:
    """The table's topics of their own types, by the ``create(name, message_type)`` given."""
    names = {
        "long_topic": (base + X127)[:127],
        "fifo": f"F{base}",
        "delay": f"D{base}",
        "transaction": f"X{base}",
        "lite": f"L{base}",
    }
    types = {"long_topic": None, "fifo": "FIFO", "delay": "DELAY",
             "transaction": "TRANSACTION", "lite": "LITE"}  # fmt: skip
    await asyncio.gather(*(create(names[k], types[k]) for k in names))
    return names


def env_of(
    endpoint: str, topic: str, group: str, topics: dict[str, str], *, min_poll_ms, reserve_ms
) -> Env:
    return Env(
        endpoint, topic, group, topics["long_topic"], topics["fifo"], topics["delay"],
        topics["transaction"], topics["lite"], min_poll_ms, reserve_ms,
    )  # fmt: skip


async def test_each_limit_passes_at_the_limit_and_is_refused_past_it(backend):
    app = await backend.start(mode="notify")
    topics = await typed_topics(
        lambda name, kind: backend.create_topic(name, message_type=kind), backend.topic
    )
    rc = app.config.receive
    env = env_of(
        f"127.0.0.1:{app.grpc_port}", backend.topic, backend.group, topics,
        min_poll_ms=rc.min_polling_ms, reserve_ms=rc.reserve_ms,
    )  # fmt: skip
    try:
        wrong = await run_table(env)
    finally:
        await env.close()
    assert not wrong, "\n".join(wrong)


@pytest.mark.real
async def test_the_apache_proxy_answers_the_table_alike(real_cluster, apache_proxy):
    """The same table through the Apache proxy 5.5.0 (its defaults: polls of 5 s at least,
    answered up to the deadline) on the same kind of brokers: its codes and messages are the
    table's."""
    base = f"Tapache{next(_ids)}x{int(time.time())}"
    group = f"Gapache{next(_ids)}x{int(time.time())}"

    async def create(name: str, kind: str | None) -> None:
        await asyncio.to_thread(
            admin.create_topic, real_cluster.namesrv_address, name, message_type=kind,
            brokers={b.name: b.address for b in real_cluster.brokers},
        )  # fmt: skip

    await create(base, None)
    topics = await typed_topics(create, base)
    env = env_of(apache_proxy.grpc_address, base, group, topics, min_poll_ms=5000, reserve_ms=0)
    try:
        wrong = await run_table(env)
    finally:
        await env.close()
    assert not wrong, "\n".join(wrong)


async def test_configured_limits_reach_a_running_proxy(start_proxy):
    """The [limits] table, not only the defaults: a proxy given other limits refuses at
    those (sends, receives), with the limit in the message."""
    from proxy.config import LimitsConfig

    limits = LimitsConfig(max_user_property_count=2, min_receive_invisible_ms=2_000)
    app = await start_proxy(mode="notify", brokers=1, proxy_options={"limits": limits})
    env = Env(f"127.0.0.1:{app.grpc_port}", "T", "G-limits", "", "", "", "", "",
              app.config.receive.min_polling_ms, app.config.receive.reserve_ms)  # fmt: skip
    try:
        two, three = ({f"k{i}": "v" for i in range(n)} for n in (2, 3))
        assert await send_one(lambda e: e.topic, props=two)(env) == (Code.OK, "OK")
        code, text = await send_one(lambda e: e.topic, props=three)(env)
        assert (code, text) == (Code.MESSAGE_PROPERTIES_TOO_LARGE,
                                "too many user properties, max is 2")  # fmt: skip
        assert (await receive(invisible_ms=2_000)(env))[0] == Code.OK
        code, text = await receive(invisible_ms=1_999)(env)
        assert (code, text) == (Code.ILLEGAL_INVISIBLE_TIME,
                                "the invisibleTime is too small. min is 2000")  # fmt: skip
    finally:
        await env.close()
