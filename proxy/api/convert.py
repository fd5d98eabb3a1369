"""Between the broker's messages and the gRPC API's ``Message``."""

from __future__ import annotations

import gzip
import hashlib
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from proxy.api.errors import ApiError, Code
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.validation import RESERVED_PROPERTIES
from proxy.receive.types import PolledMessage
from proxy.remoting.message import SYSFLAG_COMPRESSED, Prop


def timestamp(ms: int) -> Timestamp:
    ts = Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def duration(ms: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(ms)
    return d


def md5_hex(body: bytes) -> str:
    return hashlib.md5(body).hexdigest().upper()


def _host(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


def _message_type(props: dict[str, str]) -> int:
    if Prop.SHARDING_KEY in props:
        return pb.MessageType.FIFO
    if Prop.TIMER_DELIVER_MS in props or Prop.DELAY in props or Prop.START_DELIVER_TIME in props:
        return pb.MessageType.DELAY
    return pb.MessageType.NORMAL


def to_api_message(polled: PolledMessage, namespace: str = "") -> pb.Message:
    """A popped message as the client receives it, its receipt handle included."""
    msg = polled.message
    props = msg.properties
    body = msg.body
    if msg.sys_flag & SYSFLAG_COMPRESSED:
        body = zlib.decompress(body)  # producers compress with zlib; clients get it plain
    system = pb.SystemProperties(
        keys=msg.keys,
        message_id=msg.msg_id,
        body_digest=pb.Digest(type=pb.DigestType.MD5, checksum=md5_hex(body)),
        body_encoding=pb.Encoding.IDENTITY,
        message_type=_message_type(props),
        born_timestamp=timestamp(msg.born_timestamp),
        born_host=_host(msg.born_host),
        store_timestamp=timestamp(msg.store_timestamp),
        store_host=_host(msg.store_host),
        receipt_handle=polled.receipt_handle,
        queue_id=msg.queue_id,
        queue_offset=msg.queue_offset,
        invisible_duration=duration(int(props[Prop.POP_CK].split(" ")[2])),
        delivery_attempt=msg.reconsume_times + 1,
    )
    if msg.tags:
        system.tag = msg.tags
    if Prop.SHARDING_KEY in props:
        system.message_group = props[Prop.SHARDING_KEY]
    if Prop.TIMER_DELIVER_MS in props:
        system.delivery_timestamp.CopyFrom(timestamp(int(props[Prop.TIMER_DELIVER_MS])))
    user = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES}
    return pb.Message(
        topic=pb.Resource(name=msg.topic, resource_namespace=namespace),
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
