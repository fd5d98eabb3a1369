"""Remoting commands and their frames.

A frame on the wire is::

    int32 length            # bytes after this field: 4 + header + body
    int32 type_and_header   # (serialize_type << 24) | header_length
    header                  # JSON (type 0) or the binary ROCKETMQ layout (type 1)
    body                    # the rest; no length of its own

We decode both header types and always answer in JSON, as the reference advises: the C++
client reads the second word as a plain length. All integers are big-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.remoting.codes import (
    CURRENT_VERSION,
    DEFAULT_MAX_FRAME,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    LanguageCode,
)

_LANGUAGE_BY_NAME = {lang.name: int(lang) for lang in LanguageCode}
_LANGUAGE_NAMES = {int(lang): lang.name for lang in LanguageCode}
_SERIALIZE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}
_INT = struct.Struct(">i")
_TWO_INTS = struct.Struct(">iI")


class RemotingProtocolError(Exception):
    """The bytes on a connection do not form a valid frame; the connection must close."""


@dataclass(slots=True)
class RemotingCommand:
    """One request or response. ``ext_fields`` holds the custom header, all values strings."""

    code: int
    ext_fields: dict[str, str] | None = None
    body: bytes = b""
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    language: int = LanguageCode.PYTHON
    version: int = CURRENT_VERSION
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @property
    def fields(self) -> dict[str, str]:
        """The custom header; empty when the command carries none."""
        if self.ext_fields is None:
            self.ext_fields = {}
        return self.ext_fields

    def make_response(
        self,
        code: int,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
        remark: str | None = None,
    ) -> RemotingCommand:
        """A response to this request: same opaque, the response flag set."""
        return RemotingCommand(
            code=code,
            ext_fields=ext_fields,
            body=body,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
        )


def encode(cmd: RemotingCommand) -> bytes:
    """The whole frame of ``cmd``, length prefix included, with a JSON header."""
    # Keys in alphabetical order and nulls left out, as fastjson writes them.
    header: dict[str, Any] = {"code": cmd.code}
    if cmd.ext_fields:
        header["extFields"] = cmd.ext_fields
    header["flag"] = cmd.flag
    header["language"] = _LANGUAGE_NAMES.get(cmd.language, "OTHER")
    header["opaque"] = cmd.opaque
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["serializeTypeCurrentRPC"] = "JSON"
    header["version"] = cmd.version
    header_bytes = orjson.dumps(header)
    body = cmd.body
    prefix = _TWO_INTS.pack(4 + len(header_bytes) + len(body), len(header_bytes))
    return b"".join((prefix, header_bytes, body)) if body else prefix + header_bytes


def decode(frame: bytes | memoryview) -> RemotingCommand:
    """Decode one frame given without its leading length field."""
    if len(frame) < 4:
        raise RemotingProtocolError(f"frame of {len(frame)} bytes is shorter than its header")
    word = _INT.unpack_from(frame, 0)[0] & 0xFFFFFFFF
    serialize_type = word >> 24
    header_len = word & 0xFFFFFF
    if 4 + header_len > len(frame):
        raise RemotingProtocolError(
            f"header length {header_len} exceeds the frame ({len(frame) - 4} bytes)"
        )
    header = bytes(frame[4 : 4 + header_len])
    body = bytes(frame[4 + header_len :])
    if serialize_type == SERIALIZE_JSON:
        cmd = _decode_json_header(header)
    elif serialize_type == SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(header)
    else:
        raise RemotingProtocolError(f"unknown serialize type {serialize_type}")
    cmd.body = body
    cmd.serialize_type = serialize_type
    return cmd


def _decode_json_header(header: bytes) -> RemotingCommand:
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise RemotingProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RemotingProtocolError("header is not a JSON object")
    try:
        return RemotingCommand(
            code=int(obj.get("code", 0)),
            ext_fields=_string_fields(obj.get("extFields")),
            opaque=int(obj.get("opaque", 0)),
            flag=int(obj.get("flag", 0)),
            remark=obj.get("remark"),
            language=_language(obj.get("language", 0)),
            version=int(obj.get("version", 0)),
        )
    except (TypeError, ValueError) as exc:
        raise RemotingProtocolError(f"bad header field: {exc}") from None


def _string_fields(raw: Any) -> dict[str, str] | None:
    """extFields as strings: C++ clients send some numbers as JSON numbers."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RemotingProtocolError("extFields is not a JSON object")
    fields: dict[str, str] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if isinstance(value, bool):
            fields[key] = "true" if value else "false"
        elif isinstance(value, str):
            fields[key] = value
        else:
            fields[key] = str(value)
    return fields


