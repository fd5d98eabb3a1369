"""``opentelemetry.proto.collector.metrics.v1.MetricsService/Export`` on the client port,
where the official clients export their own metrics in ``client_metrics.mode = proxy``.

The request arrives as bytes (the handler is registered without a deserializer): its size
is checked before anything parses it, and the forward to ``client_metrics.forward_to``
passes on exactly what the client sent. The messages are the ``opentelemetry-proto``
package's generated ones. An export is parsed and added up (``ClientMetricsIngest``) in a
worker thread, at most ``MAX_EXPORTS_AT_ONCE`` at a time; the answers:

| export | gRPC status |
|---|---|
| added (some points malformed: ``partial_success`` says how many and why) | OK |
| over ``client_metrics.max_export_bytes`` | RESOURCE_EXHAUSTED |
| ``MAX_EXPORTS_AT_ONCE`` already being added | RESOURCE_EXHAUSTED (the clients retry) |
| not an ``ExportMetricsServiceRequest`` | INVALID_ARGUMENT |
| refused by the guard (authentication on, bad or no signature) | UNAUTHENTICATED |
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import NoReturn

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceResponse,
)

from proxy.api.context import Context
from proxy.config import ClientMetricsConfig, ClientMetricsMode
from proxy.observability.client_metrics import BadExport, ClientMetricsIngest
from proxy.observability.client_totals import ClientHistograms, ClientTotals, Limits
from proxy.observability.log_every import LogEvery
from proxy.observability.metrics import ProxyMetrics
from proxy.security.guard import Denied, Guard

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
EXPORT = f"/{SERVICE}/Export"
MAX_EXPORTS_AT_ONCE = 4
# Exports waiting for the forward at most; past it they are dropped and counted.
FORWARD_QUEUE = 64
FORWARD_TIMEOUT_S = 10.0
# At most one log line about failing forwards this often.
FORWARD_LOG_EVERY_S = 60.0


class ClientMetricsService:
    """The Export RPC (``handler``) and the forward. ``start`` and ``close`` are steps of
    the app; the gRPC server registers ``handler()`` in mode proxy only (``serves``)."""

    def __init__(
        self,
        config: ClientMetricsConfig,
        metrics: ProxyMetrics,
        guard: Callable[[], Guard | None] = lambda: None,
        directory: str | None = None,
    ) -> None:
        """``directory``: where the workers of a group share the clients' totals (the
        multiprocess directory); None keeps them in this process's memory."""
        self.config = config
        self.metrics = metrics
        self.serves = config.mode is ClientMetricsMode.PROXY
        self._guard = guard
        self.totals: ClientTotals | None = None
        self.ingest: ClientMetricsIngest | None = None
        if self.serves:
            limits = Limits(
                config.max_label_sets, config.max_client_series, config.max_series_per_client
            )
            self.totals = ClientTotals(directory, limits)
            metrics.registry.register(ClientHistograms(self.totals.histograms))
            self.ingest = ClientMetricsIngest(metrics, self.totals)
        self._adding = 0
        forward = self.serves and config.forward_to
        self.forward = Forward(config.forward_to, metrics) if forward else None

    async def start(self) -> None:
        if self.forward is not None:
            self.forward.start()

    async def close(self) -> None:
        if self.forward is not None:
            await self.forward.close()
        if self.totals is not None:
            self.totals.close()

    def handler(self) -> grpc.GenericRpcHandler[bytes, ExportMetricsServiceResponse]:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self.export,
                    request_deserializer=None,  # the bytes as sent: see the module docstring
                    response_serializer=ExportMetricsServiceResponse.SerializeToString,
                )
            },
        )

    async def export(self, raw: bytes, context: Context) -> ExportMetricsServiceResponse:
        started = time.perf_counter()
        metadata = context.invocation_metadata() or ()
        guard = self._guard()
        if guard is not None:
            try:
                await guard.load_signed("Telemetry", metadata)
                guard.check("Telemetry", None, metadata)  # a signature; no topic is touched
            except Denied as denied:
                await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "denied",
                                   f"client metrics: {denied.message}")  # fmt: skip
        limit = self.config.max_export_bytes
        if len(raw) > limit:
            await self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "too_large",
                               f"export of {len(raw)} bytes is over client_metrics."
                               f"max_export_bytes ({limit})")  # fmt: skip
        if self._adding >= MAX_EXPORTS_AT_ONCE:
            await self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "busy",
                               "client metrics: too many exports at once, retry later")  # fmt: skip
        headers = {k: v for k, v in metadata if isinstance(v, str)}
        assert self.ingest is not None  # the handler is served in mode proxy only
        self._adding += 1
        try:
            tally = await asyncio.to_thread(self.ingest.ingest_bytes, raw, headers)
        except BadExport as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid", str(exc))
        finally:
            self._adding -= 1
        if self.forward is not None:
            self.forward.offer(raw)
        self.metrics.client_export("partial" if tally.rejected else "ok")
        self.metrics.rpc("grpc", "otlp_export", "OK", time.perf_counter() - started)
        if not tally.rejected:
            return ExportMetricsServiceResponse()
        return ExportMetricsServiceResponse(
            partial_success=ExportMetricsPartialSuccess(
                rejected_data_points=tally.rejected, error_message="; ".join(tally.errors)
            )
        )

    async def _refuse(
        self, context: Context, code: grpc.StatusCode, result: str, message: str
    ) -> NoReturn:
        self.metrics.client_export(result)
        self.metrics.rpc("grpc", "otlp_export", code.name, 0.0)
        await context.abort(code, message)


class Forward:
    """Exports passed on to another OTLP collector, as received: a bounded queue and one
    task that sends them in turn (``close`` cancels it)."""

    def __init__(self, target: str, metrics: ProxyMetrics) -> None:
        self.target = target
        self.metrics = metrics
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(FORWARD_QUEUE)
        self.sent = 0
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._failures_log = LogEvery(log, FORWARD_LOG_EVERY_S)

    def start(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.target)
        self._task = asyncio.create_task(self._run(self._channel), name="client-metrics-forward")

    def offer(self, raw: bytes) -> None:
        try:
            self.queue.put_nowait(raw)
        except asyncio.QueueFull:
            self.metrics.client_dropped("forward_queue_full")

    async def _run(self, channel: grpc.aio.Channel) -> None:
        # Bytes in, bytes out: no (de)serializers.
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        while True:
            raw = await self.queue.get()
            try:
                await export(raw, timeout=FORWARD_TIMEOUT_S)
                self.sent += 1
            except grpc.aio.AioRpcError as exc:
                self.metrics.client_dropped("forward_failed")
                self._failures_log.warning(
                    "client metrics: forward to %s failed: %s %s",
                    self.target, exc.code().name, exc.details(),
                )  # fmt: skip

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None
