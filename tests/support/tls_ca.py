"""A throw-away certificate authority for the security tests, made with the ``openssl``
command: a CA, a server certificate for 127.0.0.1 / localhost, and a client certificate.
Every key lives in the test's temporary folder and dies with it."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class TestCA:
    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    def issue(self, name: str, *, server: bool = True, cn: str = "localhost") -> tuple[Path, Path]:
        """A certificate and key signed by this CA; a server certificate names 127.0.0.1
        and localhost."""
        key, csr, cert = (self.root / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        ext = self.root / f"{name}.ext"
        if server:
            ext.write_text(
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
            )
        else:
            ext.write_text("extendedKeyUsage=clientAuth\n")
        _openssl("req", *_EC, "-keyout", key.name, "-out", csr.name, "-subj", f"/CN={cn}",
                 cwd=self.root)  # fmt: skip
        _openssl("x509", "-req", "-in", csr.name, "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", cert.name, "-extfile", ext.name,
                 cwd=self.root)  # fmt: skip
        return cert, key


def make_ca(folder: Path) -> TestCA:
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=rmq-proxy-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)  # fmt: skip
    return TestCA(folder)
