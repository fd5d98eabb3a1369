"""``LeanClient`` with TLS and ACL 2.0 signatures, for the security tests: every call gets a
fresh ``x-mq-date-time`` and ``authorization``, as the official clients send them."""

from __future__ import annotations

from pathlib import Path

import grpc

from proxy.api.v2 import service_pb2_grpc
from proxy.security import signing
from testkit.lean_client import LeanClient


class SecureLeanClient(LeanClient):
    def __init__(
        self,
        endpoint: str,
        client_id: str = "secure-client",
        *,
        access_key: str | None = None,
        secret_key: str = "",
        ca: Path | None = None,
        client_cert: tuple[Path, Path] | None = None,
        date_time: str | None = None,
    ) -> None:
        self.access_key = access_key
        self.secret_key = secret_key
        self.date_time = date_time  # a fixed (e.g. stale) date-time instead of now
        if ca is None:
            self.channel = grpc.aio.insecure_channel(endpoint)
        else:
            chain = key = None
            if client_cert is not None:
                chain, key = client_cert[0].read_bytes(), client_cert[1].read_bytes()
            credentials = grpc.ssl_channel_credentials(ca.read_bytes(), key, chain)
            self.channel = grpc.aio.secure_channel(endpoint, credentials)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.metadata = (("x-mq-client-id", client_id),)

    @property  # type: ignore[override]
    def metadata(self) -> tuple[tuple[str, str], ...]:
        if self.access_key is None:
            return self._base
        date_time = self.date_time or signing.now_date_time()
        header = signing.authorization_header(self.access_key, self.secret_key, date_time)
        return (*self._base, (signing.DATE_TIME, date_time), (signing.AUTHORIZATION, header))

    @metadata.setter
    def metadata(self, value: tuple[tuple[str, str], ...]) -> None:
        self._base = value
