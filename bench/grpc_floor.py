"""The memory floor of an idle long poll: what grpcio itself costs per parked call.

    .venv/bin/python -m bench.grpc_floor [--calls 2000] [--telemetry] [--own-connections]
        [--option grpc.NAME=VALUE ...] [--tracemalloc] [--server grpcio|grpclib]

A bare grpc.aio server whose ReceiveMessage only waits, held open by client processes with
the lean client's calls; prints the server's RSS growth per parked call, between half and
all of the calls (as the fan-in scenario measures the proxy) and from none. Compare it with
the proxy's KB per idle poll in the fan-in scenario (make bench). With ``--telemetry`` each
call comes with an open Telemetry stream that has exchanged one command each way, as an
official client (and ``make bench-peer``'s load generator) keeps one per client. With
``--own-connections`` each call comes over its own HTTP/2 connection, as each official
client has its own; without, the calls of a client process share one. ``--option`` passes a
grpcio server option (an integer or a string), to measure what it changes. The allocator is
the process's: run it under ``MALLOC_ARENA_MAX=2`` or ``LD_PRELOAD=libjemalloc.so.2`` to
compare. ``--server grpclib`` serves the same calls with grpclib (a pure-Python gRPC server on h2;
in the ``bench`` extra, not a dependency of the proxy) instead of grpcio, to compare the
cost per call of another maintained server. ``--tracemalloc`` also prints the Python
allocations per call (the rest of the growth is grpcio's C core and the allocator) and the
lines that made the most of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import sys
import tracemalloc

import grpc

from proxy.api.v2 import service_pb2, service_pb2_grpc

CLIENT = """
import asyncio, sys
sys.path.insert(0, ".")
from testkit.lean_client import LeanClient
from proxy.api.v2 import service_pb2 as api
async def stream(client):
    queue = asyncio.Queue()
    queue.put_nowait(api.TelemetryCommand())
    async def commands():
        while (c := await queue.get()) is not None:
            yield c
    call = client.stub.Telemetry(commands(), metadata=client.metadata)
    await call.read()
    return call
async def main(endpoint, calls, telemetry, own):
    shared = LeanClient(endpoint, "floor")
    clients = [LeanClient(endpoint, f"floor-{i}", own_connection=True) for i in range(calls)] \
        if own else [shared] * calls
    streams = [await stream(c) for c in clients] if telemetry else []
    polls = [asyncio.ensure_future(c.receive("G", "T", await_ms=45000, batch=1))
             for c in clients]
    await asyncio.sleep(90)
asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"))
"""


class ParkingService(service_pb2_grpc.MessagingServiceServicer):
    """Parks every ReceiveMessage until ``release`` is set (or 60 s pass)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.parked = 0  # calls in ReceiveMessage now: what the figures are per

    async def ReceiveMessage(self, request, context):
        self.parked += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), 60)

    async def Telemetry(self, request_iterator, context):
        """Answer the first command, then hold the stream open until the client ends it."""
        async for _ in request_iterator:
            yield service_pb2.TelemetryCommand()


class GrpclibParking:
    """The same service for grpclib: the handlers grpclib's code generator would map."""

    def __init__(self, parking: ParkingService) -> None:
        self.parking = parking
        self.release = parking.release

    async def receive(self, stream) -> None:
        await stream.recv_message()
        self.parking.parked += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), 60)

    async def telemetry(self, stream) -> None:
        async for _ in stream:
            await stream.send_message(service_pb2.TelemetryCommand())

    def __mapping__(self) -> dict:
        const = importlib.import_module("grpclib.const")  # bench extra, not the proxy's
        Cardinality, Handler = const.Cardinality, const.Handler

        prefix = "/apache.rocketmq.v2.MessagingService/"
        return {
            prefix + "ReceiveMessage": Handler(
                self.receive,
                Cardinality.UNARY_STREAM,
                service_pb2.ReceiveMessageRequest,
                service_pb2.ReceiveMessageResponse,
            ),
            prefix + "Telemetry": Handler(
                self.telemetry,
                Cardinality.STREAM_STREAM,
                service_pb2.TelemetryCommand,
                service_pb2.TelemetryCommand,
            ),
        }


def client_env() -> dict[str, str]:
    """The environment of a client process with hundreds of channels: grpcio's client
    aborts (ev_epoll1_linux.cc, "next_worker->state == KICKED") with that many on its
    default poller; poll() holds them."""
    return {**os.environ, "GRPC_POLL_STRATEGY": "poll"}


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def option(text: str) -> tuple[str, int | str]:
    name, _, value = text.partition("=")
    return name, int(value) if value.lstrip("-").isdigit() else value


async def main(
    calls: int,
    telemetry: bool,
    own: bool,
    options: list[tuple[str, int | str]],
    trace: bool = False,
    kind: str = "grpcio",
) -> None:
    service = ParkingService()
    if kind == "grpclib":
        grpclib_server = importlib.import_module("grpclib.server").Server([GrpclibParking(service)])
        await grpclib_server.start("127.0.0.1", 0)
        # grpclib does not expose the port it bound.
        port = grpclib_server._server.sockets[0].getsockname()[1]

        async def stop() -> None:
            grpclib_server.close()
            await grpclib_server.wait_closed()
    else:
        server = grpc.aio.server(options=options)
        port = server.add_insecure_port("127.0.0.1:0")
        service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
        await server.start()

        async def stop() -> None:
            await server.stop(0)

    await asyncio.sleep(0.5)
    before = rss_bytes()
    half = calls // 2
    clients = []
    try:
        grown, parked, snapshots = [], [], []
        if trace:
            tracemalloc.start(4)
        env = client_env()
        for _ in range(2):  # two halves: the second shows the cost per call, not the arenas
            clients.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    CLIENT,
                    f"127.0.0.1:{port}",
                    str(half),
                    str(int(telemetry)),
                    str(int(own)),
                    env=env,
                )
            )
            await asyncio.sleep(15.0 if telemetry or own else 8.0)  # the client opens its calls
            grown.append(rss_bytes() - before)
            parked.append(service.parked)
            if trace:
                snapshots.append(tracemalloc.take_snapshot())
        second = max(parked[1] - parked[0], 1)
        print(
            f"{parked[1]} of {2 * half} calls parked: "
            f"{(grown[1] - grown[0]) / second / 1024:.1f} KB per call (between half and all), "
            f"{grown[1] / max(parked[1], 1) / 1024:.1f} KB per call from none"
        )
        if trace:
            diff = snapshots[1].compare_to(snapshots[0], "lineno")
            total = sum(d.size_diff for d in diff)
            print(f"Python allocations: {total / second / 1024:.1f} KB per call; the most:")
            for d in diff[:8]:
                print(f"  {d.size_diff / second:8.0f} B/call  {d.traceback[0]}")
    finally:
        service.release.set()  # the calls end normally, not cancelled by the stop
        await asyncio.sleep(0.5)
        for client in clients:
            client.kill()
            await client.wait()
        await stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--telemetry", action="store_true", help="a Telemetry stream per call")
    parser.add_argument(
        "--own-connections", action="store_true", help="an HTTP/2 connection per call"
    )
    parser.add_argument(
        "--option", type=option, action="append", default=[], help="a grpcio server option"
    )
    parser.add_argument("--tracemalloc", action="store_true", help="Python allocations per call")
    parser.add_argument("--server", choices=("grpcio", "grpclib"), default="grpcio")
    args = parser.parse_args()
    asyncio.run(
        main(
            args.calls,
            args.telemetry,
            args.own_connections,
            args.option,
            args.tracemalloc,
            args.server,
        )
    )
