"""The official clients against rmq-proxy: rocketmq-python-client 5.1.2 and
rocketmq-client-nodejs 1.0.8, each as a separate process, the same scenarios for both."""

from __future__ import annotations

import pytest

from tests.interop import _scenarios as scenario

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

CLIENTS = [
    pytest.param("python", "interop-py", id="python"),
    pytest.param("node", "interop-node", id="node"),
]


@pytest.mark.parametrize(("lang", "topic"), CLIENTS)
def test_start_only(proxy, run_client, lang, topic):
    scenario.start_only(run_client, lang, proxy, topic)


@pytest.mark.parametrize(("lang", "topic"), CLIENTS)
def test_produce_receive_ack(proxy, run_client, lang, topic):
    scenario.produce_receive_ack(run_client, lang, proxy, topic)


@pytest.mark.parametrize(("lang", "topic"), CLIENTS)
def test_change_invisible_duration_then_ack(proxy, run_client, lang, topic):
    scenario.change_invisible_then_ack(run_client, lang, proxy, topic)


@pytest.mark.slow
@pytest.mark.parametrize(("lang", "topic"), CLIENTS)
def test_redelivery_without_ack(proxy, run_client, lang, topic):
    scenario.redelivery_without_ack(run_client, lang, proxy, topic)
