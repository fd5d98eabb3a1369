"""Where a remoting client's request goes.

A client of the remoting port knows the proxy only: every route the proxy answers names the
proxy's own address for every broker. So a request itself must say which broker it is for,
and the clients of RocketMQ 5 do: the ``bname`` field of a broker request's header
(``RpcRequestHeader``), ``n`` in the short-named header of SEND_MESSAGE_V2 and
SEND_BATCH_MESSAGE, and the queues in the body of a queue lock. The Apache proxy routes by
the same fields and serves the same request codes. A request that names none goes to the
broker of the port it came in on, where the proxy has a port per broker (``port``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import orjson

from proxy.brokers import master_address, route_masters
from proxy.remoting import fastjson
from proxy.remoting.bodies import BodyReading, QueueLock
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.message import decode_properties

SEND_V2_BROKER_FIELD = "n"
BROKER_FIELD = "bname"


class Destination(Enum):
    """What the proxy does with a request of the remoting port."""

    NAME_SERVER = "name_server"  # a route, its brokers' addresses the proxy's
    NAMED_BROKER = "named_broker"  # the broker the request names
    ANY_BROKER = "any_broker"  # one broker: each answers alike (heartbeats reach them all)
    EVERY_BROKER = "every_broker"  # each broker, on the client's own connection to it
    NOT_SERVED = "not_served"  # REQUEST_CODE_NOT_SUPPORTED, as from the Apache proxy


_DESTINATIONS: dict[int, Destination] = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: Destination.NAME_SERVER,
    RequestCode.HEART_BEAT: Destination.EVERY_BROKER,
    RequestCode.UNREGISTER_CLIENT: Destination.EVERY_BROKER,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: Destination.ANY_BROKER,
    RequestCode.CHECK_CLIENT_CONFIG: Destination.ANY_BROKER,
    **{
        code: Destination.NAMED_BROKER
        for code in (
            RequestCode.SEND_MESSAGE,
            RequestCode.SEND_MESSAGE_V2,
            RequestCode.SEND_BATCH_MESSAGE,
            RequestCode.CONSUMER_SEND_MSG_BACK,
            RequestCode.END_TRANSACTION,
            RequestCode.RECALL_MESSAGE,
            RequestCode.PULL_MESSAGE,
            RequestCode.LITE_PULL_MESSAGE,
            RequestCode.QUERY_CONSUMER_OFFSET,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            RequestCode.GET_MAX_OFFSET,
            RequestCode.GET_MIN_OFFSET,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            RequestCode.GET_EARLIEST_MSG_STORETIME,
            RequestCode.LOCK_BATCH_MQ,
            RequestCode.UNLOCK_BATCH_MQ,
            RequestCode.POP_MESSAGE,
            RequestCode.ACK_MESSAGE,
            RequestCode.BATCH_ACK_MESSAGE,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            RequestCode.NOTIFICATION,
        )
    },
}
_SHORT_HEADERS = {RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
_QUEUES_IN_BODY = {RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ}


def destination(cmd: RemotingCommand) -> Destination:
    return _DESTINATIONS.get(cmd.code, Destination.NOT_SERVED)


def broker_named(cmd: RemotingCommand, body: BodyReading) -> str | None:
    """The broker a request names, or None when it names none. A queue lock names it in
    its body (``body``, read once for the guard and the relay): its first queue's; one that
    cannot be read names none, and the broker it goes to refuses it as it would without
    a proxy."""
    if cmd.code in _QUEUES_IN_BODY:
        if isinstance(body, QueueLock) and body.queues:
            return body.queues[0].broker
        return None
    fields = cmd.fields
    field = SEND_V2_BROKER_FIELD if cmd.code in _SHORT_HEADERS else BROKER_FIELD
    return fields.get(field) or None


def queue_set_empty(body: BodyReading) -> bool:
    """A queue lock or unlock for no queue at all (the client's rebalance may send one)."""
    return isinstance(body, QueueLock) and not body.queues


@dataclass(frozen=True)
class SentMessage:
    topic: str
    properties: dict[str, str]


_SENDS = {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}


def sent_message(cmd: RemotingCommand) -> SentMessage | None:
    """The topic and properties a send's header carries (V2's short names or V1's long
    ones); None for a request that is no send."""
    if cmd.code not in _SENDS:
        return None
    fields = cmd.fields
    short = cmd.code in _SHORT_HEADERS
    topic = fields.get("b" if short else "topic")
    if not topic:
        return None
    return SentMessage(topic, decode_properties(fields.get("i" if short else "properties")))


# The header fields that hold a long poll's length, in milliseconds.
_POLL_FIELDS = ("suspendTimeoutMillis", "pollTime")


def long_poll_s(cmd: RemotingCommand) -> float | None:
    """The long poll ``cmd`` asks for, in seconds, or None."""
    for name in _POLL_FIELDS:
        raw = cmd.fields.get(name)
        if raw is not None and raw.lstrip("-").isdigit():
            return max(int(raw), 0) / 1000
    return None


def route_brokers(body: bytes) -> dict[str, str]:
    """A name server's TopicRouteData -> each broker's master address, by broker name.
    The name server writes fastjson (``{0:"host:port"}``) unless asked for standard JSON."""
    return route_masters(fastjson.loads(body))


def rewrite_route(body: bytes, address_of: Callable[[str], str]) -> bytes:
    """The route with each broker's master at ``address_of(its name)`` (its slaves left
    out: the proxy sends every request to a broker's master), as standard JSON (which every
    client reads; fastjson's bare-number keys only old ones do).

    A name server writes maps keyed by numbers with those keys bare, not only a broker's
    addresses (``{0:"host:port"}``: any name server answering a client before 4.9.4) but
    also a static topic's queue mappings (``"currIdMap":{0:0}``); in standard JSON every
    key is a string, so they are written as ``"0"``, which every client reads back as the
    number."""
    data = fastjson.loads(body)
    for broker in data.get("brokerDatas", []):
        master = master_address(broker)
        broker["brokerAddrs"] = {"0": address_of(broker.get("brokerName", ""))} if master else {}
    data["filterServerTable"] = {}
    return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
