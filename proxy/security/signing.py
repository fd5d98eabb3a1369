"""The two signatures of RocketMQ's ACL 2.0, as the clients and brokers compute them.

**Clients to the proxy (gRPC).** Every request carries the metadata::

    x-mq-date-time: 20240102T030405Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                    Signature=<hex of HMAC-SHA1(secret key, x-mq-date-time)>

The Python client writes the signature in lower-case hex, the Node client in upper case; the
broker compares the decoded bytes, so do we. ``Credential`` may carry more after a ``/``;
only what precedes it is the access key. A client without credentials sends either no
``authorization`` at all (Node) or one with an empty access key (Python).

**The proxy to brokers (remoting).** The ACL hook adds ``AccessKey`` to the request's
fields, then ``Signature``: base64 of HMAC-SHA1(secret key, the values of every field but
``Signature`` in the order of their names, then the body).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime

from proxy.remoting.command import RemotingCommand

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ACCESS_KEY_FIELD = "AccessKey"
SIGNATURE_FIELD = "Signature"


class SignatureError(Exception):
    """A request's signature is missing, malformed or stale (``reason`` says which; it is a
    metric label, the message is for the client)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClientSignature:
    """What a request's ``authorization`` and ``x-mq-date-time`` say."""

    access_key: str
    signature: bytes = b""
    date_time: str = ""


def access_key_of(authorization: str | None) -> str | None:
    """The access key an ``authorization`` value names, if it parses (the user to read
    before the request is checked); None otherwise."""
    try:
        return parse(authorization, "-").access_key
    except SignatureError:
        return None


def parse(authorization: str | None, date_time: str | None) -> ClientSignature:
    """The signature of a request, from its two metadata values; raises SignatureError
    ("missing" without credentials, "malformed" for anything that does not parse)."""
    if not authorization:
        raise SignatureError("missing", "no credentials: the authorization header is missing")
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM or not rest:
        raise SignatureError("malformed", f"authorization must use {ALGORITHM}")
    access_key = signature_hex = None
    for item in rest.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq:
            raise SignatureError("malformed", "authorization items must be key=value")
        if key == "Credential":
            access_key = value.split("/", 1)[0].strip()
        elif key == "Signature":
            signature_hex = value.strip()
    if not access_key:
        raise SignatureError("missing", "no credentials: the access key is empty")
    if not signature_hex:
        raise SignatureError("malformed", "authorization carries no Signature")
    try:
        signature = bytes.fromhex(signature_hex)
    except ValueError:
        raise SignatureError("malformed", "the Signature is not hexadecimal") from None
    if not date_time:
        raise SignatureError("malformed", f"{DATE_TIME} is missing")
    return ClientSignature(access_key, signature, date_time)


def check_fresh(date_time: str, now: float, skew_s: float) -> None:
    """Raise SignatureError unless ``date_time`` (UTC) is within ``skew_s`` of ``now``."""
    try:
        signed_at = datetime.strptime(date_time, DATE_TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise SignatureError("malformed", f"{DATE_TIME} is not {DATE_TIME_FORMAT}") from None
    if abs(signed_at.timestamp() - now) > skew_s:
        raise SignatureError(
            "stale", f"{DATE_TIME} is more than {skew_s:.0f}s from the proxy's clock"
        )


def client_signature(secret_key: str, date_time: str) -> bytes:
    """HMAC-SHA1 of the date-time under the secret key (the clients send it in hex)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).digest()


def verify(sig: ClientSignature, secret_key: str) -> bool:
    """Whether ``sig`` was made with ``secret_key``, compared in constant time."""
    return hmac.compare_digest(client_signature(secret_key, sig.date_time), sig.signature)


def authorization_header(access_key: str, secret_key: str, date_time: str) -> str:
    """The ``authorization`` value a client sends (for tests and tools)."""
    signature = client_signature(secret_key, date_time).hex()
    return f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, Signature={signature}"


def now_date_time(now: float | None = None) -> str:
    moment = datetime.now(UTC) if now is None else datetime.fromtimestamp(now, UTC)
    return moment.strftime(DATE_TIME_FORMAT)


def remoting_signature(fields: dict[str, str], body: bytes, secret_key: str) -> str:
    """The broker ACL hook's signature over ``fields`` (but ``Signature``) and ``body``."""
    content = "".join(v for k, v in sorted(fields.items()) if k != SIGNATURE_FIELD).encode()
    mac = hmac.new(secret_key.encode(), content + body, hashlib.sha1).digest()
    return base64.b64encode(mac).decode()


class RemotingSigner:
    """Signs every remoting request with the proxy's own credentials."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self.access_key = access_key
        self._secret_key = secret_key

    def __repr__(self) -> str:
        return f"RemotingSigner(access_key={self.access_key!r})"

    def __call__(self, request: RemotingCommand) -> None:
        fields = request.fields
        fields.pop(SIGNATURE_FIELD, None)
        fields[ACCESS_KEY_FIELD] = self.access_key
        fields[SIGNATURE_FIELD] = remoting_signature(fields, request.body, self._secret_key)
