"""The ops HTTP server (default port 8082): /metrics, /healthz, /readyz, /v1/status.

Plain aiohttp with an ``AppRunner``; everything it needs comes in through the constructor,
so tests and embedded set-ups can run several side by side.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web


class MetricsSource(Protocol):
    """What /metrics serves: a proxy's ``ProxyMetrics``, or a worker group's
    ``GroupMetrics``."""

    def set_ready(self, ready: bool) -> None: ...

    def render(self, accept: str = "") -> tuple[bytes, str]: ...


class OpsServer:
    """Serves the proxy's metrics, health, readiness and status over HTTP."""

    def __init__(
        self,
        metrics: MetricsSource,
        status: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
        ready: Callable[[], bool],
    ) -> None:
        self._metrics = metrics
        self._status = status
        self._ready = ready
        self._runner: web.AppRunner | None = None

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None
    ) -> int:
        """Listen on ``host:port`` (0: any free port) and return the bound port;
        ``ssl_context``: serve HTTPS (``[security] tls_ops``)."""
        if self._runner is not None:
            raise RuntimeError("OpsServer already started")
        app = web.Application()
        app.router.add_get("/metrics", self._handle_metrics)
        app.router.add_get("/healthz", self._handle_healthz)
        app.router.add_get("/readyz", self._handle_readyz)
        app.router.add_get("/v1/status", self._handle_status)
        # Scrapes and probes every few seconds would flood the log: access logs off.
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        return int(runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        # Keep the gauge in step with what /readyz answers.
        self._metrics.set_ready(self._ready())
        # Rendering walks every series under prometheus_client's locks; off the loop, a big
        # registry cannot hold up client answers for the length of a scrape.
        body, content_type = await asyncio.to_thread(
            self._metrics.render, request.headers.get("Accept", "")
        )
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _handle_healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _handle_readyz(self, _request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="ready")
        return web.Response(status=503, text="not ready")

    async def _handle_status(self, _request: web.Request) -> web.Response:
        status = self._status()
        if inspect.isawaitable(status):
            status = await status
        body = orjson.dumps(status, option=orjson.OPT_NON_STR_KEYS)
        return web.Response(body=body, content_type="application/json")
