"""The remoting port's routing of what name servers answer: routes as fastjson writes them."""

from __future__ import annotations

import orjson

from proxy.remoting_port.routing import rewrite_route, route_brokers

# What a name server answers for a static topic (fastjson, to a client before 4.9.4): every
# map keyed by a number has its keys bare, the brokers' addresses and the queue mappings.
STATIC_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},'
    b'"brokerName":"b0","cluster":"c"}],"filterServerTable":{},'
    b'"queueDatas":[{"brokerName":"b0","perm":6,"readQueueNums":2,"topicSysFlag":0,'
    b'"writeQueueNums":2}],'
    b'"topicQueueMappingByBroker":{"b0":{"bname":"b0","currIdMap":{0:0,1:1},"epoch":1,'
    b'"topic":"T","totalQueues":2}}}'
)


def test_a_route_with_bare_number_keys_is_rewritten_as_standard_json():
    assert route_brokers(STATIC_ROUTE) == {"b0": "10.0.0.1:10911"}
    route = orjson.loads(rewrite_route(STATIC_ROUTE, lambda broker: f"proxy:{broker}"))
    assert route["brokerDatas"] == [
        {"brokerAddrs": {"0": "proxy:b0"}, "brokerName": "b0", "cluster": "c"}
    ]  # the master only, at the proxy
    assert route["topicQueueMappingByBroker"]["b0"]["currIdMap"] == {"0": 0, "1": 1}
    assert route["queueDatas"][0]["readQueueNums"] == 2
