"""``[client_metrics]``: what the settings tell the clients in each mode, and in mode proxy
the OTLP Export RPC on the client port: histograms on /metrics by group and topic, the
differences of cumulative exports added up, the label-set bound, the forward to another
collector, and the clear errors of bad exports."""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as otlp_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.app import ProxyApp
from proxy.config import ClientMetricsConfig, ClientMetricsMode
from testkit.lean_client import consumer_settings
from testkit.otlp import DELTA, client_headers, export, point
from testkit.waits import wait_until

COLLECTOR = "otel-collector.example:4317"
EMPTY = [0] * 8


async def settings_answer(app, lean, settings: pb.Settings) -> pb.Settings:
    client = lean(app)
    call = client.stub.Telemetry(metadata=client.metadata)
    await call.write(api.TelemetryCommand(settings=settings))
    answer = await call.read()
    await call.done_writing()
    assert answer.status.code == pb.Code.OK, answer
    return answer.settings


def producer(endpoint: str) -> pb.Settings:
    host, port = endpoint.rsplit(":", 1)
    return pb.Settings(
        client_type=pb.ClientType.PRODUCER,
        publishing=pb.Publishing(),
        access_point=pb.Endpoints(
            scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))]
        ),
    )


async def start(start_proxy, **options) -> ProxyApp:
    return await start_proxy(
        brokers=1, proxy_options={"client_metrics": ClientMetricsConfig(**options)}
    )


