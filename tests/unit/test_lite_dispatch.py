"""The stub's lite event dispatch where the conformance suite cannot reach it in seconds:
a client that stops popping loses its events to the group's other clients (a 5.5.0
broker's LiteEventDispatcher.scan, every 10 s)."""

from __future__ import annotations

import asyncio
import random

from broker_stub.config import BrokerConfig
from broker_stub.groups import GroupConfig, GroupTable
from broker_stub.lite import CLIENT_IDLE_MS, CLIENT_INACTIVE_MS, LiteService
from broker_stub.polling import PollingTable
from broker_stub.pop import PopService
from broker_stub.store import MessageStore
from broker_stub.topics import TopicTable
from proxy.remoting.headers import now_ms
from proxy.remoting.lite import lmq_name
from proxy.remoting.message import MessageExt, Prop, decode_messages

PARENT, GROUP = "parent", "group"
LMQ = lmq_name(PARENT, "lt")


def service() -> LiteService:
    loop = asyncio.get_running_loop()
    store = MessageStore()
    topics = TopicTable(2)
    topics.create(PARENT, 2, attributes={"message.type": "LITE"})
    pop = PopService(store, topics, BrokerConfig(), loop, random.Random(1))
    groups = GroupTable(16)
    groups.put(GroupConfig(GROUP, attributes={"lite.bind.topic": PARENT}))
    lite = LiteService(store, pop, groups, PollingTable(loop, 16, 64), loop, rng=random.Random(1))
    for client in ("c1", "c2"):
        lite.add_partial(client, GROUP, PARENT, {LMQ}, None, lambda _lmq: True)
    return lite


def send(lite: LiteService, body: bytes) -> None:
    props = {Prop.LITE_TOPIC: "lt", Prop.INNER_MULTI_DISPATCH: LMQ, Prop.UNIQ_KEY: body.hex()}
    lite.store.put(MessageExt(topic=PARENT, body=body, properties=props, queue_id=0))
    lite.on_arrival(LMQ)


def holder(lite: LiteService) -> tuple[str, str]:
    """(the client whose queue holds the event, the other one)."""
    queued = [c for c in ("c1", "c2") if len(lite._events.get(c) or ())]
    assert len(queued) == 1, queued
    return queued[0], "c2" if queued[0] == "c1" else "c1"


async def test_events_of_a_client_that_stopped_popping_move_to_another():
    lite = service()
    try:
        send(lite, b"m0")
        stalled, other = holder(lite)
        assert not lite.pop(other, GROUP, 32, 30_000, None).records  # not its event
        lite.scan(now_ms() + CLIENT_INACTIVE_MS - 1_000)
        assert holder(lite) == (stalled, other)  # not inactive long enough yet
        lite.scan(now_ms() + CLIENT_INACTIVE_MS + 1_000)
        assert holder(lite) == (other, stalled)
        popped = lite.pop(other, GROUP, 32, 30_000, None)
        [record] = popped.records
        assert decode_messages(record)[0].body == b"m0"
        # For a while the stalled client goes last: every event goes to the other one.
        for _ in range(8):
            lite.dispatch(GROUP, LMQ)
            assert holder(lite) == (other, stalled)
            lite._events[other].poll()
    finally:
        lite.close()


async def test_an_idle_client_with_no_events_loses_only_its_queue():
    lite = service()
    try:
        send(lite, b"m0")
        client, _other = holder(lite)
        assert lite.pop(client, GROUP, 32, 30_000, None).records
        lite.scan(now_ms() + CLIENT_IDLE_MS + 1_000)
        assert client not in lite._events
        assert LMQ in lite.subscriptions[client].lmqs  # still subscribed
    finally:
        lite.close()
