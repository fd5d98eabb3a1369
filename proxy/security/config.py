"""``SecurityConfig``: the ``[security]`` table of the proxy's configuration (environment
``RMQ_PROXY_SECURITY_<KEY>``). Every setting is off by default."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SecurityConfig:
    # TLS on the gRPC port: PEM certificate chain and private key. Both or neither.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # With a CA bundle, clients must present a certificate it signed (mutual TLS).
    tls_client_ca_file: str | None = None
    # Serve the ops HTTP port over TLS too, with the same certificate.
    tls_ops: bool = False
    # The operator's user file (TOML or JSON): set, every RPC must be signed by one of them.
    users_file: str | None = None
    # With a user file: enforce each user's permissions (false: authentication only).
    authorization: bool = True
    # How far a request's x-mq-date-time may be from the proxy's clock.
    clock_skew_s: float = 900.0
    # Certificate and user files are checked for changes this often (SIGHUP: at once).
    reload_interval_s: float = 10.0
    # The proxy's own credentials for brokers with ACL on (their remoting ACL hook).
    broker_access_key: str | None = None
    broker_secret_key: str | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)

    @property
    def authentication(self) -> bool:
        return bool(self.users_file)

    def validate(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("security.tls_cert_file and tls_key_file go together")
        if (self.tls_client_ca_file or self.tls_ops) and not self.tls:
            raise ValueError("security.tls_client_ca_file and tls_ops need tls_cert_file")
        if bool(self.broker_access_key) != bool(self.broker_secret_key):
            raise ValueError("security.broker_access_key and broker_secret_key go together")
        if self.clock_skew_s <= 0:
            raise ValueError("security.clock_skew_s must be positive")
        if self.reload_interval_s <= 0:
            raise ValueError("security.reload_interval_s must be positive")
