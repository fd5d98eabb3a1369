"""A name server that restarts knows no topic until the brokers register again (a real
broker every 30 s). The chaos soak saw every client call answered TOPIC_NOT_FOUND in that
gap; a proxy now keeps a route it saw lately (``BrokerPool(not_found_grace_s=...)``). A route
past its TTL is answered at once and refreshed in the background, so ``settled_route`` asks
twice: the second answer is the one the refresh left.

The name server here is a fake that answers with a real route (taken from a stub name
server) and then, "restarted", TOPIC_NOT_EXIST: no race with the brokers' registration."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.brokers import BrokerPool, TopicNotFound
from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from testkit.waits import wait_until
from tests.support.brokers import ScriptedServer

T = "TopicRestart"


class ForgetfulNamesrv(ScriptedServer):
    """Answers GET_ROUTEINFO_BY_TOPIC with ``route`` for ``T`` until ``knows`` is cleared,
    then TOPIC_NOT_EXIST for everything, as a freshly restarted name server does; while
    ``hung`` it answers nothing, as a name server that stopped does."""

    def __init__(self, route: bytes) -> None:
        super().__init__(self._route)
        self.route = route
        self.knows = True
        self.hung = False
        self.asked = 0

    def _route(self, cmd: RemotingCommand) -> RemotingCommand | None:
        self.asked += 1
        if self.hung:
            return None
        if self.knows and cmd.fields.get("topic") == T:
            return cmd.make_response(ResponseCode.SUCCESS, body=self.route)
        return cmd.make_response(ResponseCode.TOPIC_NOT_EXIST, remark="no")


async def settled_route(pool: BrokerPool, topic: str):
    """The route once the refresh that a first ask starts has ended (bounded wait)."""
    await pool.route(topic)
    await wait_until(lambda: not pool._lookups, timeout=2.0)
    return await pool.route(topic)


async def route_body_of(cluster: StubCluster) -> bytes:
    """``T``'s route as ``cluster``'s name server answers it."""
    client = RemotingClient(cluster.namesrv_address)
    try:
        response = await client.invoke(
            RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": T}), 3.0
        )
    finally:
        await client.close()
    assert response.code == ResponseCode.SUCCESS
    return response.body


@pytest.fixture
async def route_body():
    async with StubCluster(2, template=BrokerConfig(topics=[T])) as cluster:
        return await route_body_of(cluster)


async def test_a_route_seen_lately_survives_a_name_server_restart(route_body):
    fake = ForgetfulNamesrv(route_body)
    async with fake as address:
        pool = BrokerPool([address], route_ttl_s=0.0, not_found_grace_s=60.0)
        try:
            before = await pool.route(T)
            assert {b.name for b in before.brokers} == {"broker-a", "broker-b"}
            fake.knows = False  # restarted: nobody registered yet
            assert await settled_route(pool, T) == before
            with pytest.raises(TopicNotFound):  # a topic never seen is still not found
                await pool.route("NeverSeen")
        finally:
            await pool.close()


async def test_past_the_grace_a_topic_the_name_server_does_not_know_is_not_found(route_body):
    fake = ForgetfulNamesrv(route_body)
    async with fake as address:
        pool = BrokerPool([address], route_ttl_s=0.0, not_found_grace_s=0.0)
        try:
            await pool.route(T)
            fake.knows = False
            with pytest.raises(TopicNotFound):
                await settled_route(pool, T)
        finally:
            await pool.close()


def _without(body: bytes, broker: str) -> bytes:
    """The route body as a name server that has not heard from ``broker`` yet answers it."""
    data = orjson.loads(body)
    data["brokerDatas"] = [b for b in data["brokerDatas"] if b["brokerName"] != broker]
    data["queueDatas"] = [q for q in data["queueDatas"] if q["brokerName"] != broker]
    return orjson.dumps(data)


@pytest.mark.parametrize("grace_s", [60.0, 0.0])
async def test_a_broker_not_registered_again_yet_stays_in_the_route_while_connected(grace_s):
    """After a restart the name server lists the brokers as they register, one by one. A
    broker it lists no more, lately listed and still connected, stays in the route: else a
    message group's queue (its crc32 among the writable queues) moves, and a FIFO group is
    consumed out of order (the official-client soak saw it). Past the grace it goes."""
    async with StubCluster(2, template=BrokerConfig(topics=[T])) as cluster:
        full = await route_body_of(cluster)
        fake = ForgetfulNamesrv(full)
        async with fake as address:
            pool = BrokerPool([address], route_ttl_s=0.0, not_found_grace_s=grace_s)
            try:
                before = await pool.route(T)
                for broker in before.brokers:  # both connected, as by sends and pops
                    broker_client = pool.broker(broker.name)
                    assert broker_client is not None
                    await broker_client.topic_config(T, 3.0)
                fake.route = _without(full, "broker-b")
                after = await settled_route(pool, T)
                if grace_s:
                    assert after.brokers == before.brokers
                else:
                    assert [b.name for b in after.brokers] == ["broker-a"]
            finally:
                await pool.close()


async def test_a_stale_route_is_answered_without_waiting_for_a_hung_name_server(route_body):
    """A name server that stopped answering must not hold up requests for a topic with a
    route: the official-client soak saw Node receives run past their deadline while each
    waited out the route look-up's timeout. The look-up timeout here is 60 s; the route
    must come back well inside it, and a refresh must still be tried."""
    fake = ForgetfulNamesrv(route_body)
    async with fake as address:
        pool = BrokerPool([address], route_ttl_s=0.0, timeout_s=60.0)
        try:
            before = await pool.route(T)
            fake.hung = True
            assert await asyncio.wait_for(pool.route(T), 5.0) == before
            assert T in pool._lookups  # the refresh waits on the name server meanwhile
            assert await asyncio.wait_for(pool.route(T), 5.0) == before
        finally:
            await pool.close()


@pytest.mark.parametrize("message_type", ["FIFO", "NORMAL"])
async def test_a_fifo_topic_keeps_a_crashed_broker_in_its_route(message_type):
    """A broker that crashes leaves the name server's route at once. A FIFO topic keeps it
    (within the grace), so its message groups do not move to other queues and get consumed
    before what they left on it (the official-client soak saw it after broker SIGKILLs);
    any other topic drops it, and its sends go to the brokers that are up."""
    async with StubCluster(2) as cluster:
        for broker in cluster.brokers:
            broker.topics.create(T, attributes={"message.type": message_type})
        await asyncio.gather(*(broker.register() for broker in cluster.brokers))
        full = await route_body_of(cluster)
        fake = ForgetfulNamesrv(full)
        async with fake as address:
            pool = BrokerPool([address], route_ttl_s=0.0, not_found_grace_s=60.0)
            try:
                before = await pool.route(T)
                assert before.message_type.value == message_type
                assert [b.name for b in before.brokers] == ["broker-a", "broker-b"]
                # broker-a is the one a route asks for the topic's type: the crash of the
                # first broker must not cost the route its type.
                await cluster.broker("broker-a").stop()
                crashed = pool.broker("broker-a")
                assert crashed is not None
                await wait_until(lambda: not crashed.remoting.connected, timeout=5.0)
                fake.route = _without(full, "broker-a")
                after = await settled_route(pool, T)
                assert after.message_type == before.message_type
                if message_type == "FIFO":
                    assert after.brokers == before.brokers
                    assert after.queues == before.queues
                else:
                    assert [b.name for b in after.brokers] == ["broker-b"]
            finally:
                await pool.close()


async def test_a_failed_refresh_is_not_retried_by_every_request(route_body):
    """While the name server has forgotten a topic, a stale route is served and looked up
    again at most every REFRESH_RETRY_S: the soak saw a look-up (and a log line) per request
    through each name-server restart."""
    fake = ForgetfulNamesrv(route_body)
    async with fake as address:
        ttl = 0.3  # the retry waits min(TTL, REFRESH_RETRY_S): here the TTL
        pool = BrokerPool([address], route_ttl_s=ttl, not_found_grace_s=60.0)
        try:
            before = await pool.route(T)
            fake.knows = False
            await asyncio.sleep(ttl)  # the route's TTL runs out: stale now
            asked, started = fake.asked, time.monotonic()
            for _ in range(50):
                assert await pool.route(T) == before
                await asyncio.sleep(0.005)  # requests spread over time: retries per interval
            retries = int((time.monotonic() - started) / ttl)
            # The first request's refresh, and one per retry interval: not one per request.
            assert 1 <= fake.asked - asked <= 1 + retries < 50
        finally:
            await pool.close()
