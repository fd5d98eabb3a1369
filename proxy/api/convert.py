"""Between the broker's messages and the gRPC API's ``Message``."""

from __future__ import annotations

import gzip
import hashlib
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from proxy.api.errors import ApiError, Code
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.validation import RESERVED_PROPERTIES, SYSTEM_GROUP_PREFIX, is_system_topic
from proxy.receive.types import PolledMessage
from proxy.remoting.message import SYSFLAG_COMPRESSED, MessageExt, Prop
from proxy.remoting.popinfo import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX

# Messages are built from plain values on the hot path: protobuf's FromMilliseconds is
# pure Python, and each attribute lookup of a generated enum value goes through a Python
# __getattr__. Sub-messages given as dicts are cheaper than built ones, which get copied.
_MD5 = pb.DigestType.MD5
_IDENTITY = pb.Encoding.IDENTITY
_NORMAL, _FIFO, _DELAY = pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY
_PRIORITY = pb.MessageType.PRIORITY


def _time_fields(ms: int) -> dict[str, int]:
    """A Timestamp's fields for epoch milliseconds ``ms``."""
    seconds, millis = divmod(ms, 1000)
    return {"seconds": seconds, "nanos": millis * 1_000_000}


def _duration_fields(ms: int) -> dict[str, int]:
    """A Duration's fields: its nanos carry the sign of its seconds."""
    seconds = int(ms / 1000)
    return {"seconds": seconds, "nanos": (ms - seconds * 1000) * 1_000_000}


def timestamp(ms: int) -> Timestamp:
    return Timestamp(**_time_fields(ms))


def duration(ms: int) -> Duration:
    return Duration(**_duration_fields(ms))


def md5_hex(body: bytes) -> str:
    return hashlib.md5(body).hexdigest().upper()


def _host(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


def _message_type(props: dict[str, str]) -> int:
    if Prop.LITE_TOPIC in props:
        return pb.MessageType.LITE
    if Prop.SHARDING_KEY in props:
        return _FIFO
    if Prop.TIMER_DELIVER_MS in props or Prop.DELAY in props or Prop.START_DELIVER_TIME in props:
        return _DELAY
    if Prop.PRIORITY in props:
        return _PRIORITY
    return _NORMAL


def _priority(props: dict[str, str]) -> int | None:
    """The message's priority if it has one (the Apache proxy reports it when it is 0 or
    more, as Message.getPriority parses it)."""
    value = props.get(Prop.PRIORITY)
    if value is None:
        return None
    try:
        priority = int(value)
    except ValueError:
        return None
    return priority if priority >= 0 else None


def topic_resource(topic: str) -> dict[str, str]:
    """A stored topic as the clients' Resource: a topic stored as ``<namespace>%<name>``
    (``%RETRY%<namespace>%<group>``) is that name in that namespace, as the Apache proxy
    5.5.0 splits it; system topics and names without such a ``%`` have no namespace. Only
    answers are split: requests' names reach the brokers as sent, namespace or not."""
    if not topic or is_system_topic(topic) or topic.startswith(SYSTEM_GROUP_PREFIX):
        return {"name": topic, "resource_namespace": ""}
    prefix = next((p for p in _RETRY_AND_DLQ if topic.startswith(p)), "")
    rest = topic[len(prefix) :]
    cut = rest.find("%")
    if cut <= 0:
        return {"name": topic, "resource_namespace": ""}
    return {"name": prefix + rest[cut + 1 :], "resource_namespace": rest[:cut]}


_RETRY_AND_DLQ = (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)


def to_api_message(polled: PolledMessage, renewer: str = "") -> pb.Message:
    """A popped message as the client receives it, its receipt handle included; with the
    fleet address of the proxy that renews it, if one does (``handles.py``)."""
    msg = polled.message
    props = msg.properties
    body = msg.body
    if msg.sys_flag & SYSFLAG_COMPRESSED:
        body = zlib.decompress(body)  # producers compress with zlib; clients get it plain
    system = {
        "keys": msg.keys,
        "message_id": msg.msg_id,
        "body_digest": {"type": _MD5, "checksum": md5_hex(body)},
        "body_encoding": _IDENTITY,
        "message_type": _message_type(props),
        "born_timestamp": _time_fields(msg.born_timestamp),
        "born_host": props.get(Prop.BORN_HOST) or msg.born_host[0],
        "store_timestamp": _time_fields(msg.store_timestamp),
        "store_host": _host(msg.store_host),
        "receipt_handle": f"{polled.receipt_handle} {renewer}"
        if renewer
        else polled.receipt_handle,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "invisible_duration": _duration_fields(int(props[Prop.POP_CK].split(" ")[2])),
        "delivery_attempt": msg.reconsume_times + 1,
    }
    tag = msg.tags
    if tag:
        system["tag"] = tag
    if Prop.SHARDING_KEY in props:
        system["message_group"] = props[Prop.SHARDING_KEY]
    if Prop.LITE_TOPIC in props:  # lite consumers ack with it
        system["lite_topic"] = props[Prop.LITE_TOPIC]
    if Prop.TIMER_DELIVER_MS in props:
        system["delivery_timestamp"] = _time_fields(int(props[Prop.TIMER_DELIVER_MS]))
    priority = _priority(props)
    if priority is not None:
        system["priority"] = priority
    if Prop.TRACE_CONTEXT in props:
        system["trace_context"] = props[Prop.TRACE_CONTEXT]
    origin_topic = props.get(Prop.DLQ_ORIGIN_TOPIC)
    origin_id = props.get(Prop.DLQ_ORIGIN_MESSAGE_ID)
    if origin_topic is not None and origin_id is not None:  # read from a %DLQ% topic
        system["dead_letter_queue"] = {"topic": origin_topic, "message_id": origin_id}
    user = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES}
    return pb.Message(
        topic=topic_resource(msg.topic),
        user_properties=user,
        system_properties=system,
        body=body,
    )


