"""Fuzzing the gRPC API: every RPC of ``apache.rocketmq.v2.MessagingService`` with random
and boundary values in every field of its request (built from the message descriptors, so
a field added to the protos is fuzzed too), against one proxy on broker stubs.

Each call must get an answer a RocketMQ client understands: a response whose status is a
``Code`` (unary), a stream that starts with a status (ReceiveMessage), never a gRPC error
(UNKNOWN / INTERNAL are an exception escaping the proxy; DEADLINE_EXCEEDED is a hang: every
call has a deadline). Afterwards the proxy serves a plain send and receive, and its tasks
and in-flight counts are back to their baseline.

Budget: ``tests/fuzz/conftest.py`` (derandomized in the suite; ``make fuzz`` for more).
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import given
from hypothesis import strategies as st

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.config import ProxyConfig
from testkit.waits import wait_for
from tests.fuzz._proxy_thread import ProxyThread

TOPIC, GROUP = "FuzzTopic", "FuzzGroup"
CALL_TIMEOUT = 8.0  # every call's gRPC deadline; the proxy must answer well before
CODES = set(pb.Code.values())

# Strings the proxy gives meaning to, next to random text.
_NAMES = [
    TOPIC,
    GROUP,
    "",
    " ",
    "%RETRY%FuzzGroup",
    "%DLQ%x",
    "TBW102",
    "a" * 127,
    "a" * 128,
    "a" * 256,
    "tag||",
    "*",
    "a || b",
    "broker-a",
    "broker-zz",
    "\x00",
    "é✓𝄞",
    "\u202e",
]
_HANDLES = st.lists(
    st.one_of(st.integers(-(2**63), 2**63 - 1).map(str), st.sampled_from(["broker-a", "x", ""])),
    min_size=7,
    max_size=10,
).map(" ".join)
_STRINGS = st.one_of(
    st.sampled_from(_NAMES),
    st.text(max_size=40),
    _HANDLES,
    st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
    st.integers(1, 5).map(lambda k: "x" * (k * 40_000)),
)
_INT32 = st.one_of(
    st.sampled_from([0, 1, -1, 32, 33, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1)
)
_INT64 = st.one_of(
    st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63), 10_000, 43_200_000]),
    st.integers(-(2**63), 2**63 - 1),
)
_UINT = st.integers(0, 2**32 - 1)
_BYTES = st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"x" * (5 * 1024 * 1024)]))
_FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=32)

_SCALARS = {
    FD.TYPE_STRING: _STRINGS,
    FD.TYPE_BYTES: _BYTES,
    FD.TYPE_BOOL: st.booleans(),
    FD.TYPE_INT32: _INT32,
    FD.TYPE_SINT32: _INT32,
    FD.TYPE_SFIXED32: _INT32,
    FD.TYPE_INT64: _INT64,
    FD.TYPE_SINT64: _INT64,
    FD.TYPE_SFIXED64: _INT64,
    FD.TYPE_UINT32: _UINT,
    FD.TYPE_FIXED32: _UINT,
    FD.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FD.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    FD.TYPE_FLOAT: _FLOAT,
    FD.TYPE_DOUBLE: st.floats(),
}


def _duration(seconds: int, nanos: int):
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=seconds, nanos=nanos)


_DURATIONS = st.builds(
    _duration,
    st.one_of(
        st.sampled_from([0, 1, 10, 20, 30, 43_200, 43_201, -1, 315_576_000_000]),
        st.integers(-(2**40), 2**40),
    ),
    st.integers(-999_999_999, 999_999_999),
)


def message_of(descriptor, depth: int = 0) -> st.SearchStrategy:
    """A strategy for any message of ``descriptor``: each field set or not, any value."""
    cls = _class_of(descriptor)
    if descriptor.full_name == "google.protobuf.Duration":
        return _DURATIONS
    fields = {}
    for field in descriptor.fields:
        value = _value_of(field, depth)
        if value is None:
            continue
        if field.is_repeated and not _is_map(field):
            value = st.lists(value, max_size=3 if depth else 4)
        fields[field.name] = st.one_of(st.none(), value)

    @st.composite
    def build(draw):
        msg = cls()
        for name, strategy in fields.items():
            value = draw(strategy)
            if value is None:
                continue
            field = descriptor.fields_by_name[name]
            # A value protobuf itself refuses (e.g. out of range) makes no such request.
            with contextlib.suppress(ValueError, TypeError):
                _assign(msg, field, value)
        return msg

    return build()


def _value_of(field, depth: int):
    if _is_map(field):
        entry = field.message_type
        key = _SCALARS[entry.fields_by_name["key"].type]
        value = _SCALARS.get(entry.fields_by_name["value"].type)
        return st.dictionaries(key, value, max_size=4) if value is not None else None
    if field.type == FD.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 2**31 - 1))
    if field.type == FD.TYPE_MESSAGE:
        if depth >= 3:
            return None
        return st.deferred(lambda: message_of(field.message_type, depth + 1))
    return _SCALARS[field.type]


def _is_map(field) -> bool:
    return (
        field.type == FD.TYPE_MESSAGE
        and field.message_type.GetOptions().map_entry
        and field.is_repeated
    )


def _assign(msg, field, value) -> None:
    if _is_map(field):
        getattr(msg, field.name).update(value)
    elif field.is_repeated:
        target = getattr(msg, field.name)
        if field.type == FD.TYPE_MESSAGE:
            for item in value:
                target.add().CopyFrom(item)
        else:
            target.extend(value)
    elif field.type == FD.TYPE_MESSAGE:
        getattr(msg, field.name).CopyFrom(value)
    else:
        setattr(msg, field.name, value)


def _class_of(descriptor):
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


_METHODS = {m.name: m for m in api.DESCRIPTOR.services_by_name["MessagingService"].methods}
UNARY = [
    "QueryRoute",
    "Heartbeat",
    "SendMessage",
    "QueryAssignment",
    "AckMessage",
    "ForwardMessageToDeadLetterQueue",
    "UpdateOffset",
    "GetOffset",
    "QueryOffset",
    "EndTransaction",
    "NotifyClientTermination",
    "ChangeInvisibleDuration",
    "RecallMessage",
    "SyncLiteSubscription",
]
SERVER_STREAMS = ["ReceiveMessage", "PullMessage"]
assert set(UNARY) | set(SERVER_STREAMS) | {"Telemetry"} == set(_METHODS), "a new RPC: fuzz it"

# A valid base for each request: fuzzed fields then merge over it, so that the calls also
# get past the first validation into the deeper paths.
_BASES = {
    "SyncLiteSubscription": api.SyncLiteSubscriptionRequest(
        action=pb.LiteSubscriptionAction.PARTIAL_ADD,
        topic=pb.Resource(name=TOPIC),
        group=pb.Resource(name=GROUP),
        lite_topic_set=["lite-1"],
    ),
    "SendMessage": api.SendMessageRequest(
        messages=[
            pb.Message(
                topic=pb.Resource(name=TOPIC),
                body=b"fuzz",
                system_properties=pb.SystemProperties(
                    message_id="FUZZ0001",
                    message_type=pb.MessageType.NORMAL,
                    body_encoding=pb.Encoding.IDENTITY,
                ),
            )
        ]
    ),
    "ReceiveMessage": api.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC)),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=1,
        invisible_duration=_duration(15, 0),
        long_polling_timeout=_duration(0, 300_000_000),
    ),
    "AckMessage": api.AckMessageRequest(
        group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC)
    ),
    "ChangeInvisibleDuration": api.ChangeInvisibleDurationRequest(
        group=pb.Resource(name=GROUP),
        topic=pb.Resource(name=TOPIC),
        invisible_duration=_duration(15, 0),
    ),
    "QueryRoute": api.QueryRouteRequest(topic=pb.Resource(name=TOPIC)),
}


def request_of(rpc: str) -> st.SearchStrategy:
    descriptor = _METHODS[rpc].input_type
    fuzzed = message_of(descriptor)
    base = _BASES.get(rpc)
    if base is None:
        return fuzzed

    def merged(msg):
        out = type(base)()
        out.CopyFrom(base)
        out.MergeFrom(msg)
        return out

    return st.one_of(fuzzed, fuzzed.map(merged))


_METADATA = st.one_of(
    st.just((("x-mq-client-id", "fuzz-client"),)),
    st.just(()),
    st.sampled_from(["", " ", "x" * 2000]).map(lambda v: (("x-mq-client-id", v),)),
)


@pytest.fixture(scope="module")
def proxy():
    thread = ProxyThread(topics=(TOPIC,), max_in_flight=64).start()
    # Warm up (a send, a receive: connections and probes the proxy keeps), then count.
    channel = grpc.insecure_channel(thread.endpoint)
    warm = service_pb2_grpc.MessagingServiceStub(channel)
    metadata = (("x-mq-client-id", "fuzz-client"),)
    call_unary(warm, "SendMessage", _BASES["SendMessage"], metadata)
    call_stream(warm, "ReceiveMessage", _BASES["ReceiveMessage"], metadata)
    channel.close()
    # The warm-up's own tasks end; nothing counts them apart from the proxy's standing
    # ones, so the baseline is taken a second later, not at a condition.
    time.sleep(1.0)
    thread.baseline_tasks = thread.tasks()
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def stub(proxy):
    channel = grpc.insecure_channel(
        proxy.endpoint,
        options=[
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
        ],
    )
    yield service_pb2_grpc.MessagingServiceStub(channel)
    channel.close()


def status_of(proxy) -> dict:
    with urllib.request.urlopen(proxy.status_url, timeout=10) as response:
        return json.loads(response.read())


# The proxy's gRPC receive limit (ProxyApp: 4 x max_body_bytes + 1 MiB): a bigger request
# is refused by gRPC itself with RESOURCE_EXHAUSTED, a status the clients understand.
MAX_REQUEST_BYTES = 4 * ProxyConfig().max_body_bytes + (1 << 20)


def call_unary(stub, rpc: str, request, metadata):
    try:
        response = getattr(stub, rpc)(request, metadata=metadata, timeout=CALL_TIMEOUT)
    except grpc.RpcError as err:
        if (
            err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and request.ByteSize() > MAX_REQUEST_BYTES
        ):
            return None
        raise AssertionError(f"{rpc} answered gRPC {err.code()}: {err.details()}") from None
    assert response.status.code in CODES and response.status.code != pb.Code.CODE_UNSPECIFIED, (
        f"{rpc}: status {response.status}"
    )
    return response


def call_stream(stub, rpc: str, request, metadata) -> list:
    try:
        responses = list(getattr(stub, rpc)(request, metadata=metadata, timeout=CALL_TIMEOUT))
    except grpc.RpcError as err:
        raise AssertionError(f"{rpc} answered gRPC {err.code()}: {err.details()}") from None
    assert responses and responses[0].WhichOneof("content") == "status", f"{rpc}: {responses}"
    assert responses[0].status.code in CODES
    return responses


@pytest.mark.parametrize("rpc", UNARY)
def test_unary_rpcs_answer_every_request_with_a_code(proxy, stub, rpc):
    @given(request=request_of(rpc), metadata=_METADATA)
    def fuzz(request, metadata):
        call_unary(stub, rpc, request, metadata)

    fuzz()


@pytest.mark.parametrize("rpc", SERVER_STREAMS)
def test_streaming_rpcs_answer_every_request_with_a_status(proxy, stub, rpc):
    @given(request=request_of(rpc), metadata=_METADATA)
    def fuzz(request, metadata):
        call_stream(stub, rpc, request, metadata)

    fuzz()


def test_telemetry_answers_every_settings_with_a_status(proxy, stub):
    @given(
        commands=st.lists(message_of(api.TelemetryCommand.DESCRIPTOR), min_size=1, max_size=3),
        metadata=_METADATA,
    )
    def fuzz(commands, metadata):
        try:
            answers = list(stub.Telemetry(iter(commands), metadata=metadata, timeout=CALL_TIMEOUT))
        except grpc.RpcError as err:
            raise AssertionError(f"Telemetry answered gRPC {err.code()}: {err.details()}") from None
        for answer in answers:
            assert answer.status.code in CODES

    fuzz()


@pytest.mark.slow
def test_after_the_fuzzing_the_proxy_serves_and_holds_nothing(proxy, stub):
    """Runs last in this module: everything above is answered, so nothing may be left."""
    metadata = (("x-mq-client-id", "fuzz-client"),)
    sent = call_unary(stub, "SendMessage", _BASES["SendMessage"], metadata)
    assert sent.status.code == pb.Code.OK, sent.status
    # Drain: earlier fuzzed sends may have left messages; then the last one is among them.
    got = call_stream(stub, "ReceiveMessage", _BASES["ReceiveMessage"], metadata)
    assert got[0].status.code in (pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND)
    baseline = proxy.baseline_tasks
    seen: dict = {}

    def settled() -> bool:
        seen.update(in_flight=status_of(proxy)["receive"]["in_flight"], tasks=proxy.tasks())
        return sum(seen["in_flight"].values()) == 0 and seen["tasks"] <= baseline

    wait_for(
        settled,
        timeout=20,
        step=0.2,
        what=lambda: f"nothing left (left: {seen['in_flight']}, tasks {seen['tasks']}/{baseline})",
    )
