"""Message encodings of the remoting protocol.

- the properties string: ``name \\x01 value \\x02`` repeated;
- the stored-message record that pull and pop responses carry, records back to back;
- the batch body a producer sends (``MessageDecoder.encodeMessages`` in RocketMQ);
- offset message ids and client unique ids.

Layouts follow RocketMQ's ``MessageDecoder``. All integers are big-endian.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import struct
import time
import zlib
from dataclasses import dataclass, field

from proxy.remoting.command import RemotingProtocolError


class Prop:
    """Property keys (RocketMQ's ``MessageConst``)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_KEY"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    POP_CK = "POP_CK"
    FIRST_POP_TIME = "1ST_POP_TIME"
    MSG_REGION = "MSG_REGION"
    TRACE_ON = "TRACE_ON"
    # A message's trace context (the v2 API's ``trace_context``, e.g. a W3C traceparent).
    TRACE_CONTEXT = "TRACE_CONTEXT"
    # The producer's address as its client gave it (or the proxy saw it): the broker's own
    # born host of a message sent through a proxy is the proxy.
    BORN_HOST = "__BORNHOST"
    # Where a dead-lettered message came from (set by the broker that moved it).
    DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
    DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
    SHARDING_KEY = "__SHARDINGKEY"
    CLUSTER = "CLUSTER"
    PRODUCER_GROUP = "PGROUP"
    START_DELIVER_TIME = "__STARTDELIVERTIME"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    TRANSACTION_PREPARED = "TRAN_MSG"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    TIMER_OUT_MS = "TIMER_OUT_MS"
    TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
    LITE_TOPIC = "__LITE_TOPIC"  # the lite topic of a message to a LITE parent (5.5)
    # A priority message's priority (5.4, RIP-80); the broker stores it in queue
    # min(priority, writeQueueNums - 1) of a PRIORITY topic.
    PRIORITY = "_SYS_MSG_PRIORITY_"
    # The extra queues a message is indexed in (",": several), and its offset in each: a lite
    # message's lite queue (%LMQ%$<parent>$<lite>) and its offset there.
    INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
    INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"


NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

MAGIC_V1 = -626843481  # 0xDAA320A7: topic length in one byte
MAGIC_V2 = -626843477  # 0xDAA320AB: topic length in two bytes

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20


def encode_properties(properties: dict[str, str]) -> str:
    """``name\\x01value\\x02`` for each pair with a value, trailing separator included."""
    return "".join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
        for name, value in properties.items()
        if value is not None
    )


def decode_properties(text: str | None) -> dict[str, str]:
    """Parse a properties string; pairs with an empty name or value are dropped, as Java does."""
    properties: dict[str, str] = {}
    if not text:
        return properties
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            properties[name] = value
    return properties


Host = tuple[str, int]


def _pack_host(host: Host) -> bytes:
    return ipaddress.ip_address(host[0]).packed + struct.pack(">i", host[1])


@dataclass(slots=True)
class MessageExt:
    """A message as a broker stores and delivers it."""

    topic: str
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: Host = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(Prop.KEYS)
        return raw.split(" ") if raw else []

    @property
    def offset_msg_id(self) -> str:
        return offset_message_id(self.store_host, self.commit_log_offset)

    @property
    def msg_id(self) -> str:
        """The client's unique id when present, else the offset id (as ``MessageClientExt``)."""
        return self.properties.get(Prop.UNIQ_KEY) or self.offset_msg_id


_RECORD_HEAD = struct.Struct(">iiiiiqqiq")  # size .. born timestamp
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")