def decoded_body(message: pb.Message) -> bytes:
    """The body as sent, decompressed, checked against its digest (MESSAGE_CORRUPTED)."""
    system = message.system_properties
    body = message.body
    if system.body_encoding == pb.Encoding.GZIP:
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError) as exc:
            raise ApiError(Code.MESSAGE_CORRUPTED, f"body is not valid gzip: {exc}") from None
    digest = system.body_digest
    # Clients differ in whether the digest covers the sent or the decoded bytes: accept both.
    if digest.checksum and not (
        _digest_matches(message.body, digest) or _digest_matches(body, digest)
    ):
        raise ApiError(Code.MESSAGE_CORRUPTED, "body does not match its digest")
    return body


def _digest_matches(data: bytes, digest: pb.Digest) -> bool:
    checksum = digest.checksum.strip().lower()
    if digest.type == pb.DigestType.CRC32:
        try:
            return int(checksum, 16) == zlib.crc32(data)
        except ValueError:
            return False
    if digest.type == pb.DigestType.MD5:
        return hashlib.md5(data).hexdigest() == checksum
    if digest.type == pb.DigestType.SHA1:
        return hashlib.sha1(data).hexdigest() == checksum
    return True  # an unknown digest type cannot be checked


def half_message_to_api(msg: MessageExt) -> pb.Message:
    """A half message a broker asks about, as a producer's transaction checker gets it."""
    body = msg.body
    if msg.sys_flag & SYSFLAG_COMPRESSED:
        body = zlib.decompress(body)
    props = msg.properties
    system: dict[str, object] = {
        "keys": msg.keys,
        "message_id": msg.msg_id,
        "body_digest": {"type": _MD5, "checksum": md5_hex(body)},
        "body_encoding": _IDENTITY,
        "message_type": pb.MessageType.TRANSACTION,
        "born_timestamp": _time_fields(msg.born_timestamp),
        "born_host": props.get(Prop.BORN_HOST) or msg.born_host[0],
        "store_timestamp": _time_fields(msg.store_timestamp),
        "store_host": _host(msg.store_host),
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
    }
    if msg.tags:
        system["tag"] = msg.tags
    user = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES}
    topic = props.get(Prop.REAL_TOPIC, msg.topic)
    return pb.Message(
        topic=topic_resource(topic),
        user_properties=user,
        system_properties=system,
        body=body,
    )