def _language(raw: Any) -> int:
    if isinstance(raw, str):
        return _LANGUAGE_BY_NAME.get(raw, LanguageCode.OTHER)
    return int(raw)


# -- the binary ROCKETMQ header ------------------------------------------------------------

_BINARY_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag


def _decode_binary_header(header: bytes) -> RemotingCommand:
    try:
        code, language, version, opaque, flag = _BINARY_FIXED.unpack_from(header, 0)
        pos = _BINARY_FIXED.size
        remark_len = _INT.unpack_from(header, pos)[0]
        pos += 4
        remark = header[pos : pos + remark_len].decode() if remark_len > 0 else None
        pos += max(remark_len, 0)
        fields_len = _INT.unpack_from(header, pos)[0]
        pos += 4
        ext_fields = _decode_binary_fields(header[pos : pos + fields_len]) if fields_len else None
        if pos + max(fields_len, 0) > len(header):
            raise RemotingProtocolError("extFields run past the header")
    except (struct.error, UnicodeDecodeError) as exc:
        raise RemotingProtocolError(f"bad binary header: {exc}") from None
    return RemotingCommand(
        code=code,
        ext_fields=ext_fields,
        opaque=opaque,
        flag=flag,
        remark=remark,
        language=language,
        version=version,
        serialize_type=SERIALIZE_ROCKETMQ,
    )


def _decode_binary_fields(data: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        (key_len,) = struct.unpack_from(">h", data, pos)
        pos += 2
        key = data[pos : pos + key_len].decode()
        pos += key_len
        (value_len,) = _INT.unpack_from(data, pos)
        pos += 4
        value = data[pos : pos + value_len].decode()
        pos += value_len
        if pos > len(data):
            raise RemotingProtocolError("extFields entry runs past its table")
        fields[key] = value
    return fields


def encode_binary(cmd: RemotingCommand) -> bytes:
    """The whole frame with a ROCKETMQ binary header (for peers that ask for it, and tests).

    The code travels as a signed short, so codes above 32767 (the POP family) cannot.
    """
    if not -32768 <= cmd.code <= 32767:
        raise ValueError(f"code {cmd.code} does not fit the binary header's short")
    remark = cmd.remark.encode() if cmd.remark else b""
    table = bytearray()
    for key, value in (cmd.ext_fields or {}).items():
        key_bytes, value_bytes = key.encode(), value.encode()
        table += struct.pack(">h", len(key_bytes)) + key_bytes
        table += _INT.pack(len(value_bytes)) + value_bytes
    header = (
        _BINARY_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag)
        + _INT.pack(len(remark))
        + remark
        + _INT.pack(len(table))
        + bytes(table)
    )
    word = (SERIALIZE_ROCKETMQ << 24) | len(header)
    return _TWO_INTS.pack(4 + len(header) + len(cmd.body), word) + header + cmd.body


class FrameDecoder:
    """Splits a byte stream into frames; raises on a frame that is too large or too small."""

    __slots__ = ("_buffer", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._buffer = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[RemotingCommand]:
        """Add received bytes; return the commands now complete, in order."""
        buffer = self._buffer
        buffer += data
        commands: list[RemotingCommand] = []
        pos = 0
        end = len(buffer)
        view = memoryview(buffer)
        try:
            while end - pos >= 4:
                length = _INT.unpack_from(buffer, pos)[0]
                if length < 4 or length > self.max_frame:
                    raise RemotingProtocolError(
                        f"frame length {length} outside 4..{self.max_frame}"
                    )
                if end - pos - 4 < length:
                    break
                commands.append(decode(view[pos + 4 : pos + 4 + length]))
                pos += 4 + length
        finally:
            view.release()
        if pos:
            del buffer[:pos]
        return commands
