"""What a broker's answers mean: the results of its calls, its errors, and a pop's messages
decoded with what a client acks them by (``BrokerClient`` makes the calls)."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from proxy.remoting.client import RemotingError
from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand, RemotingProtocolError
from proxy.remoting.headers import PopLiteMessageResponseHeader, PopMessageResponseHeader
from proxy.remoting.message import MessageExt, Prop, decode_messages
from proxy.remoting.popinfo import PopCheckpointInfo, parse_info, retry_flag


class BrokerError(RemotingError):
    """The broker answered with an error code."""

    def __init__(self, code: int, remark: str | None, request: str) -> None:
        super().__init__(f"{request}: broker answered {code} {remark or ''}".rstrip())
        self.code = code
        self.remark = remark


def refuses_filter(exc: Exception) -> TypeGuard[BrokerError]:
    """The broker could not parse the pop's filter expression: every broker would refuse it
    alike, so it is the client's answer rather than one broker's failure."""
    return isinstance(exc, BrokerError) and exc.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


class BrokerResponseError(RemotingError):
    """The broker answered something that cannot be read: a header field missing or not a
    number, a message body cut short. The request failed, as if the broker had not
    answered; the caller's client gets an error code, never an exception."""


# What decoding a broker's answer raises on bad input (HeaderError is a ValueError; so is
# UnicodeDecodeError).
_UNREADABLE = (ValueError, KeyError, IndexError, struct.error, RemotingProtocolError)


def json_object(response: RemotingCommand, what: str) -> dict[str, Any]:
    """The answer's body as a JSON object, or the RemotingError that says why it is not."""
    try:
        value = orjson.loads(response.body)
    except orjson.JSONDecodeError as exc:
        raise RemotingError(f"{what}: {exc}") from None
    if not isinstance(value, dict):
        raise RemotingError(f"{what} is not an object")
    return value


@contextlib.contextmanager
def readable(broker: str, request: str) -> Iterator[None]:
    try:
        yield
    except _UNREADABLE as exc:
        raise BrokerResponseError(f"{request}: unreadable answer from {broker}: {exc}") from None


@dataclass(slots=True)
class SendResult:
    msg_id: str  # the client unique id
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    recall_handle: str | None = None
    broker: str = ""  # the broker's name, set by whoever knows it

    @property
    def commit_log_offset(self) -> int:
        """Where the broker stored the message: the last 16 hex digits of the offset id."""
        return int(self.offset_msg_id[-16:], 16)


@dataclass(slots=True)
class PopResult:
    """What a pop found. ``found`` False means the broker had nothing (or was full)."""

    code: int
    messages: list[MessageExt] = field(default_factory=list)
    pop_time: int = 0
    invisible_time: int = 0
    revive_qid: int = 0
    rest_num: int = 0

    @property
    def found(self) -> bool:
        return bool(self.messages)

    @property
    def polling_full(self) -> bool:
        return self.code == ResponseCode.POLLING_FULL


@dataclass(slots=True)
class NotificationResult:
    has_msg: bool
    polling_full: bool = False


def lite_order_counts(info: str | None, count: int) -> list[int]:
    """Reconsume counts of a lite pop's messages from its ``orderCountInfo``: one entry per
    message joined by ``;``, each a number or ``"<retry> qo<queueId>%<offset> <n>"``; a list
    of another length counts for nothing (ExtraInfoUtil.parseLiteOrderCountInfo)."""
    entries = (info or "").split(";") if info else []
    if len(entries) != count:
        return [0] * count
    out = []
    for entry in entries:
        parts = entry.split(" ") if "qo" in entry else [entry]
        text = parts[-1] if len(parts) in (1, 3) else ""
        out.append(int(text) if text.strip().lstrip("-").isdigit() else 0)
    return out


def pop_result(response: RemotingCommand, topic: str, broker: str) -> PopResult:
    """Decode a pop's answer from ``broker``; its messages are ``topic``'s."""
    h = PopMessageResponseHeader.decode(response.ext_fields)
    result = PopResult(
        code=response.code,
        pop_time=h.pop_time,
        invisible_time=h.invisible_time,
        revive_qid=h.revive_qid,
        rest_num=h.rest_num,
    )
    if response.code == ResponseCode.SUCCESS and response.body:
        result.messages = _popped_messages(response.body, h, topic, broker)
    return result


