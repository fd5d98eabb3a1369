"""rmq-proxy as a process: the ready line, serving, and a graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import aiohttp
import pytest

from proxy.api.v2 import definition_pb2 as pb
from testkit.lean_client import LeanClient
from testkit.waits import wait_until
from tests.support.proxy_process import ready_line


async def start_proxy_process(
    *args: str, env: dict[str, str] | None = None
) -> tuple[asyncio.subprocess.Process, dict]:
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
        env=None if env is None else {**os.environ, **env},
    )
    return proc, await ready_line(proc, 30)


@pytest.mark.slow
async def test_sigterm_answers_polls_in_flight_and_exits():
    """The poll parked on the proxy holds its connection, which the drain lets age first
    (2 s here, 10 by default: its client may move away): then it is answered, empty, long
    before its own 20 s, and the proxy exits."""
    age_s = 2.0
    proc, ready = await start_proxy_process(
        "--mode", "notify", env={"RMQ_PROXY_GRPC_MAX_CONNECTION_AGE_S": str(age_s)}
    )
    client = LeanClient(ready["grpc"])
    try:
        sent = await client.send("T", b"x")
        assert sent.status.code == pb.Code.OK
        got = await client.receive("G", "T", await_ms=5000)  # the minimum poll
        assert got.status == pb.Code.OK
        poll = asyncio.ensure_future(client.receive("G", "T", await_ms=20_000))
        async with aiohttp.ClientSession() as http:

            async def polling() -> bool:  # the supervisor's status lists its workers'
                async with http.get(f"http://{ready['http']}/v1/status") as r:
                    workers = (await r.json())["workers"]
                return sum(sum(w["status"]["receive"]["in_flight"].values()) for w in workers) == 1

            await wait_until(polling, timeout=5, step=0.02, what="the poll in flight")
            started = time.perf_counter()
            os.kill(proc.pid, signal.SIGTERM)

            async def draining() -> bool:
                try:
                    async with http.get(f"http://{ready['http']}/readyz") as r:
                        return r.status == 503
                except aiohttp.ClientError:
                    return True  # already gone

            # Not ready at once, while it drains.
            await wait_until(draining, timeout=1, step=0.02, what="/readyz 503 on SIGTERM")
        result = await poll
        assert result.status == pb.Code.MESSAGE_NOT_FOUND
        # Once the connection aged (at most 2.2 s and a margin), not at the poll's 20 s.
        assert time.perf_counter() - started < age_s * 1.1 + 0.5 + 5
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        await client.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
