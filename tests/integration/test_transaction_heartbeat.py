"""A broker that restarted knows no producer group until a HEART_BEAT names it again, and
it counts each check it could not send against the half message's ``transactionCheckMax``.
The proxy therefore names its producer groups on every new broker connection at once, not
at its next round (``heartbeat_s``, set to an hour here so that only the reconnection can
send the second HEART_BEAT)."""

from __future__ import annotations

import asyncio
import contextlib

import orjson

from proxy.brokers import BrokerPool
from proxy.processor.transaction import TransactionProcessor
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from testkit.waits import wait_until
from tests.support.brokers import ScriptedServer

TOPIC = "TxTopic"


class HeartbeatCounter(ScriptedServer):
    """A broker that counts the HEART_BEATs naming ``TOPIC`` and answers anything else
    with an error (the topic config then stays unknown, which a route allows)."""

    def __init__(self) -> None:
        super().__init__(self._answer)
        self.heartbeats = 0

    def _answer(self, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.code == RequestCode.HEART_BEAT:
            groups = [p["groupName"] for p in orjson.loads(cmd.body).get("producerDataSet", [])]
            self.heartbeats += TOPIC in groups
            return cmd.make_response(ResponseCode.SUCCESS)
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, remark="not here")


def route_body(brokers: dict[str, str]) -> bytes:
    """A route of ``TOPIC`` on ``brokers`` (name -> address), one queue each."""
    return orjson.dumps(
        {
            "brokerDatas": [
                {"brokerName": name, "brokerAddrs": {"0": address}}
                for name, address in brokers.items()
            ],
            "queueDatas": [
                {"brokerName": name, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}
                for name in brokers
            ],
        }
    )


class RouteNamesrv(ScriptedServer):
    """Answers every route request with ``body``, which a test changes."""

    def __init__(self, body: bytes) -> None:
        super().__init__(lambda cmd: cmd.make_response(ResponseCode.SUCCESS, body=self.body))
        self.body = body


def route_namesrv(broker_address: str) -> ScriptedServer:
    return RouteNamesrv(route_body({"b": broker_address}))


async def test_producer_groups_are_named_again_on_a_new_broker_connection():
    broker = HeartbeatCounter()
    async with broker as broker_address, route_namesrv(broker_address) as namesrv:
        pool = BrokerPool([namesrv])
        processor = TransactionProcessor(pool, "proxy-test", heartbeat_s=3600.0)
        processor.start()
        try:
            processor.register([TOPIC], lambda _check: True)
            await wait_until(lambda: broker.heartbeats >= 1, timeout=5.0)
            # The round the first connection kicked may still come, and nothing says when a
            # round has ended: time for it, so that it is not taken for the reconnect's.
            await asyncio.sleep(0.5)
            before = broker.heartbeats
            broker.drop_connections()  # the broker restarted
            client = pool.broker("b")
            assert client is not None
            await wait_until(lambda: not client.remoting.connected, timeout=5.0)
            with contextlib.suppress(RemotingError):  # any call reconnects (a probe, a pop)
                await client.topic_config(TOPIC, 3.0)
            await wait_until(lambda: broker.heartbeats > before, timeout=5.0)
        finally:
            await processor.close()
            await pool.close()


async def test_a_broker_that_left_the_route_is_still_told_of_the_producers():
    """A broker SIGKILLed leaves the name server's route at once; back, it is listed again
    only when the route is refreshed, and checks its half messages meanwhile. The proxy's
    rounds keep naming the groups to a broker that served the topic within TTL + grace.
    (The dead broker refuses connections: one that still accepted them would be a broker
    the proxy reaches, kept in the route while connected.)"""
    gone, stays = HeartbeatCounter(), HeartbeatCounter()
    async with gone as gone_address, stays as stays_address:
        namesrv = RouteNamesrv(route_body({"b": gone_address, "c": stays_address}))
        async with namesrv as namesrv_address:
            pool = BrokerPool([namesrv_address], route_ttl_s=0.0, not_found_grace_s=60.0)
            processor = TransactionProcessor(pool, "proxy-test", heartbeat_s=0.2)
            processor.start()
            try:
                processor.register([TOPIC], lambda _check: True)
                await wait_until(lambda: gone.heartbeats >= 1, timeout=5.0)
                namesrv.body = route_body({"c": stays_address})  # b died: unlisted
                gone.die()
                await wait_until(
                    lambda: [b.name for b in pool._routes[TOPIC][1].brokers] == ["c"], timeout=5.0
                )
                await gone.revive()  # back; the name server lists it only later
                before = gone.heartbeats
                await wait_until(lambda: gone.heartbeats > before, timeout=5.0)
            finally:
                await processor.close()
                await pool.close()
