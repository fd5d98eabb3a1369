"""``SecurityConfig``: the ``[security]`` table of the proxy's configuration (environment
``RMQ_PROXY_SECURITY_<KEY>``). Every setting is off by default."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeVar

E = TypeVar("E", bound=enum.StrEnum)


class TlsMode(enum.StrEnum):
    """``security.tls_mode``: which clients the gRPC port takes (the Apache proxy's
    ``tlsMode``, with the same names)."""

    # TLS and plaintext clients on the one port, told apart by their first byte.
    PERMISSIVE = "permissive"
    # TLS clients only.
    ENFORCING = "enforcing"
    # Plaintext clients only.
    DISABLED = "disabled"


class AuthSource(enum.StrEnum):
    """``security.auth_source``: where the proxy reads its clients' users and permissions."""

    # The operator's user file (users_file); no file: no authentication.
    FILE = "file"
    # The cluster's own ACL 2.0 users and rules (mqadmin createUser / updateAcl), read from
    # the brokers with the proxy's broker credentials and cached (cluster_users_*).
    CLUSTER = "cluster"


@dataclass
class SecurityConfig:
    # Which clients the gRPC port takes: permissive (TLS and plaintext), enforcing (TLS
    # only), disabled (plaintext only). The official Java client turns TLS on by default,
    # the Python client leaves it off: permissive serves both unchanged.
    tls_mode: TlsMode = TlsMode.PERMISSIVE
    # Without tls_cert_file, permissive and enforcing serve TLS with a certificate the proxy
    # makes at start (the clients that check certificates refuse it; docs/security.md).
    # False: no TLS without a configured certificate (permissive then takes plaintext only).
    tls_self_signed: bool = True
    # TLS on the gRPC port: PEM certificate chain and private key. Both or neither.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None  # the certificate's PEM private key
    # With a CA bundle, clients must present a certificate it signed (mutual TLS).
    tls_client_ca_file: str | None = None
    # The gRPC port reads the HAProxy PROXY protocol header (v1 or v2) a load balancer
    # writes first, and takes the client's address from it (logs, authorization, a
    # message's born host). Only behind a balancer that sends it: any client can write one.
    # Off, a connection that opens with one is closed.
    proxy_protocol: bool = False
    # Serve the ops HTTP port over TLS too, with the same certificate.
    tls_ops: bool = False
    # Where users and their permissions come from: "file" (users_file) or "cluster" (the
    # brokers' ACL 2.0 users and rules; needs broker_access_key, a user that may read them).
    auth_source: AuthSource = AuthSource.FILE
    # The operator's user file (TOML or JSON): set, every RPC must be signed by one of them.
    users_file: str | None = None
    # auth_source "cluster": a user and its rules are read again after this many seconds,
    # so a change made with mqadmin takes effect within it (the Apache proxy's
    # userCacheRefreshSeconds).
    cluster_users_refresh_s: float = 20.0
    # auth_source "cluster": users kept, the least recently used leaving first
    # (userCacheMaxNum).
    cluster_users_max: int = 20_000
    # auth_source "cluster": with no broker answering, a user read before is still
    # honoured until its last good read is this old (userCacheExpiredSeconds).
    cluster_users_expire_s: float = 300.0
    # With a user file: enforce each user's permissions (false: authentication only; a
    # user's source_ips hold either way).
    authorization: bool = True
    # How far a request's x-mq-date-time may be from the proxy's clock.
    clock_skew_s: float = 900.0
    # Certificate and user files are checked for changes this often (SIGHUP: at once).
    reload_interval_s: float = 10.0
    # The proxy's own credentials for brokers with ACL on (their remoting ACL hook).
    broker_access_key: str | None = None
    broker_secret_key: str | None = field(default=None, repr=False)  # set it by environment

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)

    @property
    def authentication(self) -> bool:
        return bool(self.users_file) or self.auth_source is AuthSource.CLUSTER

    def __post_init__(self) -> None:
        self.validate_mode()

    def validate_mode(self) -> None:
        self.tls_mode = _member(TlsMode, self.tls_mode, "tls_mode")
        self.auth_source = _member(AuthSource, self.auth_source, "auth_source")

    @property
    def serves_tls(self) -> bool:
        """Whether the gRPC port takes TLS clients: with a certificate, configured or made."""
        return self.tls_mode is not TlsMode.DISABLED and (self.tls or self.tls_self_signed)

    def validate(self) -> None:
        self.validate_mode()
        if self.tls_mode is TlsMode.ENFORCING and not self.serves_tls:
            raise ValueError(
                "security.tls_mode = enforcing needs tls_cert_file, or tls_self_signed = true"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("security.tls_cert_file and tls_key_file go together")
        if (self.tls_client_ca_file or self.tls_ops) and not self.tls:
            raise ValueError("security.tls_client_ca_file and tls_ops need tls_cert_file")
        if bool(self.broker_access_key) != bool(self.broker_secret_key):
            raise ValueError("security.broker_access_key and broker_secret_key go together")
        if self.auth_source is AuthSource.CLUSTER:
            if self.users_file:
                raise ValueError("security.auth_source = cluster reads no users_file")
            if not self.broker_access_key:
                raise ValueError(
                    "security.auth_source = cluster needs broker_access_key and "
                    "broker_secret_key: the proxy reads the cluster's users as that user"
                )
            if min(self.cluster_users_refresh_s, self.cluster_users_expire_s) <= 0:
                raise ValueError("security.cluster_users_refresh_s and _expire_s must be positive")
            if self.cluster_users_max < 1:
                raise ValueError("security.cluster_users_max must be at least 1")
        if self.clock_skew_s <= 0:
            raise ValueError("security.clock_skew_s must be positive")
        if self.reload_interval_s <= 0:
            raise ValueError("security.reload_interval_s must be positive")


def _member(kind: type[E], value: str, key: str) -> E:
    """``value`` (a name read from a file or the environment) as a member of ``kind``."""
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(m.value for m in kind)
        raise ValueError(f"security.{key} must be one of {names}, not {value!r}") from None
