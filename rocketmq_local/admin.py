"""Set-up requests to brokers and name servers, stub or real: the topic and group creation
mqadmin does, written once for every test tier (the launcher, the conformance and
integration backends, the interop targets, the benchmarks).

Each call opens one blocking connection: these run before a test's traffic, never on an
event loop (async callers use ``asyncio.to_thread``). Brokers are found through the name
server (``masters``) unless the caller names them.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Mapping

from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import FrameDecoder, RemotingCommand, encode
from proxy.remoting.headers import CreateTopicHeader, TopicHeader


class AdminError(AssertionError):
    """A set-up request was refused or did not take effect in time (the test cannot run)."""


def admin_call(address: str, request: RemotingCommand, timeout_s: float = 10.0) -> RemotingCommand:
    """One request over a fresh blocking connection; the response."""
    host, port = address.rsplit(":", 1)
    request.opaque = 1
    decoder = FrameDecoder()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(encode(request))
        while True:
            data = sock.recv(65536)
            if not data:
                raise AdminError(f"{address} closed the connection without answering")
            for response in decoder.feed(data):
                if response.is_response and response.opaque == request.opaque:
                    return response


def checked(address: str, request: RemotingCommand) -> RemotingCommand:
    """``admin_call`` that fails unless the answer is SUCCESS."""
    response = admin_call(address, request)
    if response.code != ResponseCode.SUCCESS:
        raise AdminError(
            f"{RequestCode(request.code).name} to {address} answered {response.code}: "
            f"{response.remark}"
        )
    return response


def masters(namesrv: str) -> dict[str, str]:
    """Broker name -> master address, as the name server lists them."""
    info = checked(namesrv, RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO))
    # A real name server (fastjson) writes the integer keys of brokerAddrs unquoted.
    text = re.sub(r"([{,])(-?\d+):", r'\1"\2":', info.body.decode())
    table = json.loads(text)["brokerAddrTable"]
    found = {name: e["brokerAddrs"]["0"] for name, e in table.items() if "0" in e["brokerAddrs"]}
    if not found:
        raise AdminError(f"the name server {namesrv} lists no master broker")
    return found


def create_topic(
    namesrv: str,
    topic: str,
    queues: int = 4,
    *,
    fifo: bool = False,
    message_type: str | None = None,
    brokers: Mapping[str, str] | None = None,
    timeout_s: float = 20.0,
) -> None:
    """UPDATE_AND_CREATE_TOPIC on every broker (or those of ``brokers``: name -> address),
    then wait until the name server's route lists each of them with ``queues`` queues.
    ``message_type``: the topic's ``message.type`` attribute (FIFO, PRIORITY, LITE, ...;
    RocketMQ 5 checks a message against it on send); ``fifo`` is ``message_type="FIFO"``."""
    brokers = dict(brokers) if brokers is not None else masters(namesrv)
    message_type = "FIFO" if fifo else message_type
    header = CreateTopicHeader(
        topic,
        read_queue_nums=queues,
        write_queue_nums=queues,
        attributes=f"+message.type={message_type}" if message_type else None,
    )
    for address in brokers.values():
        checked(address, RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, header.encode()))
    deadline = time.monotonic() + timeout_s
    while True:
        route = admin_call(
            namesrv,
            RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, TopicHeader(topic).encode()),
        )
        if route.code == ResponseCode.SUCCESS:
            listed = {
                q["brokerName"]
                for q in json.loads(route.body)["queueDatas"]
                if q["readQueueNums"] == queues
            }
            if listed >= set(brokers):
                return
        if time.monotonic() > deadline:
            raise AdminError(f"the route of {topic} does not list {sorted(brokers)}")
        time.sleep(0.05)


def create_group(
    namesrv: str,
    group: str,
    *,
    retry_max_times: int = 16,
    fifo: bool = False,
    attributes: Mapping[str, str] | None = None,
    lite_parent: str | None = None,
    lite_quota: int | None = None,
    retry_policy: Mapping[str, object] | None = None,
    brokers: Mapping[str, str] | None = None,
) -> None:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (a SubscriptionGroupConfig) on every broker:
    ``retry_max_times`` retries before the dead-letter queue, with the back-off of
    ``retry_policy`` (a ``groupRetryPolicy``: ``{"type": "EXPONENTIAL",
    "exponentialRetryPolicy": {...}}`` or a CUSTOMIZED one), ``fifo`` for an orderly
    (FIFO) group, ``attributes`` set on the group (the broker keeps them without the ``+``
    that marks each as added). ``lite_parent``: a lite group of that LITE parent topic
    (``create_topic(..., message_type="LITE")``; attribute ``lite.bind.topic``), with
    ``lite_quota`` lite topics per client (``lite.sub.client.quota``; default 2000)."""
    attributes = dict(attributes or {})
    if lite_parent is not None:
        attributes["lite.bind.topic"] = lite_parent
    if lite_quota is not None:
        attributes["lite.sub.client.quota"] = str(lite_quota)
    policy = {"groupRetryPolicy": dict(retry_policy)} if retry_policy is not None else {}
    body = json.dumps(
        {
            **policy,
            "attributes": {f"+{k}": v for k, v in attributes.items()},
            "groupName": group,
            "consumeEnable": True,
            "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True,
            "consumeMessageOrderly": fifo,
            "retryQueueNums": 1,
            "retryMaxTimes": retry_max_times,
            "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True,
        }
    ).encode()
    for address in (brokers if brokers is not None else masters(namesrv)).values():
        checked(address, RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body))


# -- waits on an event loop (a BrokerClient's connection) ------------------------------------


async def max_offset(client: BrokerClient, topic: str, queue_id: int = 0) -> int:
    """GET_MAX_OFFSET; 0 for a topic the broker does not have."""
    response = await client.remoting.invoke(
        RemotingCommand(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)}),
        10.0,
    )
    return int(response.fields.get("offset", 0)) if response.code == ResponseCode.SUCCESS else 0


async def wait_visible(client: BrokerClient, topic: str, sent, timeout_s: float = 10.0) -> None:
    """Wait until every message of ``sent`` (SendResults) is in its consume queue.

    A real broker answers a send once the commit log holds the message and builds the
    consume queue asynchronously (its reput service), so a pop right after a send may miss
    it; the stub's consume queue is written before it answers.
    """
    want: dict[int, int] = {}
    for result in sent:
        count = len(result.offset_msg_id.split(","))
        want[result.queue_id] = max(want.get(result.queue_id, 0), result.queue_offset + count)
    deadline = time.monotonic() + timeout_s
    for queue_id, offset in want.items():
        while await max_offset(client, topic, queue_id) < offset:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}:{queue_id} never reached offset {offset}")
            await asyncio.sleep(0.01)
