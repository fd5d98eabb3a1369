"""The HAProxy PROXY protocol (v1 text, v2 binary): the header a load balancer writes at
the start of a connection to say which client it carries.

Behind an L4 balancer every connection comes from the balancer; with
``security.proxy_protocol`` on, the client port reads this header first and takes the
client's address from it, as the Apache proxy does on its ports. The header is optional on
such a port (a connection without one is the client itself), and one that does not parse
closes the connection without an answer, as the Apache proxy's decoder does.

v1: one line, ``PROXY TCP4|TCP6 <src> <dst> <sport> <dport>\\r\\n`` or ``PROXY UNKNOWN...``,
at most 107 bytes. v2: a 12-byte signature, a version/command byte (0x20 LOCAL, 0x21 PROXY),
a family/transport byte, a 16-bit length, then the addresses and TLVs (which nothing here
reads). LOCAL, UNKNOWN and non-IP families carry no client address.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX_LENGTH = 107  # the longest v1 line, CRLF included
_V2_FIXED = 16  # signature, version/command, family, length
# v2 families with an IP address: the address block's length for TCP or UDP over each.
_V2_IP_BLOCKS = {0x11: 12, 0x12: 12, 0x21: 36, 0x22: 36}
_V2_UNIX = (0x31, 0x32)
_V2_UNIX_BLOCK = 216


class ProxyHeaderError(ValueError):
    """The connection opened with a PROXY header that does not parse."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A complete header: its length in bytes, and the client's address if it names one."""

    length: int
    source: tuple[str, int] | None = None


class Opening(enum.Enum):
    """What a connection's first bytes are."""

    HEADER = "header"  # a PROXY header (v1 or v2)
    UNDECIDED = "undecided"  # too few bytes to tell (b"PR" may be HTTP/2's "PRI")
    OTHER = "other"  # a client's own first bytes: TLS, HTTP/2


def opening(data: bytes) -> Opening:
    if data.startswith(V1_PREFIX) or data.startswith(V2_SIGNATURE):
        return Opening.HEADER
    if V1_PREFIX.startswith(data) or V2_SIGNATURE.startswith(data):
        return Opening.UNDECIDED
    return Opening.OTHER


def parse(data: bytes) -> ProxyHeader | None:
    """The header at the start of ``data`` (whose ``opening`` is HEADER); None while more
    bytes are needed. Raises ProxyHeaderError for one that does not parse."""
    if data.startswith(V2_SIGNATURE):
        return _parse_v2(data) if len(data) >= _V2_FIXED else None
    return _parse_v1(data)


def _parse_v1(data: bytes) -> ProxyHeader | None:
    end = data.find(b"\r\n", 0, V1_MAX_LENGTH)
    if end < 0:
        if len(data) >= V1_MAX_LENGTH:
            raise ProxyHeaderError(f"a v1 header has no CRLF within {V1_MAX_LENGTH} bytes")
        return None
    try:
        fields = data[:end].decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise ProxyHeaderError("a v1 header that is not ASCII") from None
    if fields[0] != "PROXY" or len(fields) < 2:
        raise ProxyHeaderError("not a v1 header")
    if fields[1] == "UNKNOWN":
        return ProxyHeader(end + 2)
    if fields[1] not in ("TCP4", "TCP6") or len(fields) != 6:
        raise ProxyHeaderError(f"a v1 header of {fields[1]!r} with {len(fields)} fields")
    version = 4 if fields[1] == "TCP4" else 6
    source = _address(fields[2], version)
    _address(fields[3], version)
    sport, _ = _port(fields[4]), _port(fields[5])
    return ProxyHeader(end + 2, (source, sport))


def _address(text: str, version: int) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyHeaderError(f"{text!r} is not an IP address") from None
    if address.version != version:
        raise ProxyHeaderError(f"{text!r} is not an IPv{version} address")
    return str(address)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535 or (len(text) > 1 and text[0] == "0"):
        raise ProxyHeaderError(f"{text!r} is not a port")
    return int(text)


def _parse_v2(data: bytes) -> ProxyHeader | None:
    version_command, family, length = struct.unpack_from("!BBH", data, 12)
    if version_command >> 4 != 2:
        raise ProxyHeaderError(f"a v2 header of version {version_command >> 4}")
    command = version_command & 0x0F
    if command > 1:
        raise ProxyHeaderError(f"a v2 header with command {command}")
    total = _V2_FIXED + length
    if len(data) < total:
        return None
    if command == 0:  # LOCAL: the balancer's own connection (a health check)
        return ProxyHeader(total)
    block = _V2_IP_BLOCKS.get(family)
    if block is None:
        if family == 0x00 or family in _V2_UNIX:
            if family in _V2_UNIX and length < _V2_UNIX_BLOCK:
                raise ProxyHeaderError("a v2 header too short for its UNIX addresses")
            return ProxyHeader(total)
        raise ProxyHeaderError(f"a v2 header of family 0x{family:02x}")
    if length < block:
        raise ProxyHeaderError(f"a v2 header of {length} bytes, short of its addresses")
    _check_tlvs(data[_V2_FIXED + block : total])
    body = data[_V2_FIXED : _V2_FIXED + block]
    if block == 12:
        source = str(ipaddress.IPv4Address(body[0:4]))
        (port,) = struct.unpack_from("!H", body, 8)
    else:
        source = str(ipaddress.IPv6Address(body[0:16]))
        (port,) = struct.unpack_from("!H", body, 32)
    return ProxyHeader(total, (source, port))


def _check_tlvs(tlvs: bytes) -> None:
    """Each TLV (type, 16-bit length, value) ends within the header."""
    at = 0
    while at < len(tlvs):
        if at + 3 > len(tlvs):
            raise ProxyHeaderError("a v2 header with a TLV cut short")
        (size,) = struct.unpack_from("!H", tlvs, at + 1)
        at += 3 + size
        if at > len(tlvs):
            raise ProxyHeaderError("a v2 header with a TLV longer than the header")
