"""TLS for the proxy's ports: the certificate and key from files, reloaded without a restart.

gRPC asks ``ServerTls`` for a certificate configuration at every new connection's handshake
(``grpc.dynamic_ssl_server_credentials``); that callback only hands over a configuration
read earlier, off the event loop, by ``reload()``. Connections already open keep the
certificate they started with. The ops port's ``ssl.SSLContext`` loads the new pair the
same way, so its next handshakes use it.

A reload that fails (a missing file, a key that does not match the certificate) keeps the
pair in use and says so in the log and in ``/v1/status``.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import threading
import time
from dataclasses import dataclass

import grpc


@dataclass(frozen=True, slots=True)
class _Loaded:
    chain: bytes
    key: bytes
    client_ca: bytes | None
    stamp: tuple[tuple[int, int, int], ...]
    fingerprint: str  # SHA-256 of the leaf certificate (DER), hex
    loaded_at: float


class ServerTls:
    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._ops_context: ssl.SSLContext | None = None
        self.last_error: str | None = None
        self.reloads = 0
        self._current = self._read()  # at start a bad file is fatal

    @property
    def files(self) -> list[str]:
        return [f for f in (self.cert_file, self.key_file, self.client_ca_file) if f]

    def stamp(self) -> tuple[tuple[int, int, int], ...]:
        """What the files look like now (cheap: one stat each); a change means reload."""
        stamps = []
        for path in self.files:
            try:
                st = os.stat(path)
                stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                stamps.append((0, 0, 0))
        return tuple(stamps)

    def changed(self) -> bool:
        return self.stamp() != self._current.stamp

    def _read(self) -> _Loaded:
        stamp = self.stamp()
        with open(self.cert_file, "rb") as f:
            chain = f.read()
        with open(self.key_file, "rb") as f:
            key = f.read()
        client_ca = None
        if self.client_ca_file:
            with open(self.client_ca_file, "rb") as f:
                client_ca = f.read()
        # Check the pair before anyone is handed it: a key that does not match fails here.
        check = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        check.load_cert_chain(self.cert_file, self.key_file)
        leaf = chain.decode("ascii", "replace").split("-----END CERTIFICATE-----")[0]
        der = ssl.PEM_cert_to_DER_cert(leaf + "-----END CERTIFICATE-----\n")
        return _Loaded(chain, key, client_ca, stamp, hashlib.sha256(der).hexdigest(), time.time())

    def _configuration(self, loaded: _Loaded) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(loaded.key, loaded.chain)], root_certificates=loaded.client_ca
        )

    def reload(self) -> bool:
        """Read the files again (blocking: run it in a thread). True if the new pair is in
        use; on failure the old one stays."""
        try:
            loaded = self._read()
            configuration = self._configuration(loaded)
            if self._ops_context is not None:
                self._ops_context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ValueError, ssl.SSLError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        with self._lock:
            self._pending = configuration
            self._current = loaded
        self.last_error = None
        self.reloads += 1
        return True

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC at each handshake: hand over a new pair once, else keep the one
        # in use (None). Never blocks on files.
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(self._current),
            # grpc documents None as "keep the configuration in use"; its stub does not.
            self._fetch,  # type: ignore[arg-type]
            require_client_authentication=self.client_ca_file is not None,
        )

    def ops_context(self) -> ssl.SSLContext:
        """A server context for the ops port (the same pair; client certificates as for
        gRPC)."""
        if self._ops_context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file:
                context.load_verify_locations(self.client_ca_file)
                context.verify_mode = ssl.CERT_REQUIRED
            self._ops_context = context
        return self._ops_context

    def status(self) -> dict[str, object]:
        return {
            "cert_file": self.cert_file,
            "cert_sha256": self._current.fingerprint,
            "loaded_at": round(self._current.loaded_at, 3),
            "reloads": self.reloads,
            "client_auth": self.client_ca_file is not None,
            "last_error": self.last_error,
        }
