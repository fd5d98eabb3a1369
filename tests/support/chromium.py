"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, to check
what a page really draws: the analytics HTML report's charts.

Chromium starts on a free loopback port (``--remote-debugging-port=0``; it writes the port
it took to ``DevToolsActivePort`` in its profile directory), and the test talks to its one
page over a WebSocket (aiohttp). Stopped by process id when the ``async with`` ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from testkit.waits import wait_until

START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 60.0


@dataclass
class Page:
    """One tab: navigate, evaluate script, take screenshots."""

    ws: aiohttp.ClientWebSocketResponse
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    # Every event the page sent, in order (method, params): Network.requestWillBeSent ...
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        async with asyncio.timeout(CALL_TIMEOUT_S):
            while True:
                message = await self._receive()
                if message.get("id") == call_id:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    return message.get("result", {})

    async def wait_event(self, method: str) -> dict[str, Any]:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            while True:
                for name, params in self.events:
                    if name == method:
                        return params
                await self._receive()

    async def _receive(self) -> dict[str, Any]:
        """The page's next message; an event is recorded in ``events`` on the way."""
        message = await self.ws.receive_json()
        if "method" in message:
            self.events.append((message["method"], message.get("params", {})))
        return message

    async def open(self, url: str, width: int = 1280, height: int = 1000) -> None:
        """Load ``url`` and wait for its load event, recording its network requests."""
        await self.call("Page.enable")
        await self.call("Network.enable")
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.events.clear()
        await self.call("Page.navigate", url=url)
        await self.wait_event("Page.loadEventFired")

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        """A PNG of the whole page, or of ``clip`` (page coordinates: x, y, width, height)."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if clip is not None:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode((await self.call("Page.captureScreenshot", **params))["data"])

    def requested_urls(self) -> list[str]:
        return [p["request"]["url"] for m, p in self.events if m == "Network.requestWillBeSent"]


@contextlib.asynccontextmanager
async def headless_chromium(profile: Path) -> AsyncIterator[Page]:
    """A headless Chromium with its profile in ``profile``; yields its one page."""
    binary = shutil.which("chromium")
    if binary is None:
        raise RuntimeError("chromium is not installed (scripts/system-deps.sh)")
    await asyncio.to_thread(profile.mkdir, parents=True, exist_ok=True)
    active = profile / "DevToolsActivePort"
    # A profile used before holds the port of a Chromium that has gone.
    await asyncio.to_thread(active.unlink, missing_ok=True)
    log_path = profile / "chromium.log"
    log = await asyncio.to_thread(log_path.open, "wb")
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--headless=new",
        "--no-sandbox",  # tests may run as root, where the sandbox refuses to start
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--hide-scrollbars",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "about:blank",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        try:
            await wait_until(
                lambda: (
                    proc.returncode is None and active.exists() and bool(active.read_text().strip())
                ),
                timeout=START_TIMEOUT_S,
                step=0.1,
            )
        except AssertionError:
            log.flush()
            text = await asyncio.to_thread(log_path.read_text, errors="replace")
            raise RuntimeError(
                f"chromium did not start (exit {proc.returncode}):\n{text[-3000:]}"
            ) from None
        port = int((await asyncio.to_thread(active.read_text)).splitlines()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            page_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with http.ws_connect(page_url, max_msg_size=0) as ws:
                yield Page(ws)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await asyncio.wait_for(proc.wait(), 10)
        log.close()
