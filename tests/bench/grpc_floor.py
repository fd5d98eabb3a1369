"""The memory floor of an idle long poll: what grpcio itself costs per parked call.

    .venv/bin/python -m tests.bench.grpc_floor [--calls 2000]

A bare grpc.aio server whose ReceiveMessage only sleeps, held open by a client process
with the lean client's calls; prints the server's RSS growth per parked call. Compare it
with the proxy's KB per idle poll in the fan-in scenario (make bench).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import grpc

from proxy.api.v2 import service_pb2_grpc

CLIENT = """
import asyncio, sys
sys.path.insert(0, ".")
from tests.lean_client import LeanClient
async def main(endpoint, calls):
    client = LeanClient(endpoint, "floor")
    polls = [asyncio.ensure_future(client.receive("G", "T", await_ms=20000, batch=1))
             for _ in range(calls)]
    await asyncio.sleep(30)
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


class ParkingService(service_pb2_grpc.MessagingServiceServicer):
    async def ReceiveMessage(self, request, context):
        await asyncio.sleep(30)


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


async def main(calls: int) -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    service_pb2_grpc.add_MessagingServiceServicer_to_server(ParkingService(), server)
    await server.start()
    await asyncio.sleep(0.5)
    before = rss_bytes()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, f"127.0.0.1:{port}", str(calls)
    )
    try:
        await asyncio.sleep(8.0)  # the client opens its calls
        held = calls
        grown = rss_bytes() - before
        print(f"{held} calls opened: {grown / max(held, 1) / 1024:.1f} KB per call")
    finally:
        client.kill()
        await client.wait()
        await server.stop(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    asyncio.run(main(parser.parse_args().calls))