def exposition(app) -> str:
    return app.metrics.render()[0].decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` whose labels include ``labels`` (0: none)."""
    found = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            found += float(line.rsplit(" ", 1)[1])
    return found


async def test_off_by_default_the_settings_turn_the_clients_metrics_off(start_proxy, lean):
    app = await start_proxy(brokers=1)
    endpoint = f"127.0.0.1:{app.grpc_port}"
    settings = await settings_answer(app, lean, producer(endpoint))
    assert settings.metric == pb.Metric(on=False)


async def test_collector_mode_tells_every_client_the_collectors_address(start_proxy, lean):
    app = await start(start_proxy, mode=ClientMetricsMode.COLLECTOR, collector=COLLECTOR)
    endpoint = f"127.0.0.1:{app.grpc_port}"
    consumer = consumer_settings(pb.ClientType.PUSH_CONSUMER, "G", "T", 5000, endpoint)
    for settings in (producer(endpoint), consumer):
        answer = await settings_answer(app, lean, settings)
        assert answer.metric.on
        assert answer.metric.endpoints == pb.Endpoints(
            scheme=pb.AddressScheme.DOMAIN_NAME,
            addresses=[pb.Address(host="otel-collector.example", port=4317)],
        )
    # No Export RPC on the client port in this mode: the clients export elsewhere.
    async with grpc.aio.insecure_channel(endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await otlp_grpc.MetricsServiceStub(channel).Export(ExportMetricsServiceRequest())
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_proxy_mode_tells_the_client_the_address_it_reached_the_proxy_at(start_proxy, lean):
    app = await start(start_proxy, mode=ClientMetricsMode.PROXY)
    endpoint = f"127.0.0.1:{app.grpc_port}"
    settings = await settings_answer(app, lean, producer(endpoint))
    assert settings.metric.on
    assert settings.metric.endpoints == producer(endpoint).access_point


async def test_exports_become_histograms_by_group_with_cumulative_differences(start_proxy):
    app = await start(start_proxy, mode=ClientMetricsMode.PROXY)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = otlp_grpc.MetricsServiceStub(channel)
        first = export(
            (
                "rocketmq_delivery_latency",
                point([1, 2, 0, 0, 0, 0, 0, 0], consumer_group="G", topic="T", client_id="c1"),
            )
        )
        answer = await stub.Export(first, metadata=client_headers())
        assert answer == ExportMetricsServiceResponse()
        # A minute later: the same series, its totals grown by 3 in the first bucket.
        later = point(
            [4, 2, 0, 0, 0, 0, 0, 0], 25.0, age_s=120, consumer_group="G", topic="T", client_id="c1"
        )
        await stub.Export(export(("rocketmq_delivery_latency", later)), metadata=client_headers())
        # A delta export (another exporter's choice) is added as it is.
        send = point([0, 0, 1, 0, 0, 0, 0, 0], name="rocketmq_send_cost_time", topic="T")
        await stub.Export(
            export(("rocketmq_send_cost_time", send), temporality=DELTA),
            metadata=client_headers("PYTHON", "5.1.2", "c2"),
        )
    text = exposition(app)
    by = {"group": "G", "topic": "T", "client_language": "JAVA", "client_version": "5.2.0"}
    assert sample(text, "rocketmq_delivery_latency_count", **by) == 6
    assert sample(text, "rocketmq_delivery_latency_sum", **by) == 25.0
    assert sample(text, "rocketmq_delivery_latency_bucket", le="1.0", **by) == 4
    assert sample(text, "rocketmq_send_cost_time_bucket", le="10.0", client_language="PYTHON") == 1
    assert "c1" not in text and "client_id" not in text  # never the client id
    assert sample(text, "rocketmq_proxy_client_metrics_exports_total", result="ok") == 3


async def test_a_series_first_seen_long_after_its_start_is_a_baseline(start_proxy):
    """A client whose connection moved here from another worker: its history was added
    there, so only what it adds from now on counts here."""
    app = await start(start_proxy, mode=ClientMetricsMode.PROXY)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = otlp_grpc.MetricsServiceStub(channel)
        old = point([50, 0, 0, 0, 0, 0, 0, 0], age_s=3600, consumer_group="G", client_id="m")
        await stub.Export(export(("rocketmq_delivery_latency", old)), metadata=client_headers())
        assert sample(exposition(app), "rocketmq_delivery_latency_count") == 0
        grown = point([52, 0, 0, 0, 0, 0, 0, 0], age_s=3660, consumer_group="G", client_id="m")
        await stub.Export(export(("rocketmq_delivery_latency", grown)), metadata=client_headers())
    assert sample(exposition(app), "rocketmq_delivery_latency_count", group="G") == 2


async def test_label_sets_past_the_limit_are_dropped_and_counted(start_proxy):
    app = await start(start_proxy, mode=ClientMetricsMode.PROXY, max_label_sets=3)
    points = [
        ("rocketmq_delivery_latency", point([1, 0, 0, 0, 0, 0, 0, 0], consumer_group=f"G{i}"))
        for i in range(5)
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        await otlp_grpc.MetricsServiceStub(channel).Export(
            export(*points), metadata=client_headers()
        )
    text = exposition(app)
    groups = set(re.findall(r'rocketmq_delivery_latency_count\{[^}]*group="(G\d)"', text))
    assert groups == {"G0", "G1", "G2"}
    assert sample(text, "rocketmq_proxy_client_metrics_dropped_total", reason="label_limit") == 2


async def test_bad_exports_get_clear_errors_and_the_proxy_serves_on(start_proxy, lean):
    app = await start(start_proxy, mode=ClientMetricsMode.PROXY, max_export_bytes=2000)
    endpoint = f"127.0.0.1:{app.grpc_port}"
    async with grpc.aio.insecure_channel(endpoint) as channel:
        raw = channel.unary_unary(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await raw(b"\xff\xff\xff\xff garbage")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not an OTLP ExportMetricsServiceRequest" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await raw(b"\x0a" + b"\x00" * 5000)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_export_bytes (2000)" in (err.value.details() or "")
        # Malformed points: the rest is added, the answer says what was rejected.
        broken = point([1, 2], consumer_group="G")  # 2 counts for 7 bounds
        good = point([1, 0, 0, 0, 0, 0, 0, 0], consumer_group="G")
        answer = await otlp_grpc.MetricsServiceStub(channel).Export(
            export(("rocketmq_delivery_latency", broken), ("rocketmq_delivery_latency", good))
        )
        assert answer.partial_success.rejected_data_points == 1
        assert "bucket counts" in answer.partial_success.error_message
    route = await lean(app).query_route("T")
    assert route.status.code == pb.Code.OK
    text = exposition(app)
    assert sample(text, "rocketmq_proxy_client_metrics_exports_total", result="invalid") == 1
    assert sample(text, "rocketmq_proxy_client_metrics_exports_total", result="too_large") == 1
    assert sample(text, "rocketmq_proxy_client_metrics_dropped_total", reason="malformed") == 1


class _Collector(otlp_grpc.MetricsServiceServicer):
    def __init__(self) -> None:
        self.received: list[ExportMetricsServiceRequest] = []

    async def Export(self, request, context):
        self.received.append(request)
        return ExportMetricsServiceResponse()


async def test_exports_are_forwarded_as_received_to_another_collector(start_proxy):
    collector = _Collector()
    server = grpc.aio.server()
    otlp_grpc.add_MetricsServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        app = await start(start_proxy, mode=ClientMetricsMode.PROXY, forward_to=f"127.0.0.1:{port}")
        sent = export(("rocketmq_process_time", point(EMPTY, name="rocketmq_process_time")))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            await otlp_grpc.MetricsServiceStub(channel).Export(sent, metadata=client_headers())
        await wait_until(lambda: bool(collector.received), timeout=10)
        assert collector.received == [sent]
        await app.stop()  # the forward's task and channel end with the proxy
        assert app.client_metrics.forward is not None
        assert app.client_metrics.forward._task is None
    finally:
        await server.stop(None)
    await asyncio.sleep(0)


@pytest.mark.slow
async def test_workers_exports_add_up_in_the_groups_metrics(tmp_path):
    """``--workers 2``: one client's cumulative exports, each on a new connection that the
    kernel puts on either worker (as connection aging moves a client), add each increment
    once: the workers share the series' last totals, so the group counts what the client
    recorded, and every worker's /metrics and the supervisor's say the same."""
    from testkit.metrics_text import total
    from tests.integration.test_proxy_workers import start_group, stop

    config = tmp_path / "proxy.toml"
    config.write_text('[client_metrics]\nmode = "proxy"\n')
    group = await start_group("--config", str(config))
    try:
        workers = (await group.status())["workers"]
        for i in range(16):  # a connection each: the kernel spreads them over both workers
            channel = grpc.aio.insecure_channel(
                group.grpc, options=[("grpc.use_local_subchannel_pool", 1)]
            )
            async with channel:
                cumulative = point([i + 1, 0, 0, 0, 0, 0, 0, 0], 0.5 * (i + 1), age_s=30 + i,
                                   consumer_group="G", client_id="c1")  # fmt: skip
                await otlp_grpc.MetricsServiceStub(channel).Export(
                    export(("rocketmq_delivery_latency", cumulative)),
                    metadata=client_headers(client_id="c1"),
                )
        texts = [(await group.get("/metrics", worker["http"]))[1] for worker in workers]
        taken = [
            total(t, "rocketmq_proxy_client_metrics_exports_total", result="ok") for t in texts
        ]
        assert all(n > 0 for n in taken), taken  # exports landed on both workers
        _, group_text = await group.get("/metrics")
        for text in (group_text, *texts):
            assert total(text, "rocketmq_delivery_latency_count", group="G") == 16
            assert total(text, "rocketmq_delivery_latency_bucket", group="G", le="1.0") == 16
            assert total(text, "rocketmq_delivery_latency_sum", group="G") == 8.0
    finally:
        await stop(group)


async def test_with_authentication_an_export_needs_a_valid_signature(start_proxy, tmp_path):
    from proxy.security import signing
    from proxy.security.config import SecurityConfig

    users = tmp_path / "users.toml"
    users.write_text('[[users]]\naccess_key = "alice"\nsecret_key = "alice-secret"\n')
    app = await start_proxy(
        brokers=1,
        security=SecurityConfig(users_file=str(users), tls_self_signed=False),
        proxy_options={"client_metrics": ClientMetricsConfig(mode=ClientMetricsMode.PROXY)},
    )
    sent = export(
        ("rocketmq_delivery_latency", point([0, 0, 0, 0, 0, 0, 0, 1], consumer_group="G"))
    )
    date_time = signing.now_date_time()
    signed = (
        *client_headers(),
        ("x-mq-date-time", date_time),
        ("authorization", signing.authorization_header("alice", "alice-secret", date_time)),
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = otlp_grpc.MetricsServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Export(sent, metadata=client_headers())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "client metrics" in (err.value.details() or "")
        assert await stub.Export(sent, metadata=signed) == ExportMetricsServiceResponse()
    text = exposition(app)
    assert sample(text, "rocketmq_proxy_client_metrics_exports_total", result="denied") == 1
    assert sample(text, "rocketmq_delivery_latency_count", group="G") == 1
