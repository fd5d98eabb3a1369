"""The benchmarks' lean client over TLS (``bench_proxy --client-tls``, ``bench.peer
--client-tls``): it trusts the certificate a server presents, under the name that
certificate holds, and stays plaintext for endpoints it was not told about; the fan-in's
count of the connections its clients hold."""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
import subprocess
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.security.self_signed import (
    DIRECTORY_PREFIX,
    VALID_DAYS,
    SelfSigned,
    make_self_signed,
    remove_stale,
)
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


def test_the_self_signed_certificate_is_a_short_lived_server_certificate(tmp_path):
    """A server certificate (not an authority), valid for days, signed by an authority the
    file carries and whose key is nowhere (a client that trusts the file trusts nothing else
    in its name); a key folder a dead proxy left is removed when the next one makes its own,
    a live one's is kept."""
    made = make_self_signed([])
    try:
        leaf, authority = x509.load_pem_x509_certificates(Path(made.cert_file).read_bytes())
        assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
        usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
        assert usage.digital_signature and not usage.key_cert_sign
        leaf.verify_directly_issued_by(authority)
        lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
        assert lifetime <= datetime.timedelta(days=VALID_DAYS + 1) and VALID_DAYS <= 31
        folder = Path(made.directory)
        assert folder.name.startswith(f"{DIRECTORY_PREFIX}{os.getpid()}-")
        assert sorted(p.name for p in folder.iterdir()) == ["cert.pem", "key.pem"]
        key = serialization.load_pem_private_key(Path(made.key_file).read_bytes(), None)
        assert key.public_key() == leaf.public_key()  # the one private key: the server's
    finally:
        made.remove()
    gone = subprocess.Popen(["true"])  # a pid that has exited
    gone.wait()
    left = tmp_path / f"{DIRECTORY_PREFIX}{gone.pid}-abc"
    left.mkdir()
    (left / "key.pem").write_text("secret")
    mine = tmp_path / f"{DIRECTORY_PREFIX}{os.getpid()}-def"
    mine.mkdir()
    other = tmp_path / "rmq-proxy-tls-notapid"
    other.mkdir()
    assert remove_stale(str(tmp_path)) == [left.name]
    assert not left.exists() and mine.exists() and other.exists()
