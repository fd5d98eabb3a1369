"""The client port behind a load balancer that sends the PROXY protocol: on, a header (v1
or v2) names the client and the connection goes on; off, or malformed, the connection is
closed unanswered, counted and logged (docs/security.md)."""

from __future__ import annotations

import logging
import struct

import pytest

from proxy.api.v2 import definition_pb2 as pb
from proxy.security.config import SecurityConfig
from proxy.security.proxy_protocol import V2_SIGNATURE
from testkit.balancer import Balancer
from testkit.lean_client import LeanClient
from tests.support.raw_connection import first_answer


def v1(client: tuple[str, int]) -> bytes:
    return f"PROXY TCP4 198.51.100.4 127.0.0.1 {client[1]} 8081\r\n".encode()


def v2(client: tuple[str, int]) -> bytes:
    body = bytes([198, 51, 100, 4, 127, 0, 0, 1]) + struct.pack("!HH", client[1], 8081)
    return V2_SIGNATURE + bytes([0x21, 0x11]) + struct.pack("!H", len(body)) + body


@pytest.mark.parametrize("header", [v1, v2], ids=["v1", "v2"])
async def test_with_the_option_on_a_header_names_the_client(start_proxy, header):
    app = await start_proxy(brokers=1, security=SecurityConfig(proxy_protocol=True))
    assert app.front is not None
    balancer = Balancer([(f"127.0.0.1:{app.grpc_port}", None)], header=header)
    client = LeanClient(await balancer.start(), "balanced")
    try:
        sent = await client.send("T", b"via the balancer")
        assert sent.status.code == pb.Code.OK
        direct = LeanClient(f"127.0.0.1:{app.grpc_port}", "direct")  # no header: also served
        try:
            assert (await direct.query_route("T")).status.code == pb.Code.OK
        finally:
            await direct.close()
    finally:
        await client.close()
        await balancer.close()
    status = app.front.status()["proxy_protocol"]
    assert status == {"on": True, "headers": 1, "refused": 0}


async def test_with_the_option_off_a_header_closes_the_connection(start_proxy, caplog):
    app = await start_proxy(brokers=1, security=SecurityConfig())
    assert app.front is not None
    caplog.set_level(logging.WARNING, logger="proxy.security.front")
    opening = v1(("127.0.0.1", 5000)) + b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    assert await first_answer(f"127.0.0.1:{app.grpc_port}", opening) == b""
    assert app.front.status()["proxy_protocol"] == {"on": False, "headers": 0, "refused": 1}
    assert "PROXY header but security.proxy_protocol is off" in caplog.text


async def test_a_malformed_header_is_refused_and_the_port_serves_on(start_proxy, caplog):
    app = await start_proxy(brokers=1, security=SecurityConfig(proxy_protocol=True))
    assert app.front is not None
    caplog.set_level(logging.WARNING, logger="proxy.security.front")
    address = f"127.0.0.1:{app.grpc_port}"
    assert await first_answer(address, b"PROXY TCP4 198.51.100.4 x 1 2\r\n") == b""
    assert "that does not parse" in caplog.text
    client = LeanClient(address, "after")
    try:
        assert (await client.query_route("T")).status.code == pb.Code.OK
    finally:
        await client.close()
    assert app.front.status()["proxy_protocol"]["refused"] == 1
