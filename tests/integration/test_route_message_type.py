"""A route carries its topic's message type, read from one of its brokers' topic config
(GET_TOPIC_CONFIG, as the Apache proxy reads it); a broker that refuses to tell leaves it
UNKNOWN (every type accepted until the route's next refresh) instead of failing the route.

A scripted name server routes the topic to one scripted broker."""

from __future__ import annotations

import orjson
import pytest

from proxy.brokers import BrokerPool
from proxy.message_types import MessageType
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from tests.support.brokers import ScriptedServer

T = "TopicTyped"


def _broker(config: dict | None):
    """Answers GET_TOPIC_CONFIG with ``config``, or SYSTEM_ERROR when it is None."""

    def answer(cmd: RemotingCommand) -> RemotingCommand:
        assert cmd.code == RequestCode.GET_TOPIC_CONFIG and cmd.fields["topic"] == T
        if config is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, remark="disk on fire")
        return cmd.make_response(ResponseCode.SUCCESS, body=orjson.dumps(config))

    return ScriptedServer(answer)


def _namesrv(broker_address: str) -> ScriptedServer:
    route = {
        "brokerDatas": [{"brokerName": "broker-a", "brokerAddrs": {"0": broker_address}}],
        "queueDatas": [
            {"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
        ],
    }
    return ScriptedServer(
        lambda cmd: cmd.make_response(ResponseCode.SUCCESS, body=orjson.dumps(route))
    )


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"topicName": T, "attributes": {"message.type": "PRIORITY"}}, MessageType.PRIORITY),
        ({"topicName": T, "attributes": {}}, MessageType.UNTYPED),
        (None, MessageType.UNKNOWN),
    ],
)
async def test_the_route_learns_the_topic_type_from_a_broker(config, expected):
    async with _broker(config) as broker, _namesrv(broker) as namesrv:
        pool = BrokerPool([namesrv])
        try:
            route = await pool.route(T)
        finally:
            await pool.close()
    assert [b.name for b in route.brokers] == ["broker-a"]
    assert route.message_type is expected
