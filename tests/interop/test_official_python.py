"""The official Python client (rocketmq-python-client 5.1.2) against rmq-proxy."""

from __future__ import annotations

import pytest

from tests.interop import _scenarios as scenario

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

LANG = "python"
TOPIC = "interop-py"


def test_start_only(proxy, run_client):
    scenario.start_only(run_client, LANG, proxy, TOPIC)


def test_produce_receive_ack(proxy, run_client):
    scenario.produce_receive_ack(run_client, LANG, proxy, TOPIC)


def test_change_invisible_duration_then_ack(proxy, run_client):
    scenario.change_invisible_then_ack(run_client, LANG, proxy, TOPIC)


@pytest.mark.slow
def test_redelivery_without_ack(proxy, run_client):
    scenario.redelivery_without_ack(run_client, LANG, proxy, TOPIC)
