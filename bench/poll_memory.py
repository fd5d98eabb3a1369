"""What each long poll leaves behind in the proxy's memory, by the way it ends (issue 58).

    .venv/bin/python -m bench.poll_memory [--polls 200000] [--concurrency 500]
        [--channels 4] [--kinds answered,empty,cancelled,deadline] [--no-check] [--out FILE]

One proxy worker, notify mode, in this process on uvloop with the collector's schedule of
``rmq-proxy`` (``settle_heap`` after start; automatic full collections off, one every
``gc_full_collection_s``): what ``bench.poll_account`` runs, in front of two broker stubs run
as processes of their own. One client process, one client id, ``--concurrency`` polls in
flight at all times over ``--channels`` gRPC channels, runs ``--polls`` polls of each kind
after a warm-up of a tenth as many, one kind after another:

- ``answered``: a message is there (sent to a broker just before, acked there after);
- ``empty``: nothing comes, the poll is answered empty after its 1 s await;
- ``cancelled``: the client cancels the call 0.2 s into a 10 s await;
- ``deadline``: the call's 0.5 s gRPC deadline passes during a 10 s await. The proxy answers
  before a client's deadline by design (``receive.reserve_ms``); this one is run with
  ``reserve_ms = -1000`` so that the deadline, not the answer, ends the poll.

The proxy's RSS (VmRSS) is read every 1/200 of the run, the polls going at full concurrency
at every reading (the run goes on past its last reading by ``--concurrency`` polls, its
wind-down, which is not measured). Per kind:

- ``rss_after_warmup_mb``: the first reading, 1/200 into the run;
- ``kb_per_1000_polls``: the least-squares slope of RSS over polls, over the whole run;
- ``last_half_growth_kb``: the least-squares slope over the samples of the run's last half,
  times its polls: what the last half added, without one sample's noise deciding it;
- ``objects_per_1000_polls``: objects the collector tracks, more at the end than after the
  warm-up (``gc.get_objects``, no collection made: a poll left in a reference cycle stays
  there until the full collection), with the types that grew most.

The check: every kind within ``BOUND_KB`` (50 KB) per 1,000 polls over the run, and its last
half *flat*: the last half's slope within the same 50 KB per 1,000 polls (at 200,000 polls,
at most 5 MB over the last 100,000). A cost that is still rising at the end fails the second
even where the first, over the whole run, averages it out. Cancelled polls come closest
(6.7-48.1 KB per 1,000 in four runs on 2026-12-02, the proxy's objects flat: native memory,
not found; docs/performance.md, "Memory per poll"): that kind can fail the check on a loaded
machine. ``--floor`` runs the cancelled and deadline polls on a bare grpc.aio servicer that
only parks them (``bench.grpc_floor``), for grpcio's share. Exits 1 when a kind fails;
``--no-check`` reports only (for runs too small for the bound: RSS moves by a few MB as the
allocator reuses and returns memory, which is more than 50 KB per 1,000 polls over a few
thousand polls). Writes the figures as JSON to ``--out`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

from bench.grpc_floor import ParkingService, client_env, rss_bytes
from bench.poll_account import census
from proxy.api.v2 import service_pb2_grpc
from proxy.app import ProxyApp
from proxy.collector import NEVER, settle_heap
from proxy.config import ProxyConfig, ReceiveMode
from proxy.loop import run_main
from testkit.processes import System, terminate
from testkit.waits import wait_until

GROUP = TOPIC = "memory"
KINDS = ("answered", "empty", "cancelled", "deadline")
FLOOR_KINDS = ("cancelled", "deadline")  # the ones a servicer that only parks can end
# The order they run in: answered last, so that a message it leaves unconsumed (a poll that
# found its broker empty and answered empty) meets no empty poll.
RUN_ORDER = ("empty", "cancelled", "deadline", "answered")
BOUND_KB = 50.0  # per 1,000 polls, over the run and over its last half
SAMPLES = 200  # RSS readings per kind
AWAIT_MS = 1_000  # answered and empty polls
PARKED_AWAIT_MS = 10_000  # cancelled and deadline polls: parked when they end
CANCEL_AFTER_S = 0.2
DEADLINE_S = 0.5
RESERVE_MS = -1_000  # the proxy's answer is due a second past a client's deadline

# Runs the polls of one kind per command line on stdin ("kind total every"), printing
# "at N" each ``every`` polls done and "done {outcomes}" at the end.
CLIENT = """
import asyncio, json, sys
from collections import Counter
sys.path.insert(0, ".")
import grpc
from proxy.api.handles import parse_receipt_handle
from proxy.remoting.broker_client import BrokerClient
from testkit.lean_client import LeanClient
G = T = "{group}"
async def main(endpoint, channels, concurrency, brokers):
    clients = [LeanClient(endpoint, "memory-client", connection=i + 1) for i in range(channels)]
    direct = dict((b.name, b) for b in (BrokerClient(*nb.split("=")) for nb in brokers))
    names = sorted(direct)
    async def one(n, kind):
        client = clients[n % len(clients)]
        if kind == "answered":
            await direct[names[n % len(names)]].send(T, b"memory")
            got = await client.receive(G, T, await_ms={await_ms}, batch=1)
            for m in got.messages:
                handle = parse_receipt_handle(m.system_properties.receipt_handle)
                await direct[handle.broker].ack(G, T, handle.extra_info)
            return "found" if got.messages else "empty" if got.status == 40401 else "status"
        if kind == "empty":
            got = await client.receive(G, T, await_ms={await_ms}, batch=1)
            return "found" if got.messages else "empty" if got.status == 40401 else "status"
        if kind == "deadline":
            try:
                await client.receive(G, T, await_ms={parked_ms}, batch=1, timeout_s={deadline_s})
            except grpc.aio.AioRpcError as exc:
                return exc.code().name.lower()
            return "answered"
        call = asyncio.ensure_future(client.receive(G, T, await_ms={parked_ms}, batch=1))
        await asyncio.sleep({cancel_s})
        if call.done():
            return "answered"
        call.cancel()
        try:
            await call
        except asyncio.CancelledError:
            return "cancelled"
        return "answered"
    async def run(kind, total, every):
        outcomes = Counter()
        started = 0
        done = 0
        async def worker():
            nonlocal started, done
            while started < total:
                n = started
                started += 1
                try:
                    outcomes[await one(n, kind)] += 1
                except grpc.aio.AioRpcError as exc:
                    outcomes["error_" + exc.code().name.lower()] += 1
                except Exception as exc:
                    outcomes[type(exc).__name__] += 1
                done += 1
                if done % every == 0 or done == total:
                    print("at", done, flush=True)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        print("done", json.dumps(outcomes), flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        kind, total, every = line.split()
        await run(kind, int(total), int(every))
asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")))
""".replace("{group}", GROUP)
CLIENT = (
    CLIENT.replace("{await_ms}", str(AWAIT_MS))
    .replace("{parked_ms}", str(PARKED_AWAIT_MS))
    .replace("{deadline_s}", str(DEADLINE_S))
    .replace("{cancel_s}", str(CANCEL_AFTER_S))
)


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of (polls, RSS bytes): bytes per poll (0 with fewer than two)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def figures(samples: list[tuple[int, int]], polls: int) -> dict[str, Any]:
    """A kind's RSS figures from its samples (polls since the warm-up, RSS bytes)."""
    half = polls / 2
    last = [(x, y) for x, y in samples if x >= half]
    per_1000_kb = slope(samples) * 1000 / 1024
    last_per_1000_kb = slope(last) * 1000 / 1024
    return {
        "rss_after_warmup_mb": round(samples[0][1] / 2**20, 1),
        "rss_end_mb": round(samples[-1][1] / 2**20, 1),
        "kb_per_1000_polls": round(per_1000_kb, 1),
        "last_half_kb_per_1000_polls": round(last_per_1000_kb, 1),
        "last_half_growth_kb": round(last_per_1000_kb * (polls - half) / 1000),
        "within_bound": per_1000_kb <= BOUND_KB,
        "flat": last_per_1000_kb <= BOUND_KB,
    }


def grown(before: Counter[str], after: Counter[str], polls: int) -> dict[str, float]:
    """Tracked object types with at least one more per 1,000 polls, the most first."""
    more = {k: (after[k] - before.get(k, 0)) * 1000 / polls for k in after}
    top = sorted((v, k) for k, v in more.items() if v >= 1)[::-1][:8]
    return {k: round(v, 1) for v, k in top}


class Client:
    """The client process, and its lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> list[str]:
        assert self.proc.stdout is not None
        text = await self.proc.stdout.readline()
        if not text:
            raise RuntimeError("the client process ended")
        return text.decode().split(maxsplit=1)

    async def start(self, kind: str, total: int, every: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{kind} {total} {every}\n".encode())
        await self.proc.stdin.drain()

    async def finish(self) -> dict[str, int]:
        """Read up to the "done" line; its outcomes."""
        while (words := await self.line())[0] != "done":
            pass
        return dict(json.loads(words[1]))


async def settled(app: ProxyApp | None, timeout_s: float = 30.0) -> None:
    """Once the client has its answers, until the proxy holds no poll: a cancel reaches it
    after the client has moved on (``app`` None: the floor's servicer, which counts none)."""
    if app is not None:
        engine = app.engine
        await wait_until(
            lambda: not engine.in_flight_total, timeout_s, 0.1, "the proxy holds no poll"
        )
    await asyncio.sleep(0.5)  # grpcio's own end of the calls


async def run_kind(
    app: ProxyApp | None, client: Client, kind: str, polls: int, warmup: int, concurrency: int
) -> dict[str, Any]:
    await client.start(kind, warmup, max(warmup, 1))
    warm = await client.finish()
    await settled(app)
    every = max(polls // SAMPLES, 1)
    objects0 = census()[0]
    # Every reading with the polls going at full concurrency: the run goes on past the last
    # one by a poll per client worker, so that no reading is of the run winding down.
    tail = concurrency
    samples: list[tuple[int, int]] = []
    await client.start(kind, polls + tail, every)
    while (words := await client.line())[0] != "done":
        if (done := int(words[1])) <= polls:
            samples.append((done, rss_bytes()))
    outcomes = dict(json.loads(words[1]))
    await settled(app)
    objects1 = census()[0]
    result: dict[str, Any] = {
        "polls": polls,
        "polls_run": polls + tail,
        "warmup": warmup,
        **figures(samples, polls),
    }
    result["objects_per_1000_polls"] = round(
        (sum(objects1.values()) - sum(objects0.values())) * 1000 / polls, 1
    )
    result["objects_grown"] = grown(objects0, objects1, polls)
    result["outcomes"] = outcomes
    result["warmup_outcomes"] = warm
    result["samples"] = [[x, round(y / 1024)] for x, y in samples]  # polls, RSS KB
    return result


async def floor_server() -> tuple[grpc.aio.Server, int]:
    """``--floor``: a bare grpc.aio server whose ReceiveMessage only parks
    (``bench.grpc_floor``), with the proxy's collector schedule; its port."""
    server = grpc.aio.server()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(ParkingService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    settle_heap()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, NEVER)
    return server, port


async def measure(
    polls: int, concurrency: int, channels: int, kinds: list[str], warmup: int, floor: bool
) -> dict[str, Any]:
    system: System | None = None
    app: ProxyApp | None = None
    server: grpc.aio.Server | None = None
    proc: asyncio.subprocess.Process | None = None
    thresholds = gc.get_threshold()
    config = ProxyConfig(grpc_port=0, http_port=0, proxy_id="memory")
    brokers = "none=127.0.0.1:1"  # the floor's polls send nothing to a broker
    try:
        if floor:
            server, port = await floor_server()
        else:
            system = await System(brokers=2, modes=()).start()
            await system.create_topic(TOPIC)
            config.namesrv_addrs = [system.namesrv_address]
            receive = config.receive
            receive.mode = ReceiveMode.NOTIFY
            receive.min_polling_ms = AWAIT_MS
            receive.reserve_ms = RESERVE_MS
            receive.max_in_flight = max(receive.max_in_flight, 2 * concurrency)
            app = ProxyApp(config)
            await app.start()
            settle_heap()  # as rmq-proxy does once started
            port = app.grpc_port
            brokers = ",".join(f"{b.name}={b.address}" for b in system.broker_clients)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, f"127.0.0.1:{port}", str(channels),
            str(concurrency), brokers,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=client_env(),
        )  # fmt: skip
        client = Client(proc)
        results: dict[str, Any] = {}
        for kind in [k for k in RUN_ORDER if k in kinds]:
            results[kind] = await run_kind(app, client, kind, polls, warmup, concurrency)
            row = results[kind]
            print(
                f"{kind}: {row['rss_after_warmup_mb']} MB after warm-up, "
                f"{row['kb_per_1000_polls']} KB per 1,000 polls, last half "
                f"{row['last_half_growth_kb']} KB; {row['outcomes']}",
                flush=True,
            )
        return {
            "server": "grpc_floor" if floor else "proxy",
            "polls": polls,
            "warmup": warmup,
            "concurrency": concurrency,
            "channels": channels,
            "bound_kb_per_1000_polls": BOUND_KB,
            "gc_full_collection_s": config.gc_full_collection_s,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "kinds": {k: results[k] for k in KINDS if k in results},
        }
    finally:
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            await terminate(proc, 10)
        if app is not None:
            await app.stop()
        if server is not None:
            await server.stop(0)
            gc.set_threshold(*thresholds)
        if system is not None:
            await system.stop()


def table(result: dict[str, Any]) -> str:
    out = [
        "| kind | RSS after warm-up (MB) | KB per 1,000 polls | last-half growth (KB) "
        "| objects per 1,000 polls | check |",
        "|---|---|---|---|---|---|",
    ]
    for kind, r in result["kinds"].items():
        check = "ok" if r["within_bound"] and r["flat"] else "FAILS"
        out.append(
            f"| {kind} | {r['rss_after_warmup_mb']} | {r['kb_per_1000_polls']} "
            f"| {r['last_half_growth_kb']} | {r['objects_per_1000_polls']} | {check} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--polls", type=int, default=200_000, help="polls per kind")
    parser.add_argument("--warmup", type=int, help="polls per kind first (default: a tenth)")
    parser.add_argument("--concurrency", type=int, default=500, help="polls in flight")
    parser.add_argument("--channels", type=int, default=4, help="gRPC channels they share")
    parser.add_argument("--kinds", default=",".join(KINDS), help="of " + ",".join(KINDS))
    parser.add_argument("--no-check", action="store_true", help="report only, exit 0")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="the polls on a bare grpc.aio servicer that only parks them (bench.grpc_floor), "
        "not the proxy: grpcio's own share (cancelled and deadline only)",
    )
    parser.add_argument("--out", type=Path, default=Path("results/poll-memory.json"))
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    if args.floor and (answering := set(kinds) - set(FLOOR_KINDS)):
        parser.error(f"the floor's servicer answers no poll: {', '.join(sorted(answering))}")
    warmup = args.warmup if args.warmup is not None else max(args.polls // 10, args.concurrency)
    result = run_main(
        measure(args.polls, args.concurrency, args.channels, kinds, warmup, args.floor)
    )
    failed = [k for k, r in result["kinds"].items() if not (r["within_bound"] and r["flat"])]
    result["checked"] = not args.no_check
    result["failed"] = failed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"written to {args.out}")
    if failed and not args.no_check:
        print(
            f"over {BOUND_KB:.0f} KB per 1,000 polls, or not flat over the last half: "
            + ", ".join(failed),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