def encode_message(msg: MessageExt) -> bytes:
    """The stored record of ``msg``; ``body_crc`` is computed from the body as stored."""
    topic = msg.topic.encode()
    props = encode_properties(msg.properties).encode()
    if len(props) > 32767:
        raise ValueError(f"properties of {len(props)} bytes exceed a short length")
    magic = MAGIC_V1 if len(topic) <= 127 else MAGIC_V2
    sys_flag = msg.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    born_host = _pack_host(msg.born_host)
    store_host = _pack_host(msg.store_host)
    if len(born_host) == 20:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if len(store_host) == 20:
        sys_flag |= SYSFLAG_STOREHOST_V6
    msg.body_crc = zlib.crc32(msg.body) & 0x7FFFFFFF
    topic_len = bytes((len(topic),)) if magic == MAGIC_V1 else _SHORT.pack(len(topic))
    tail = b"".join(
        (
            born_host,
            _LONG.pack(msg.store_timestamp),
            store_host,
            _INT.pack(msg.reconsume_times),
            _LONG.pack(msg.prepared_transaction_offset),
            _INT.pack(len(msg.body)),
            msg.body,
            topic_len,
            topic,
            _SHORT.pack(len(props)),
            props,
        )
    )
    total = _RECORD_HEAD.size + len(tail)
    head = _RECORD_HEAD.pack(
        total,
        magic,
        msg.body_crc,
        msg.queue_id,
        msg.flag,
        msg.queue_offset,
        msg.commit_log_offset,
        sys_flag,
        msg.born_timestamp,
    )
    return head + tail


def decode_messages(data: bytes) -> list[MessageExt]:
    """Decode records written back to back, as a pop or pull response body holds them."""
    messages = []
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        msg, size = _decode_one(view, pos)
        messages.append(msg)
        pos += size
    return messages


def count_messages(data: bytes) -> int:
    """How many records a pop or pull response body holds, read from their sizes alone
    (a record opens with its total size); a size that does not fit ends the count."""
    count = pos = 0
    while pos + 4 <= len(data):
        size = _INT.unpack_from(data, pos)[0]
        if size <= 0 or pos + size > len(data):
            break
        count += 1
        pos += size
    return count


def _decode_one(view: memoryview, start: int) -> tuple[MessageExt, int]:
    try:
        (total, magic, body_crc, queue_id, flag, queue_offset, phys_offset, sys_flag, born_ts) = (
            _RECORD_HEAD.unpack_from(view, start)
        )
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise RemotingProtocolError(f"unknown message magic code {magic:#x}")
        if total < _RECORD_HEAD.size or start + total > len(view):
            raise RemotingProtocolError(f"message record of {total} bytes runs past the body")
        pos = start + _RECORD_HEAD.size
        born_host, pos = _unpack_host(view, pos, sys_flag & SYSFLAG_BORNHOST_V6)
        (store_ts,) = _LONG.unpack_from(view, pos)
        store_host, pos = _unpack_host(view, pos + 8, sys_flag & SYSFLAG_STOREHOST_V6)
        (reconsume,) = _INT.unpack_from(view, pos)
        (prepared,) = _LONG.unpack_from(view, pos + 4)
        (body_len,) = _INT.unpack_from(view, pos + 12)
        pos += 16
        body = bytes(view[pos : pos + body_len])
        pos += body_len
        topic_len, pos = _topic_length(view, pos, magic)
        topic = bytes(view[pos : pos + topic_len]).decode()
        pos += topic_len
        (props_len,) = _SHORT.unpack_from(view, pos)
        pos += 2
        props = decode_properties(bytes(view[pos : pos + props_len]).decode())
        if pos + props_len != start + total:
            raise RemotingProtocolError("message record fields do not add up to its size")
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise RemotingProtocolError(f"truncated message record: {exc}") from None
    msg = MessageExt(
        topic=topic,
        body=body,
        properties=props,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        commit_log_offset=phys_offset,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body_crc=body_crc,
    )
    return msg, total


@functools.lru_cache(maxsize=4096)
def _ip_text(packed: bytes) -> str:
    # A pop decodes two hosts per message and there are few distinct ones: cache them.
    return str(ipaddress.ip_address(packed))


def record_properties(record: bytes) -> dict[str, str]:
    """The properties of one record, read without decoding (or copying) its body: what a
    broker reads of a commit-log entry to apply a SQL92 filter (the broker stub's pops)."""
    view = memoryview(record)
    _, magic, _, _, _, _, _, sys_flag, _ = _RECORD_HEAD.unpack_from(view)
    pos = _RECORD_HEAD.size + _host_size(sys_flag & SYSFLAG_BORNHOST_V6) + 8
    pos += _host_size(sys_flag & SYSFLAG_STOREHOST_V6) + 12  # reconsume times, prepared
    (body_len,) = _INT.unpack_from(view, pos)
    pos += 4 + body_len
    topic_len, pos = _topic_length(view, pos, magic)
    pos += topic_len
    (props_len,) = _SHORT.unpack_from(view, pos)
    pos += 2
    return decode_properties(bytes(view[pos : pos + props_len]).decode())


