"""The benchmarks' lean client over TLS (``bench_proxy --client-tls``, ``bench.peer
--client-tls``): it trusts the certificate a server presents, under the name that
certificate holds, and stays plaintext for endpoints it was not told about; the fan-in's
count of the connections its clients hold."""

from __future__ import annotations

import asyncio
import datetime
import socket
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.security.self_signed import SelfSigned, make_self_signed
from testkit import lean_client
from testkit.lean_client import LeanClient, certificate_name, server_tls
from testkit.processes import established_to


class Routes(service_pb2_grpc.MessagingServiceServicer):
    async def QueryRoute(self, request, context):
        return api.QueryRouteResponse()


def server_credentials(made: SelfSigned) -> grpc.ServerCredentials:
    pair = (Path(made.key_file).read_bytes(), Path(made.cert_file).read_bytes())
    return grpc.ssl_server_credentials([pair])


@pytest.fixture
async def tls_server():
    """A gRPC server on a TLS port with the proxy's self-signed certificate."""
    made = make_self_signed([])
    credentials = server_credentials(made)
    server = grpc.aio.server()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(Routes(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)
    made.remove()


async def test_a_client_trusts_the_certificate_the_server_presents(tls_server, monkeypatch):
    tls = await asyncio.to_thread(server_tls, tls_server)
    assert tls.name == "localhost"  # the self-signed certificate's first DNS name
    client = LeanClient(tls_server, tls=tls)
    try:
        await client.query_route("t")
    finally:
        await client.close()
    # Told through TLS_ENDPOINTS, as the benchmarks' crowds of clients are.
    monkeypatch.setitem(lean_client.TLS_ENDPOINTS, tls_server, tls)
    client = LeanClient(tls_server, own_connection=True)
    try:
        await client.query_route("t")
    finally:
        await client.close()


async def test_a_client_of_an_endpoint_not_named_is_plaintext(tls_server):
    client = LeanClient(tls_server)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(client.query_route("t"), 10)
    finally:
        await client.close()
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_certificate_without_dns_names_is_named_by_its_common_name():
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    assert certificate_name(cert.public_bytes(serialization.Encoding.PEM)) == "localhost"


def test_the_connections_established_to_a_port_are_counted():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            assert established_to(port) == 3
        finally:
            for client in clients:
                client.close()
