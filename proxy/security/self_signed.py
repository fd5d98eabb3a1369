"""A certificate the proxy makes for itself when TLS has none configured.

The official Java client turns TLS on by default and accepts any server certificate, so a
proxy that a Java application reaches unchanged must speak TLS even where nobody gave it a
certificate. The Apache proxy does the same ("test mode"). The certificate is a throw-away:
an EC P-256 key, valid for a year from a day ago, naming localhost, 127.0.0.1, this host and
the hosts the proxy is reached at, written to a private temporary directory that is
removed when the proxy stops. A client that checks certificates (the Python client with TLS
on) trusts it only if handed the file; in production give the proxy a real certificate
(``security.tls_cert_file``; docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

if TYPE_CHECKING:
    from proxy.config import ProxyConfig

log = logging.getLogger(__name__)

VALID_DAYS = 365


@dataclass(frozen=True)
class SelfSigned:
    directory: str
    cert_file: str
    key_file: str

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def proxy_hosts(config: ProxyConfig) -> list[str]:
    """The names clients reach a proxy at: its gRPC host and its advertised one."""
    advertised = config.advertise_address.rpartition(":")[0] if config.advertise_address else ""
    return [h.strip("[]") for h in (config.grpc_host, advertised) if h]


def make_self_signed(hosts: list[str]) -> SelfSigned:
    """A new key and certificate for ``hosts`` (names or IP addresses) besides localhost,
    127.0.0.1 and this host's name. Blocking (file writes): run it off the event loop."""
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *hosts]
    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys(n for n in names if n and n not in ("0.0.0.0", "::")):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rmq-proxy self-signed")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        # Its own authority, so that a client can be told to trust this one file.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = tempfile.mkdtemp(prefix="rmq-proxy-tls-")  # mode 0700
    cert_file = os.path.join(directory, "cert.pem")
    key_file = os.path.join(directory, "key.pem")
    with open(cert_file, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    log.warning("TLS: no certificate configured; serving a self-signed one made at start "
                "(%s). Clients that check the server's certificate refuse it: give the proxy "
                "one with security.tls_cert_file (docs/security.md)", cert_file)  # fmt: skip
    return SelfSigned(directory, cert_file, key_file)
