"""Name-server answers both backends share: topic routes and cluster info."""

from __future__ import annotations

import orjson

from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand

TIMEOUT = 5.0


async def test_route_of_a_topic_on_every_broker(backend):
    topic = backend.unique("Route")
    await backend.create_topic(topic, 8)
    namesrv = backend.remoting(backend.namesrv)
    response = await namesrv.invoke(
        RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), TIMEOUT
    )
    assert response.code == ResponseCode.SUCCESS
    assert b'"0":' in response.body  # numeric map keys quoted: valid JSON
    route = orjson.loads(response.body)
    expected = {b.name: b.address for b in backend.brokers}
    datas = route["brokerDatas"]
    assert {d["brokerName"]: d["brokerAddrs"] for d in datas} == {
        name: {"0": addr} for name, addr in expected.items()
    }
    assert all(d["cluster"] == "DefaultCluster" for d in datas)
    queues = route["queueDatas"]
    assert sorted(q["brokerName"] for q in queues) == sorted(expected)
    for q in queues:
        assert (q["perm"], q["readQueueNums"], q["writeQueueNums"], q["topicSysFlag"]) == (
            6, 8, 8, 0)  # fmt: skip


async def test_unknown_topic_has_no_route(backend):
    topic = backend.unique("NoSuchTopic")
    namesrv = backend.remoting(backend.namesrv)
    response = await namesrv.invoke(
        RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), TIMEOUT
    )
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert not response.body
    assert f"No topic route info in name server for the topic: {topic}" in response.remark


async def test_cluster_info_lists_every_broker(backend):
    namesrv = backend.remoting(backend.namesrv)
    response = await namesrv.invoke(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO), TIMEOUT)
    assert response.code == ResponseCode.SUCCESS
    # A Java name server writes the numeric broker-id keys unquoted ({0:"..."}, fastjson's
    # plain encoding): quote them before parsing, as a lenient client does.
    text = response.body.decode().replace("{0:", '{"0":')
    info = orjson.loads(text)
    names = sorted(b.name for b in backend.brokers)
    assert sorted(info["clusterAddrTable"]["DefaultCluster"]) == names
    table = info["brokerAddrTable"]
    assert sorted(table) == names
    for b in backend.brokers:
        assert table[b.name]["brokerAddrs"] == {"0": b.address}
        assert table[b.name]["cluster"] == "DefaultCluster"
        assert table[b.name]["brokerName"] == b.name
