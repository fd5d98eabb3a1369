"""A broker whose answer cannot be read (found by tests/fuzz/test_remoting_fuzz.py): the
call fails with a RemotingError (``BrokerResponseError``), which every caller already
turns into a client's error code, never an exception escaping as gRPC UNKNOWN."""

from __future__ import annotations

import pytest

from proxy.remoting.answers import BrokerResponseError
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import ResponseCode
from tests.support.brokers import ScriptedServer


def one_answer(fields: dict[str, str], body: bytes = b"") -> ScriptedServer:
    """A broker that answers every request with ``fields`` and ``body``."""
    return ScriptedServer(lambda cmd: cmd.make_response(ResponseCode.SUCCESS, dict(fields), body))


SEND_OK = {"msgId": "0A", "queueId": "1", "queueOffset": "5", "transactionId": "U1"}
POP_OK = {
    "popTime": "1",
    "invisibleTime": "10000",
    "reviveQid": "0",
    "restNum": "0",
    "startOffsetInfo": "0@0=0",
    "msgOffsetInfo": "0@0=0",
}


@pytest.mark.parametrize(
    "fields",
    [
        {**SEND_OK, "queueOffset": "99999999999999999999"},  # past int64: protobuf refused it
        {**SEND_OK, "queueId": "-3"},
        {**SEND_OK, "queueOffset": "1;2"},
    ],
)
async def test_an_unreadable_send_answer_is_a_remoting_error(fields):
    async with one_answer(fields) as address:
        client = BrokerClient("broker-x", address)
        try:
            with pytest.raises(BrokerResponseError):
                await client.send("T", b"x", timeout=3)
        finally:
            await client.close()


@pytest.mark.parametrize(
    ("fields", "body"),
    [
        (POP_OK, b"\x00\x00\x00\x91" + b"\x00" * 40),  # a record longer than the body
        ({**POP_OK, "invisibleTime": "1;2"}, b""),  # a header number that is not one
    ],
)
async def test_an_unreadable_pop_answer_is_a_remoting_error(fields, body):
    async with one_answer(fields, body) as address:
        client = BrokerClient("broker-x", address)
        try:
            with pytest.raises(BrokerResponseError):
                await client.pop("G", "T", timeout=3)
        finally:
            await client.close()
