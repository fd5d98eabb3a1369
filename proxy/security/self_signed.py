"""A certificate the proxy makes for itself when TLS has none configured.

The official Java client turns TLS on by default and accepts any server certificate, so a
proxy that a Java application reaches unchanged must speak TLS even where nobody gave it a
certificate. The Apache proxy does the same ("test mode"). The certificate is a throw-away:
an EC P-256 key, valid for ``VALID_DAYS`` from a day ago, naming localhost, 127.0.0.1, this
host and the hosts the proxy is reached at. It is a server certificate (not an authority),
signed by an authority made for it whose key is dropped at once: a client told to trust the
file (the server's certificate and that authority's) trusts this one server, and nothing
else can ever be signed in that authority's name. It lives in a private temporary
directory named after the process that made it, removed when the proxy stops, and, if the
process died first, at the next start of any proxy on the host. A client that checks
certificates (the Python client with TLS on) trusts it only if handed the file; in
production give the proxy a real certificate
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
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

if TYPE_CHECKING:
    from proxy.config import ProxyConfig

log = logging.getLogger(__name__)

VALID_DAYS = 30
# The temporary directories: "<prefix><pid>-<random>".
DIRECTORY_PREFIX = "rmq-proxy-tls-"


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


# What the keys may do: the server's sign its TLS handshakes, the authority's certificates.
_AUTHORITY_KEY_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)
_SERVER_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=False,
    crl_sign=False,
    encipher_only=False,
    decipher_only=False,
)


def remove_stale(temp_dir: str | None = None) -> list[str]:
    """Remove the directories of self-signed keys whose process is gone (it was killed
    before it could remove its own); the ones removed. Blocking: run it off the loop."""
    base = temp_dir or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        pid_text = name.removeprefix(DIRECTORY_PREFIX).partition("-")[0]
        if not name.startswith(DIRECTORY_PREFIX) or not pid_text.isdigit():
            continue
        if _alive(int(pid_text)):
            continue
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        removed.append(name)
    if removed:
        log.warning("TLS: removed %d self-signed key folder(s) left by proxies that died: %s",
                    len(removed), ", ".join(removed))  # fmt: skip
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def make_self_signed(hosts: list[str]) -> SelfSigned:
    """A new key and certificate for ``hosts`` (names or IP addresses) besides localhost,
    127.0.0.1 and this host's name; first removes what dead proxies left. Blocking (file
    writes): run it off the event loop."""
    remove_stale()
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *hosts]
    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys(n for n in names if n and n not in ("0.0.0.0", "::")):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.UTC)
    before, after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=VALID_DAYS)
    # An authority that signs this one certificate and is then gone: its key is never
    # written anywhere, so a client told to trust it trusts this server and nothing else.
    authority_key = ec.generate_private_key(ec.SECP256R1())
    authority = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"rmq-proxy self-signed {os.getpid()}")]
    )
    authority_cert = (
        x509.CertificateBuilder()
        .subject_name(authority)
        .issuer_name(authority)
        .public_key(authority_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before)
        .not_valid_after(after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_AUTHORITY_KEY_USAGE, critical=True)
        .sign(authority_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rmq-proxy")]))
        .issuer_name(authority)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before)
        .not_valid_after(after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_SERVER_KEY_USAGE, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(authority_key, hashes.SHA256())
    )
    del authority_key
    # mode 0700
    directory = tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-")
    cert_file = os.path.join(directory, "cert.pem")
    key_file = os.path.join(directory, "key.pem")
    with open(cert_file, "wb") as f:  # the chain the server presents: its own, then the CA
        f.write(cert.public_bytes(serialization.Encoding.PEM))
        f.write(authority_cert.public_bytes(serialization.Encoding.PEM))
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
