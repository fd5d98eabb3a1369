"""The PROXY protocol header a load balancer writes first: v1 and v2, complete, cut short
and malformed (proxy/security/proxy_protocol.py)."""

from __future__ import annotations

import struct

import pytest

from proxy.security.proxy_protocol import (
    V2_SIGNATURE,
    Opening,
    ProxyHeader,
    ProxyHeaderError,
    opening,
    parse,
)

V1 = b"PROXY TCP4 203.0.113.7 10.0.0.1 4567 8081\r\n"


def v2(command: int = 1, family: int = 0x11, body: bytes | None = None) -> bytes:
    if body is None:
        body = bytes([203, 0, 113, 7, 10, 0, 0, 1]) + struct.pack("!HH", 4567, 8081)
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(body)) + body


def test_a_v1_header_names_the_client():
    assert parse(V1 + b"PRI * HTTP/2.0") == ProxyHeader(len(V1), ("203.0.113.7", 4567))
    six = b"PROXY TCP6 2001:db8::7 2001:db8::1 4567 8081\r\n"
    assert parse(six) == ProxyHeader(len(six), ("2001:db8::7", 4567))
    assert parse(b"PROXY UNKNOWN\r\n") == ProxyHeader(15)


def test_a_v2_header_names_the_client_and_its_tlvs_are_skipped():
    tlv = bytes([0x04]) + struct.pack("!H", 3) + b"abc"
    header = v2(body=bytes([203, 0, 113, 7, 10, 0, 0, 1]) + struct.pack("!HH", 4567, 8081) + tlv)
    assert parse(header + b"\x16\x03") == ProxyHeader(len(header), ("203.0.113.7", 4567))
    six = bytes(15) + b"\x07" + bytes(15) + b"\x01" + struct.pack("!HH", 4567, 8081)
    assert parse(v2(family=0x21, body=six)) == ProxyHeader(52, ("::7", 4567))
    assert parse(v2(command=0, family=0x00, body=b"")) == ProxyHeader(16)  # LOCAL


def test_a_header_cut_short_needs_more_bytes():
    assert parse(V1[:20]) is None
    assert parse(v2()[:20]) is None
    assert parse(V2_SIGNATURE + b"\x21") is None


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"PR", Opening.UNDECIDED),  # HTTP/2's preface begins "PRI"
        (b"PRI * HTTP/2.0\r\n", Opening.OTHER),
        (b"\x16\x03\x01", Opening.OTHER),  # TLS
        (b"\r\n\r\n", Opening.UNDECIDED),
        (V1, Opening.HEADER),
        (v2(), Opening.HEADER),
    ],
)
def test_the_opening_bytes_tell_a_header_from_a_client(data, kind):
    assert opening(data) is kind


@pytest.mark.parametrize(
    "data",
    [
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4567\r\n",  # a field missing
        b"PROXY TCP4 2001:db8::7 10.0.0.1 4567 8081\r\n",  # not IPv4
        b"PROXY TCP4 203.0.113.7 10.0.0.1 99999 8081\r\n",  # not a port
        b"PROXY UDP4 203.0.113.7 10.0.0.1 4567 8081\r\n",
        b"PROXY TCP4 " + b"1" * 120,  # no CRLF within 107 bytes
        v2(command=2),
        V2_SIGNATURE + bytes([0x11, 0x11, 0, 0]),  # version 1
        v2(family=0x11, body=b"\x00" * 4),  # too short for its addresses
        v2(body=bytes(12) + bytes([0x04, 0, 9])),  # a TLV past the header
    ],
)
def test_a_malformed_header_is_refused(data):
    with pytest.raises(ProxyHeaderError):
        parse(data)
