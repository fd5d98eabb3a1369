"""The stub name server: routes, registration, unregistration and expiry."""

# Routes and cluster info as a real name server answers them: tests/conformance/test_namesrv.py.

from __future__ import annotations

import asyncio
import time
import zlib

import orjson
import pytest

from broker_stub import BrokerConfig, NameServer, NamesrvConfig, StubCluster
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from testkit.waits import wait_until

T = "TopicRoute"
TIMEOUT = 3.0


async def get_route(namesrv: RemotingClient, topic: str) -> RemotingCommand:
    return await namesrv.invoke(
        RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), TIMEOUT
    )


async def broker_names(namesrv: RemotingClient, topic: str) -> list[str]:
    """The brokers the route of ``topic`` lists; [] when the name server answers 17."""
    response = await get_route(namesrv, topic)
    if response.code == ResponseCode.TOPIC_NOT_EXIST:
        return []
    assert response.code == ResponseCode.SUCCESS
    return [b["brokerName"] for b in orjson.loads(response.body)["brokerDatas"]]


@pytest.fixture
async def cluster3():
    async with StubCluster(3) as cluster:
        yield cluster


@pytest.fixture
async def namesrv_client(cluster3):
    client = RemotingClient(cluster3.namesrv_address)
    yield client
    await client.close()


async def test_stopped_broker_unregisters():
    async with StubCluster(3, template=BrokerConfig(topics=[T])) as cluster:
        namesrv = RemotingClient(cluster.namesrv_address)
        try:
            names = sorted(b.name for b in cluster.brokers)
            assert sorted(await broker_names(namesrv, T)) == names

            leaving = cluster.brokers.pop()
            await leaving.stop()

            assert sorted(await broker_names(namesrv, T)) == sorted(set(names) - {leaving.name})
            assert leaving.name not in cluster.namesrv.brokers
        finally:
            await namesrv.close()


def register_command(name: str, addr: str, *, crc: int | None = None) -> RemotingCommand:
    body = orjson.dumps(
        {
            "filterServerList": [],
            "topicConfigSerializeWrapper": {
                "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": 0},
                "topicConfigTable": {
                    T: {
                        "attributes": {},
                        "order": False,
                        "perm": 6,
                        "readQueueNums": 2,
                        "topicFilterType": "SINGLE_TAG",
                        "topicName": T,
                        "topicSysFlag": 0,
                        "writeQueueNums": 2,
                    }
                },
            },
        }
    )
    fields = {
        "brokerName": name,
        "brokerAddr": addr,
        "clusterName": "DefaultCluster",
        "haServerAddr": addr,
        "brokerId": "0",
        "compressed": "false",
        "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF if crc is None else crc),
    }
    return RemotingCommand(RequestCode.REGISTER_BROKER, fields, body)


@pytest.fixture
async def fast_namesrv():
    server = NameServer(
        NamesrvConfig(host="127.0.0.1", port=0, broker_timeout=0.3, scan_interval=0.1)
    )
    await server.start()
    client = RemotingClient(server.address)
    yield server, client
    await client.close()
    await server.stop()


async def test_silent_broker_expires(fast_namesrv):
    server, client = fast_namesrv
    register = register_command("broker-x", "127.0.0.1:10911")

    # Kept alive while it keeps registering, well past the timeout ...
    for _ in range(6):
        response = await client.invoke(register, TIMEOUT)
        assert response.code == ResponseCode.SUCCESS
        assert await broker_names(client, T) == ["broker-x"]
        await asyncio.sleep(0.1)  # 0.6 s of registrations, twice the 0.3 s expiry
    route = orjson.loads((await get_route(client, T)).body)
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}
    assert route["queueDatas"][0]["readQueueNums"] == 2

    # ... and removed once it falls silent.
    silent_at = time.monotonic()

    async def gone() -> bool:
        return await broker_names(client, T) == []

    await wait_until(gone, timeout=2.0, step=0.02, what="broker-x expired")
    assert time.monotonic() - silent_at >= 0.2
    assert "broker-x" not in server.brokers


async def test_register_with_wrong_crc(fast_namesrv):
    server, client = fast_namesrv
    good = register_command("broker-y", "127.0.0.1:10921")
    wrong = (int(good.fields["bodyCrc32"]) + 1) & 0x7FFFFFFF or 1
    response = await client.invoke(
        register_command("broker-y", "127.0.0.1:10921", crc=wrong), TIMEOUT
    )
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark == "crc32 not match"
    assert "broker-y" not in server.brokers
    assert await broker_names(client, T) == []


async def test_broker_registers_again_when_a_topic_is_created():
    # The periodic registration is 30 s away: only the topic creation can trigger it.
    async with StubCluster(1, template=BrokerConfig(register_interval=30.0)) as cluster:
        broker = cluster.brokers[0]
        namesrv = RemotingClient(cluster.namesrv_address)
        client = BrokerClient(broker.name, broker.address)
        try:
            assert await broker_names(namesrv, "FreshTopic") == []
            await client.send("FreshTopic", b"first")

            async def routed() -> bool:
                return await broker_names(namesrv, "FreshTopic") == [broker.name]

            await wait_until(routed, timeout=2.0, step=0.02, what="the topic routed")
        finally:
            await client.close()
            await namesrv.close()