def _popped_messages(
    body: bytes, result: PopMessageResponseHeader, topic: str, broker: str
) -> list[MessageExt]:
    """Decode the body and give each message its POP_CK, as the Java client does."""
    messages = decode_messages(body)
    # Orderly pops: how often each message was popped before (its reconsume times),
    # by "<retry>@qo<queueId>%<offset>", else by "<retry>@<queueId>" (the client's rule).
    counts = parse_info(result.order_count_info or "")
    start_info = parse_info(result.start_offset_info or "")
    msg_info = {
        key: value.split(",") for key, value in parse_info(result.msg_offset_info or "").items()
    }
    seen: dict[str, int] = {}
    for msg in messages:
        if Prop.POP_CK not in msg.properties:
            flag = retry_flag(msg.topic)
            key = f"{flag}@{msg.queue_id}"
            index = seen.get(key, 0)
            seen[key] = index + 1
            try:
                start = int(start_info[key])
                offset = int(msg_info[key][index])
            except (KeyError, IndexError, ValueError):
                raise RemotingError(f"pop response has no offset info for {key}") from None
            msg.properties[Prop.POP_CK] = PopCheckpointInfo(
                start,
                result.pop_time,
                result.invisible_time,
                result.revive_qid,
                flag,
                broker,
                msg.queue_id,
                offset,
            ).encode()
        if counts:
            flag = retry_flag(msg.topic)
            count = counts.get(f"{flag}@qo{msg.queue_id}%{msg.queue_offset}") or counts.get(
                f"{flag}@{msg.queue_id}"
            )
            if count and int(count) > 0:
                msg.reconsume_times = int(count)
        msg.properties.setdefault(Prop.FIRST_POP_TIME, str(result.pop_time))
        msg.topic = topic
    return messages


def pop_lite_result(response: RemotingCommand, topic: str, broker: str) -> PopResult:
    """Decode a lite pop; give each message the POP_CK the Java client builds
    (``processPopLiteResponse``): start offset 0, queue 0 and the message's offset in
    its lite queue, which also becomes its queue offset."""
    h = PopLiteMessageResponseHeader.decode(response.ext_fields)
    result = PopResult(
        code=response.code,
        pop_time=h.pop_time,
        invisible_time=h.invisible_time,
        revive_qid=h.revive_qid,
    )
    if response.code != ResponseCode.SUCCESS or not response.body:
        return result
    messages = decode_messages(response.body)
    counts = lite_order_counts(h.order_count_info, len(messages))
    for index, msg in enumerate(messages):
        queues = [q for q in msg.properties.get(Prop.INNER_MULTI_DISPATCH, "").split(",") if q]
        offsets = [o for o in msg.properties.get(Prop.INNER_MULTI_QUEUE_OFFSET, "").split(",") if o]
        if len(queues) != 1 or len(offsets) != 1:
            raise RemotingError(f"lite pop: message {msg.msg_id} has no single lite queue")
        lmq_offset = int(offsets[0])
        msg.properties[Prop.POP_CK] = PopCheckpointInfo(
            0,
            h.pop_time,
            h.invisible_time,
            h.revive_qid,
            retry_flag(topic),
            broker,
            0,
            lmq_offset,
        ).encode()
        msg.properties.setdefault(Prop.FIRST_POP_TIME, str(h.pop_time))
        if counts[index] > 0:
            msg.reconsume_times = counts[index]
        msg.queue_offset = lmq_offset
        msg.topic = topic
    result.messages = messages
    return result


def consume_lag(stats: dict[str, Any]) -> int:
    """Messages not yet consumed in a ConsumeStats (fastjson-parsed): the sum over its
    queues of the broker's offset minus the group's, as ``ConsumeStats.computeTotalDiff``
    and ``mqadmin consumerProgress``'s "Diff Total" count."""
    table = stats.get("offsetTable") or {}
    if not isinstance(table, dict):
        raise ValueError("offsetTable is not a map")
    return sum(int(w["brokerOffset"]) - int(w["consumerOffset"]) for w in table.values())


# A delay this large is no message's age: the broker's store time of an offset it does
# not have (-1) taken from the clock.
_NO_AGE_MS = 10**12


def oldest_unconsumed_ms(spans: dict[str, Any]) -> int:
    """The age of the oldest message a group has not consumed, from a
    QueryConsumeTimeSpanBody (fastjson-parsed): the largest ``delayTime`` of its queues,
    which a broker sets to now minus the store time of the message at the group's offset
    when the queue holds more (else 0)."""
    entries = spans.get("consumeTimeSpanSet") or []
    if not isinstance(entries, list):
        raise ValueError("consumeTimeSpanSet is not a list")
    delays = [int(e.get("delayTime", 0)) for e in entries]
    return max((d for d in delays if 0 < d < _NO_AGE_MS), default=0)
