"""Fuzzing the clients' metrics export (``client_metrics.mode = proxy``): the
``MetricsService/Export`` RPC on the client port with random bytes and with random OTLP
requests (any metric name and kind, histogram points with random bounds, counts, sums,
times, temporalities and attributes), against one proxy on broker stubs.

Each call must end in an answer a client understands: OK (with ``partial_success`` for
malformed points), INVALID_ARGUMENT for bytes that are not an export, RESOURCE_EXHAUSTED
for one over ``max_export_bytes``; never UNKNOWN or INTERNAL (an exception escaping the
proxy) nor DEADLINE_EXCEEDED (a hang). Afterwards /metrics renders, holds at most
``max_label_sets`` label sets, and the proxy serves a QueryRoute.

Budget: ``tests/fuzz/conftest.py`` (derandomized in the suite; ``make fuzz`` for more).
"""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.config import ClientMetricsConfig, ClientMetricsMode
from proxy.observability.metrics import CLIENT_HISTOGRAMS
from testkit.otlp import EXPORT_METHOD, client_headers
from tests.fuzz._proxy_thread import ProxyThread

TOPIC = "FuzzTopic"
CALL_TIMEOUT = 8.0
MAX_EXPORT_BYTES = 64 * 1024
MAX_LABEL_SETS = 40
ANSWERS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}

_U64 = st.integers(0, 2**64 - 1)
_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", "G", TOPIC, "a" * 300]))
_ATTRIBUTES = st.lists(
    st.builds(
        lambda k, v: KeyValue(key=k, value=AnyValue(string_value=v)),
        st.sampled_from(["topic", "consumer_group", "client_id", "invocation_status", "x"]),
        st.one_of(_TEXT, st.sampled_from(["success", "failure"])),
    ),
    max_size=5,
)


@st.composite
def _histogram_point(draw) -> HistogramDataPoint:
    official = draw(st.sampled_from(sorted(CLIENT_HISTOGRAMS)))
    bounds = draw(
        st.one_of(
            st.just(list(CLIENT_HISTOGRAMS[official][1])),
            st.lists(_FLOATS, max_size=10),
        )
    )
    # len(counts) = len(bounds) + 1 mostly; one fewer or more now and then.
    size = max(len(bounds) + draw(st.sampled_from([1, 1, 1, 0, 2])), 0)
    counts = draw(st.lists(st.integers(0, 1000) | _U64, min_size=size, max_size=size))
    point = HistogramDataPoint(
        attributes=draw(_ATTRIBUTES),
        start_time_unix_nano=draw(_U64),
        time_unix_nano=draw(_U64),
        count=draw(_U64),
        bucket_counts=counts,
        explicit_bounds=bounds,
    )
    if draw(st.booleans()):
        point.sum = draw(_FLOATS)
    return point


@st.composite
def _metric(draw) -> Metric:
    name = draw(st.one_of(st.sampled_from(sorted(CLIENT_HISTOGRAMS)), _TEXT))
    if draw(st.integers(0, 4)) == 0:
        gauge = Gauge(data_points=[NumberDataPoint(as_double=draw(_FLOATS))])
        return Metric(name=name, gauge=gauge)
    return Metric(
        name=name,
        histogram=Histogram(
            data_points=draw(st.lists(_histogram_point(), max_size=4)),
            aggregation_temporality=draw(st.integers(0, 3)),
        ),
    )


_EXPORTS = st.builds(
    lambda metrics: ExportMetricsServiceRequest(
        resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=metrics)])]
    ),
    st.lists(_metric(), max_size=6),
)


@pytest.fixture(scope="module")
def proxy():
    config = ClientMetricsConfig(
        mode=ClientMetricsMode.PROXY,
        max_export_bytes=MAX_EXPORT_BYTES,
        max_label_sets=MAX_LABEL_SETS,
        max_client_series=200,
    )
    thread = ProxyThread(topics=(TOPIC,), options={"client_metrics": config}).start()
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def channel(proxy):
    channel = grpc.insecure_channel(
        proxy.endpoint, options=[("grpc.max_send_message_length", 4 * MAX_EXPORT_BYTES)]
    )
    yield channel
    channel.close()


def export_raw(channel, raw: bytes) -> grpc.StatusCode:
    call = channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
    try:
        answer = call(raw, timeout=CALL_TIMEOUT, metadata=client_headers(client_id="fuzz"))
    except grpc.RpcError as err:
        return err.code()
    ExportMetricsServiceResponse.FromString(answer)  # a well-formed answer
    return grpc.StatusCode.OK


@given(raw=st.binary(max_size=4096))
def test_random_bytes_are_answered_ok_or_invalid_argument(channel, raw):
    assert export_raw(channel, raw) in ANSWERS


@given(request=_EXPORTS)
def test_random_exports_are_taken_with_partial_success_at_worst(channel, request):
    raw = request.SerializeToString()
    code = export_raw(channel, raw)
    if len(raw) > MAX_EXPORT_BYTES:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    else:
        assert code == grpc.StatusCode.OK


@given(size=st.integers(MAX_EXPORT_BYTES + 1, 3 * MAX_EXPORT_BYTES))
def test_oversized_exports_get_resource_exhausted(channel, size):
    assert export_raw(channel, b"\x00" * size) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_proxy_serves_on_with_bounded_label_sets(proxy, channel):
    """Runs after the fuzzers (file order): /metrics renders, the label sets stayed within
    the bound, and the client port answers a QueryRoute."""
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.app.http_port}/metrics") as r:
        text = r.read().decode()
    series = [line for line in text.splitlines() if line.split("{")[0].endswith("_count")
              and line.split("_count")[0] in CLIENT_HISTOGRAMS]  # fmt: skip
    assert len(series) <= MAX_LABEL_SETS
    assert proxy.app.client_metrics.totals.sizes()["histograms"] <= MAX_LABEL_SETS
    route = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
        api.QueryRouteRequest(topic=pb.Resource(name=TOPIC)),
        metadata=(("x-mq-client-id", "fuzz-client"),),
        timeout=CALL_TIMEOUT,
    )
    assert route.status.code == pb.Code.OK
