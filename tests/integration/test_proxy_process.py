"""rmq-proxy as a process: the ready line, serving, and a graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import aiohttp

from bench.lean_client import LeanClient
from proxy.api.v2 import definition_pb2 as pb
from tests.support.proxy_process import ready_line


async def start_proxy_process(*args: str) -> tuple[asyncio.subprocess.Process, dict]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy.cli",
        "--embedded-brokers",
        "2",
        "--grpc-port",
        "0",
        "--http-port",
        "0",
        "--topic",
        "T",
        "--log-level",
        "warning",
        *args,
        stdout=asyncio.subprocess.PIPE,
    )
    return proc, await ready_line(proc, 30)


async def test_sigterm_answers_polls_in_flight_and_exits():
    proc, ready = await start_proxy_process("--mode", "notify")
    client = LeanClient(ready["grpc"])
    try:
        sent = await client.send("T", b"x")
        assert sent.status.code == pb.Code.OK
        got = await client.receive("G", "T", await_ms=5000)  # the minimum poll
        assert got.status == pb.Code.OK
        poll = asyncio.ensure_future(client.receive("G", "T", await_ms=15_000))
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        os.kill(proc.pid, signal.SIGTERM)
        async with aiohttp.ClientSession() as http:
            # not ready at once, while it drains
            for _ in range(50):
                try:
                    async with http.get(f"http://{ready['http']}/readyz") as r:
                        if r.status == 503:
                            break
                except aiohttp.ClientError:
                    break  # already gone
                await asyncio.sleep(0.02)
        result = await poll
        assert result.status == pb.Code.MESSAGE_NOT_FOUND
        assert time.perf_counter() - started < 5  # not the 15 s poll time
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        await client.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