def _topic_length(view: memoryview, pos: int, magic: int) -> tuple[int, int]:
    """A record's topic length at ``pos``: one byte in a V1 record, two in a V2 one; and
    where the topic starts."""
    if magic == MAGIC_V1:
        return view[pos], pos + 1
    (length,) = _SHORT.unpack_from(view, pos)
    return length, pos + 2


def _host_size(v6: int) -> int:
    """A host's bytes in a record: its address and its port."""
    return (16 if v6 else 4) + 4


def _unpack_host(view: memoryview, pos: int, v6: int) -> tuple[Host, int]:
    size = 16 if v6 else 4
    ip = _ip_text(bytes(view[pos : pos + size]))
    (port,) = _INT.unpack_from(view, pos + size)
    return (ip, port), pos + size + 4


# -- batch bodies ---------------------------------------------------------------------------

_BATCH_HEAD = struct.Struct(">iiiii")  # total size, magic, body crc, flag, body length


@dataclass(slots=True)
class BatchEntry:
    """One message of a producer's batch body."""

    body: bytes
    properties: dict[str, str]
    flag: int = 0


def encode_batch(entries: list[BatchEntry]) -> bytes:
    """Concatenated records as ``MessageDecoder.encodeMessages`` writes them."""
    out = bytearray()
    for entry in entries:
        props = encode_properties(entry.properties).encode()
        total = _BATCH_HEAD.size + len(entry.body) + 2 + len(props)
        out += _BATCH_HEAD.pack(total, 0, 0, entry.flag, len(entry.body))
        out += entry.body + _SHORT.pack(len(props)) + props
    return bytes(out)


def decode_batch(data: bytes) -> list[BatchEntry]:
    entries = []
    pos = 0
    try:
        while pos < len(data):
            total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
            body_start = pos + _BATCH_HEAD.size
            body = data[body_start : body_start + body_len]
            (props_len,) = _SHORT.unpack_from(data, body_start + body_len)
            props_start = body_start + body_len + 2
            props = data[props_start : props_start + props_len].decode()
            if total != _BATCH_HEAD.size + body_len + 2 + props_len or total <= 0:
                raise RemotingProtocolError("batch record size does not match its fields")
            entries.append(BatchEntry(body=body, properties=decode_properties(props), flag=flag))
            pos += total
    except (struct.error, UnicodeDecodeError) as exc:
        raise RemotingProtocolError(f"truncated batch body: {exc}") from None
    if pos != len(data):
        raise RemotingProtocolError("batch body ends inside a record")
    return entries


# -- message ids ----------------------------------------------------------------------------


def offset_message_id(store_host: Host, commit_log_offset: int) -> str:
    """Upper-case hex of store IP, port (int32) and commit-log offset (int64)."""
    return (_pack_host(store_host) + _LONG.pack(commit_log_offset)).hex().upper()


class UniqueIdGenerator:
    """Client unique ids (UNIQ_KEY) in RocketMQ's layout.

    IP, pid (short), a per-process hash (int), then milliseconds since the start of the
    current month (int) and a counter (short).
    """

    def __init__(self, ip: str = "127.0.0.1") -> None:
        self._prefix = (
            ipaddress.ip_address(ip).packed
            + struct.pack(">H", os.getpid() & 0xFFFF)
            + struct.pack(">I", id(self) & 0xFFFFFFFF)
        )
        self._counter = itertools.count()
        self._month_start_ms = 0
        self._next_month_ms = 0

    def next_id(self) -> str:
        now_ms = int(time.time() * 1000)
        if now_ms >= self._next_month_ms:
            self._month_start_ms, self._next_month_ms = _month_bounds_ms(now_ms)
        elapsed = (now_ms - self._month_start_ms) & 0xFFFFFFFF
        suffix = struct.pack(">IH", elapsed, next(self._counter) & 0xFFFF)
        return (self._prefix + suffix).hex().upper()


def _month_bounds_ms(now_ms: int) -> tuple[int, int]:
    now = time.localtime(now_ms / 1000)
    start = time.mktime((now.tm_year, now.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    year, month = (now.tm_year + 1, 1) if now.tm_mon == 12 else (now.tm_year, now.tm_mon + 1)
    end = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
    return int(start * 1000), int(end * 1000)
