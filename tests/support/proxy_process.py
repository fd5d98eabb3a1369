"""rmq-proxy as a process, for the tests that start one: its ready line."""

from __future__ import annotations

import asyncio


async def ready_line(proc: asyncio.subprocess.Process, timeout: float) -> dict[str, str]:
    """The fields of the ``rmq-proxy ready grpc=... http=...`` line the process prints on
    its standard output once it serves; kill the process if it does not within
    ``timeout`` seconds (or prints something else first)."""
    assert proc.stdout is not None  # PIPE
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    words = line.decode().split()
    assert words[:2] == ["rmq-proxy", "ready"], line
    return dict(w.split("=", 1) for w in words[2:])
