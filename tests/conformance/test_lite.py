"""Lite topics (RocketMQ 5.5, RIP-83) as both backends serve them: a LITE parent topic, lite
messages indexed in their LMQ, per-client subscriptions (LITE_SUBSCRIPTION_CTL), orderly
pops across them (POP_LITE_MESSAGE), lite acks, long polling, quota and unsubscribe."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson

from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import (
    AckMessageHeader,
    ChangeInvisibleTimeHeader,
    ChangeInvisibleTimeResponseHeader,
    NotifyUnsubscribeLiteHeader,
    PopLiteMessageHeader,
    PopLiteMessageResponseHeader,
    SendMessageHeader,
    TopicHeader,
    now_ms,
)
from proxy.remoting.lite import (
    POLICY_MIN,
    LiteAction,
    LiteSubscription,
    LiteSubscriptionCtlBody,
    OffsetOption,
    OffsetType,
    lite_owner,
    lmq_name,
)
from proxy.remoting.message import MessageExt, Prop, decode_messages, encode_properties
from proxy.remoting.popinfo import PopCheckpointInfo
from rocketmq_local.admin import max_offset
from tests.conformance._util import wait_offset

Action = LiteAction
TIMEOUT_S = 10.0
# How long past its poll time a parked lite pop may take to be answered: a real broker answers
# at its poll time, but on 2 cores under the whole suite the answer can lag by seconds. The
# slack only bounds the wait; the tests check what the answer says.
PARKED_SLACK_S = 30.0


async def lite_fresh(backend, *, exclusive: bool = False) -> tuple[str, str]:
    """A LITE parent topic and a lite group bound to it."""
    parent, group = backend.unique("LP"), backend.unique("LG")
    await backend.create_topic(parent, 2, message_type="LITE")
    attributes = {"lite.bind.topic": parent}
    if exclusive:
        attributes["lite.sub.model"] = "Exclusive"  # one client per lite topic (default Shared)
    await backend.create_group(group, attributes=attributes)
    return parent, group


async def owned_lite_topics(backend, parent: str, count: int) -> list[str]:
    """``count`` lite topic names the first broker owns (the parent route's sharding), so a
    subscription there holds them before any message exists."""
    client = backend.remoting(backend.namesrv)
    route = await client.invoke(
        RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, TopicHeader(parent).encode()),
        TIMEOUT_S,
    )
    assert route.code == ResponseCode.SUCCESS, route.remark
    queue_datas = orjson.loads(route.body)["queueDatas"]
    names: list[str] = []
    for i in range(1000):
        name = f"lt{i}"
        if lite_owner(name, queue_datas) == backend.broker.name:
            names.append(name)
            if len(names) == count:
                return names
    raise AssertionError(f"no {count} lite topics shard to {backend.broker.name}")


async def ctl(remoting: RemotingClient, *entries: LiteSubscription) -> RemotingCommand:
    body = LiteSubscriptionCtlBody(entries).encode()
    return await remoting.invoke(
        RemotingCommand(RequestCode.LITE_SUBSCRIPTION_CTL, {}, body), TIMEOUT_S
    )


def entry(
    action: Action,
    client_id: str,
    group: str,
    parent: str,
    lite_topics: set[str] | None = None,
    option: OffsetOption | None = None,
) -> LiteSubscription:
    topics = tuple(sorted(lite_topics or ()))
    return LiteSubscription(action, client_id, group, parent, topics, option)


async def subscribe(remoting, client_id, group, parent, lite_topics, option=None) -> None:
    response = await ctl(
        remoting, entry(Action.PARTIAL_ADD, client_id, group, parent, set(lite_topics), option)
    )
    assert response.code == ResponseCode.SUCCESS, response.remark


async def send_lite(backend, parent: str, lite_topic: str, body: bytes):
    client = backend.client()
    sent = await client.send(parent, body, properties={Prop.LITE_TOPIC: lite_topic})
    return sent


async def pop_lite(
    remoting, client_id: str, group: str, parent: str, *, max_num: int = 32,
    invisible_ms: int = 30_000, poll_ms: int = 0,
) -> RemotingCommand:  # fmt: skip
    header = PopLiteMessageHeader(
        client_id, group, parent, max_num, invisible_ms, poll_ms, now_ms(),
        attempt_id=uuid.uuid4().hex,
    )  # fmt: skip
    return await remoting.invoke(
        RemotingCommand(RequestCode.POP_LITE_MESSAGE, header.encode()),
        PARKED_SLACK_S + poll_ms / 1000,
    )


async def pop_lite_until(remoting, client_id, group, parent, want: int) -> list[MessageExt]:
    """Pop (parking up to 2 s each time) until ``want`` messages came; a real broker queues
    an arrival's event a moment after the send returns."""
    got: list[MessageExt] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < want:
        assert time.monotonic() < deadline, f"only {len(got)} of {want} lite messages came"
        response = await pop_lite(remoting, client_id, group, parent, poll_ms=2000)
        if response.code == ResponseCode.SUCCESS:
            got.extend(decode_messages(response.body))
    return got


def lmq_offset(msg: MessageExt) -> int:
    return int(msg.properties[Prop.INNER_MULTI_QUEUE_OFFSET])


async def ack_lite(remoting, group: str, parent: str, msg: MessageExt, pop_time: int):
    """ACK_MESSAGE for a lite message, as a 5.5 client builds it: the parent topic, queue 0,
    the LMQ offset, an extraInfo of revive queue 999."""
    offset = lmq_offset(msg)
    info = PopCheckpointInfo(offset, pop_time, 30_000, 999, 0, "", 0, offset)
    lite_topic = msg.properties[Prop.LITE_TOPIC]
    header = AckMessageHeader(group, parent, 0, info.encode(), offset, lite_topic=lite_topic)
    return await remoting.invoke(
        RemotingCommand(RequestCode.ACK_MESSAGE, header.encode()), TIMEOUT_S
    )


async def test_lite_message_is_indexed_in_its_lmq(backend):
    """A send with __LITE_TOPIC is stored in a parent queue and indexed in queue 0 of the
    LMQ %LMQ%$<parent>$<lite>; without the property it is a plain message of the parent."""
    parent, _group = await lite_fresh(backend)
    [lite] = await owned_lite_topics(backend, parent, 1)
    client = backend.client()
    first = await send_lite(backend, parent, lite, b"one")
    second = await send_lite(backend, parent, lite, b"two")
    plain = await client.send(parent, b"plain")
    assert {first.queue_id, second.queue_id, plain.queue_id} <= {0, 1}
    lmq = lmq_name(parent, lite)
    assert lmq == f"%LMQ%${parent}${lite}"
    await wait_offset(client, lmq, 2)
    assert await max_offset(client, lmq, 0) == 2


async def test_subscribe_pop_and_ack(backend):
    """A subscribed client pops its lite topics' messages with POP_LITE_MESSAGE: the
    parent's records, with the LMQ and its offset in INNER_MULTI_DISPATCH and
    INNER_MULTI_QUEUE_OFFSET; a header of pop time, invisible time, revive queue 999 and one
    consume count per message, no offset infos. Each lite topic is FIFO: nothing more of it
    until the popped ones are acked."""
    parent, group = await lite_fresh(backend)
    lite_a, lite_b = await owned_lite_topics(backend, parent, 2)
    remoting = backend.client().remoting
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    await subscribe(remoting, client_id, group, parent, {lite_a, lite_b})
    await send_lite(backend, parent, lite_a, b"a0")
    await send_lite(backend, parent, lite_a, b"a1")
    await send_lite(backend, parent, lite_b, b"b0")
    await wait_offset(backend.client(), lmq_name(parent, lite_a), 2)
    await wait_offset(backend.client(), lmq_name(parent, lite_b), 1)

    before = now_ms()
    response = await pop_lite(remoting, client_id, group, parent, invisible_ms=20_000, poll_ms=3000)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.remark == "FOUND"
    assert set(response.fields) == {"popTime", "invisibleTime", "reviveQid", "orderCountInfo"}
    header = PopLiteMessageResponseHeader.decode(response.fields)
    assert header.revive_qid == 999
    assert header.invisible_time == 20_000
    assert before <= header.pop_time <= now_ms()
    messages = decode_messages(response.body)
    got = [m.body for m in messages]
    # One event per lite topic; a pop may find one before the other has arrived (real).
    messages += await pop_lite_until(remoting, client_id, group, parent, 3 - len(messages))
    bodies = [m.body for m in messages]
    assert sorted(bodies) == [b"a0", b"a1", b"b0"]
    assert bodies.index(b"a0") < bodies.index(b"a1")
    assert header.order_count_info == ";".join(["0"] * len(got))
    for msg in messages:
        assert msg.topic == parent
        lite = msg.properties[Prop.LITE_TOPIC]
        assert msg.properties[Prop.INNER_MULTI_DISPATCH] == lmq_name(parent, lite)
    assert sorted((m.properties[Prop.LITE_TOPIC], lmq_offset(m)) for m in messages) == [
        (lite_a, 0), (lite_a, 1), (lite_b, 0)]  # fmt: skip

    # FIFO per lite topic: a new message of A waits until A's popped ones are acked.
    await send_lite(backend, parent, lite_a, b"a2")
    await wait_offset(backend.client(), lmq_name(parent, lite_a), 3)
    blocked = await pop_lite(remoting, client_id, group, parent, poll_ms=1000)
    assert blocked.code == ResponseCode.POLLING_TIMEOUT
    assert blocked.remark == "NO_MESSAGE_IN_QUEUE"
    assert blocked.fields["orderCountInfo"] == ""
    for msg in messages:
        if msg.properties[Prop.LITE_TOPIC] == lite_a:
            acked = await ack_lite(remoting, group, parent, msg, header.pop_time)
            assert acked.code == ResponseCode.SUCCESS, acked.remark
    [after] = await pop_lite_until(remoting, client_id, group, parent, 1)
    assert (after.body, lmq_offset(after)) == (b"a2", 2)


async def test_parked_lite_pop_is_woken_by_a_message(backend):
    """A lite pop that finds nothing parks under its client until a message arrives in one of
    its lite topics, and answers with it long before its poll time."""
    parent, group = await lite_fresh(backend)
    [lite] = await owned_lite_topics(backend, parent, 1)
    remoting = backend.client().remoting
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    await subscribe(remoting, client_id, group, parent, {lite})
    started = time.monotonic()
    parked = asyncio.ensure_future(pop_lite(remoting, client_id, group, parent, poll_ms=8000))
    # The pop reaches the broker and parks: no broker counts parked lite pops to await.
    await asyncio.sleep(0.3)
    assert not parked.done()
    await send_lite(backend, parent, lite, b"wake")
    response = await asyncio.wait_for(parked, TIMEOUT_S)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert [m.body for m in decode_messages(response.body)] == [b"wake"]
    assert time.monotonic() - started < 6.0


async def test_parked_lite_pop_times_out(backend):
    parent, group = await lite_fresh(backend)
    [lite] = await owned_lite_topics(backend, parent, 1)
    remoting = backend.client().remoting
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    await subscribe(remoting, client_id, group, parent, {lite})
    started = time.monotonic()
    response = await pop_lite(remoting, client_id, group, parent, poll_ms=1000)
    assert time.monotonic() - started >= 0.9
    assert response.code == ResponseCode.POLLING_TIMEOUT
    assert response.remark == "NO_MESSAGE_IN_QUEUE"
    assert PopLiteMessageResponseHeader.decode(response.fields).revive_qid == 999


async def test_unsubscribe_stops_delivery(backend):
    """PARTIAL_REMOVE drops lite topics from the client's subscription, COMPLETE_REMOVE the
    whole client: messages arriving after are not popped."""
    parent, group = await lite_fresh(backend)
    lite_a, lite_b = await owned_lite_topics(backend, parent, 2)
    remoting = backend.client().remoting
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    await subscribe(remoting, client_id, group, parent, {lite_a, lite_b})
    removed = await ctl(remoting, entry(Action.PARTIAL_REMOVE, client_id, group, parent, {lite_a}))
    assert removed.code == ResponseCode.SUCCESS, removed.remark
    await send_lite(backend, parent, lite_a, b"a")
    await send_lite(backend, parent, lite_b, b"b")
    [msg] = await pop_lite_until(remoting, client_id, group, parent, 1)
    assert msg.body == b"b"
    gone = await ctl(remoting, entry(Action.COMPLETE_REMOVE, client_id, group, parent))
    assert gone.code == ResponseCode.SUCCESS, gone.remark
    await send_lite(backend, parent, lite_b, b"b2")
    await wait_offset(backend.client(), lmq_name(parent, lite_b), 2)
    response = await pop_lite(remoting, client_id, group, parent, poll_ms=1000)
    assert response.code == ResponseCode.POLLING_TIMEOUT


async def test_subscription_offset_option_min_replays(backend):
    """A lite topic subscribed with OffsetOption POLICY MIN starts at its oldest message."""
    parent, group = await lite_fresh(backend)
    [lite] = await owned_lite_topics(backend, parent, 1)
    for body in (b"old0", b"old1"):
        await send_lite(backend, parent, lite, body)
    await wait_offset(backend.client(), lmq_name(parent, lite), 2)
    remoting = backend.client().remoting
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    option = OffsetOption(OffsetType.POLICY, POLICY_MIN)
    await subscribe(remoting, client_id, group, parent, {lite}, option)
    got = await pop_lite_until(remoting, client_id, group, parent, 2)
    assert [m.body for m in got] == [b"old0", b"old1"]


async def test_subscription_ctl_bad_bodies(backend):
    remoting = backend.client().remoting
    empty = await remoting.invoke(RemotingCommand(RequestCode.LITE_SUBSCRIPTION_CTL, {}), TIMEOUT_S)
    assert (empty.code, empty.remark) == (ResponseCode.ILLEGAL_OPERATION, "Request body is null.")
    none = await remoting.invoke(
        RemotingCommand(RequestCode.LITE_SUBSCRIPTION_CTL, {}, b'{"subscriptionSet":[]}'),
        TIMEOUT_S,
    )
    assert (none.code, none.remark) == (
        ResponseCode.ILLEGAL_OPERATION, "LiteSubscriptionCtlRequestBody is empty.")  # fmt: skip


async def test_pop_lite_refuses_what_is_not_lite(backend):
    """POP_LITE_MESSAGE wants a LITE topic and a group bound to it."""
    parent, group = await lite_fresh(backend)
    plain, other = backend.unique("T"), backend.unique("G")
    await backend.create_topic(plain, 2)
    await backend.create_group(other)
    remoting = backend.client().remoting
    wrong_type = await pop_lite(remoting, "c1", group, plain)
    assert (wrong_type.code, wrong_type.remark) == (
        ResponseCode.INVALID_PARAMETER, f"the topic [{plain}] message type not match")  # fmt: skip
    unbound = await pop_lite(remoting, "c1", other, parent)
    assert (unbound.code, unbound.remark) == (
        ResponseCode.INVALID_PARAMETER, f"subscription bind topic not match, {other}")  # fmt: skip
    missing = await pop_lite(remoting, "c1", group, backend.unique("NOPE"))
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST


async def test_exclusive_group_evicts_and_notifies(backend):
    """In an Exclusive lite group one client holds a lite topic: another client subscribing
    it takes it, and the broker tells the first one with a one-way NOTIFY_UNSUBSCRIBE_LITE
    on the connection of its subscription."""
    parent, group = await lite_fresh(backend, exclusive=True)
    [lite] = await owned_lite_topics(backend, parent, 1)
    notified: asyncio.Queue[RemotingCommand] = asyncio.Queue()

    def on_request(cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.NOTIFY_UNSUBSCRIBE_LITE:
            notified.put_nowait(cmd)

    first = RemotingClient(backend.broker.address, server_handler=on_request)
    try:
        await subscribe(first, "client-1", group, parent, {lite})
        second = backend.client().remoting
        await subscribe(second, "client-2", group, parent, {lite})
        cmd = await asyncio.wait_for(notified.get(), TIMEOUT_S)
        assert cmd.is_oneway
        header = NotifyUnsubscribeLiteHeader.decode(cmd.ext_fields)
        assert (header.lite_topic, header.consumer_group, header.client_id) == (
            lite, group, "client-1")  # fmt: skip
        await send_lite(backend, parent, lite, b"x")
        [msg] = await pop_lite_until(second, "client-2", group, parent, 1)
        assert msg.body == b"x"
    finally:
        await first.close()


async def change_lite(
    remoting, group: str, parent: str, msg: MessageExt, pop_time: int, invisible_ms: int,
    *, suspend: bool | None = None,
) -> RemotingCommand:  # fmt: skip
    """CHANGE_MESSAGE_INVISIBLETIME of a lite message, as a 5.5 client builds it."""
    offset = lmq_offset(msg)
    info = PopCheckpointInfo(offset, pop_time, 30_000, 999, 0, "", 0, offset)
    header = ChangeInvisibleTimeHeader(
        group, parent, 0, info.encode(), offset, invisible_time=invisible_ms,
        lite_topic=msg.properties[Prop.LITE_TOPIC], suspend=suspend,
    )  # fmt: skip
    return await remoting.invoke(
        RemotingCommand(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header.encode()), TIMEOUT_S
    )


async def test_change_invisible_time_brings_a_lite_message_back(backend):
    """A lite message made visible again (CHANGE_MESSAGE_INVISIBLETIME with liteTopic) comes
    back to a parked pop once its new invisible time passes, counted as consumed once more;
    with ``suspend`` it comes back without counting that pop as an attempt."""
    parent, group = await lite_fresh(backend)
    [lite] = await owned_lite_topics(backend, parent, 1)
    remoting = backend.client().remoting
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    await subscribe(remoting, client_id, group, parent, {lite})
    await send_lite(backend, parent, lite, b"again")
    counts = []
    for suspend in (None, True, None):
        response = await pop_lite(remoting, client_id, group, parent, poll_ms=5000)
        assert response.code == ResponseCode.SUCCESS, response.remark
        [msg] = decode_messages(response.body)
        assert (msg.body, lmq_offset(msg)) == (b"again", 0)
        counts.append(response.fields["orderCountInfo"])
        pop_time = PopLiteMessageResponseHeader.decode(response.fields).pop_time
        before = now_ms()
        changed = await change_lite(remoting, group, parent, msg, pop_time, 100, suspend=suspend)
        assert changed.code == ResponseCode.SUCCESS, changed.remark
        assert changed.remark == "not set any response code"
        answer = ChangeInvisibleTimeResponseHeader.decode(changed.fields)
        assert (answer.pop_time, answer.revive_qid) == (pop_time, 999)
        assert before + 100 <= pop_time + answer.invisible_time <= now_ms() + 100
    # the first pop, one after a change, one after a suspended change (not an attempt)
    assert counts == ["0", "0 qo0%0 1", "0 qo0%0 1"]
    # Only the offset is checked: a handle of another group changes nothing, and is OK.
    other = await change_lite(remoting, backend.unique("G"), parent, msg, pop_time, 100)
    assert other.code == ResponseCode.SUCCESS, other.remark


async def broker_lite_info(remoting) -> dict:
    response = await remoting.invoke(
        RemotingCommand(RequestCode.GET_BROKER_LITE_INFO, {}), TIMEOUT_S
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    return orjson.loads(response.body)


async def set_broker_config(remoting, key: str, value: object) -> None:
    body = f"{key}={value}\n".encode()
    response = await remoting.invoke(
        RemotingCommand(RequestCode.UPDATE_BROKER_CONFIG, {}, body), TIMEOUT_S
    )
    assert response.code == ResponseCode.SUCCESS, response.remark


async def test_subscription_quota(backend):
    """A PARTIAL_ADD on a broker holding maxLiteSubscriptionCount (client, lite topic)
    subscriptions (GET_BROKER_LITE_INFO liteSubscriptionCount) is refused with
    LITE_SUBSCRIPTION_QUOTA_EXCEEDED; COMPLETE_ADD is not checked."""
    parent, group = await lite_fresh(backend)
    lite_a, lite_b = await owned_lite_topics(backend, parent, 2)
    remoting = backend.client().remoting
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    held = (await broker_lite_info(remoting))["liteSubscriptionCount"]
    try:
        await set_broker_config(remoting, "maxLiteSubscriptionCount", held)
        refused = await ctl(remoting, entry(Action.PARTIAL_ADD, client_id, group, parent, {lite_a}))
        assert refused.code == ResponseCode.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
        assert refused.remark == (
            f"org.apache.rocketmq.broker.lite.LiteQuotaException: "
            f"lite subscription quota exceeded {held}"
        )
        await set_broker_config(remoting, "maxLiteSubscriptionCount", held + 1)
        await subscribe(remoting, client_id, group, parent, {lite_a})
        assert (await broker_lite_info(remoting))["liteSubscriptionCount"] == held + 1
        over = await ctl(remoting, entry(Action.PARTIAL_ADD, client_id, group, parent, {lite_b}))
        assert over.code == ResponseCode.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
        whole = await ctl(
            remoting, entry(Action.COMPLETE_ADD, client_id, group, parent, {lite_a, lite_b})
        )
        assert whole.code == ResponseCode.SUCCESS, whole.remark
        assert (await broker_lite_info(remoting))["liteSubscriptionCount"] == held + 2
    finally:
        await set_broker_config(remoting, "maxLiteSubscriptionCount", 100_000)  # the default
        await ctl(remoting, entry(Action.COMPLETE_REMOVE, client_id, group, parent))


async def test_lite_topic_and_group_configs(backend):
    """A LITE parent topic is routed like any other and keeps message.type=LITE; a lite
    group keeps its attributes without the "+" they were added with; GET_BROKER_LITE_INFO
    lists the parent's groups and TTL; an unknown group attribute is refused."""
    parent, group = await lite_fresh(backend)
    namesrv = backend.remoting(backend.namesrv)
    route = await namesrv.invoke(
        RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, TopicHeader(parent).encode()),
        TIMEOUT_S,
    )
    assert route.code == ResponseCode.SUCCESS
    queues = orjson.loads(route.body)["queueDatas"]
    assert sorted(q["brokerName"] for q in queues) == sorted(b.name for b in backend.brokers)
    for q in queues:
        assert (q["perm"], q["readQueueNums"], q["writeQueueNums"], q["topicSysFlag"]) == (
            6, 2, 2, 0)  # fmt: skip
    remoting = backend.client().remoting
    topic = await remoting.invoke(
        RemotingCommand(RequestCode.GET_TOPIC_CONFIG, TopicHeader(parent).encode()), TIMEOUT_S
    )
    assert orjson.loads(topic.body)["attributes"] == {"message.type": "LITE"}
    config = await remoting.invoke(
        RemotingCommand(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": group}), TIMEOUT_S
    )
    assert orjson.loads(config.body)["attributes"] == {"lite.bind.topic": parent}
    info = await broker_lite_info(remoting)
    assert info["groupMeta"][parent] == [group]
    assert info["topicMeta"][parent] == -1
    body = orjson.dumps({"groupName": group, "attributes": {"+nope.key": "1"}})
    bad = await remoting.invoke(
        RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body), TIMEOUT_S
    )
    assert bad.code == ResponseCode.SYSTEM_ERROR
    assert bad.remark.startswith("java.lang.RuntimeException: unsupported key: nope.key")


async def send_raw(client, parent: str, lite_topic: str) -> RemotingCommand:
    props = {Prop.LITE_TOPIC: lite_topic, Prop.UNIQ_KEY: uuid.uuid4().hex}
    header = SendMessageHeader(
        "PG", parent, queue_id=0, born_timestamp=now_ms(), properties=encode_properties(props)
    )
    return await client.remoting.invoke(
        RemotingCommand(RequestCode.SEND_MESSAGE, header.encode(), b"x"), TIMEOUT_S
    )


async def test_lmq_quota(backend):
    """With enableLmqQuota (off by default), a broker holding maxLmqConsumeQueueNum LMQs
    refuses a lite message that would make a new one (LMQ_QUOTA_EXCEEDED) and still takes
    one for an LMQ it has; without it, the number is not checked."""
    parent, _group = await lite_fresh(backend)
    client = backend.client()
    await send_lite(backend, parent, "known", b"first")
    await wait_offset(client, lmq_name(parent, "known"), 1)
    held = (await broker_lite_info(client.remoting))["currentLmqNum"]
    assert held >= 1
    try:
        await set_broker_config(client.remoting, "maxLmqConsumeQueueNum", held)
        unchecked = await send_raw(client, parent, "new1")
        assert unchecked.code == ResponseCode.SUCCESS, unchecked.remark
        await wait_offset(client, lmq_name(parent, "new1"), 1)
        await set_broker_config(client.remoting, "enableLmqQuota", "true")
        refused = await send_raw(client, parent, "new2")
        assert (refused.code, refused.remark) == (
            ResponseCode.LMQ_QUOTA_EXCEEDED,
            "[LMQ_CONSUME_QUEUE_NUM_EXCEEDED]lmq consume queue num exceeded.",
        )
        known = await send_raw(client, parent, "known")
        assert known.code == ResponseCode.SUCCESS, known.remark
    finally:
        await set_broker_config(client.remoting, "enableLmqQuota", "false")
        await set_broker_config(client.remoting, "maxLmqConsumeQueueNum", 20_000)


async def test_notification_knows_nothing_of_lite(backend):
    """NOTIFICATION on a LITE parent looks at the parent's queues, which lite pops never
    advance: a lite group is told hasMsg once a lite message is stored, even after it
    popped and acked it. A proxy cannot probe lite readiness with it."""
    parent, group = await lite_fresh(backend)
    [lite] = await owned_lite_topics(backend, parent, 1)
    client = backend.client()
    assert not (await client.notification(group, parent)).has_msg
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    await subscribe(client.remoting, client_id, group, parent, {lite})
    await send_lite(backend, parent, lite, b"n")
    response = await pop_lite(client.remoting, client_id, group, parent, poll_ms=5000)
    assert response.code == ResponseCode.SUCCESS, response.remark
    [msg] = decode_messages(response.body)
    pop_time = PopLiteMessageResponseHeader.decode(response.fields).pop_time
    acked = await ack_lite(client.remoting, group, parent, msg, pop_time)
    assert acked.code == ResponseCode.SUCCESS, acked.remark
    assert (await client.notification(group, parent)).has_msg
