"""A proxy with its broker stubs on an event loop of its own thread, so that synchronous
hypothesis tests can call it with blocking gRPC clients (each call with a deadline)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

from broker_stub import BrokerConfig, StubCluster
from proxy.app import ProxyApp
from proxy.config import ProxyConfig, ReceiveConfig


class ProxyThread:
    def __init__(
        self,
        *,
        brokers: int = 2,
        topics=("FuzzTopic",),
        options: dict[str, Any] | None = None,  # other ProxyConfig fields
        **receive: Any,
    ) -> None:
        self.brokers = brokers
        self.options = options or {}
        self.topics = list(topics)
        self.receive = {"min_polling_ms": 200, **receive}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        # Tasks alive once a fixture has warmed the proxy up; leak checks compare with it.
        self.baseline_tasks = 0

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> ProxyThread:
        self.thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        self.cluster = StubCluster(self.brokers, template=BrokerConfig(topics=self.topics))
        await self.cluster.start()
        config = ProxyConfig(
            grpc_port=0,
            http_port=0,
            namesrv_addrs=[self.cluster.namesrv_address],
            receive=ReceiveConfig(mode=self.receive.pop("mode", "notify"), **self.receive),
            proxy_id="fuzz-proxy",
            **self.options,
        )
        self.app = ProxyApp(config)
        await self.app.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.app.grpc_port}"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.app.http_port}/v1/status"

    def tasks(self) -> int:
        """Tasks alive on the proxy's loop (the proxy's and the stubs')."""

        async def count() -> int:
            return len(asyncio.all_tasks())

        return int(self.run(count()))

    def stop(self) -> None:
        try:
            self.run(self._stop(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    async def _stop(self) -> None:
        try:
            await self.app.stop()
        finally:
            await self.cluster.stop()
