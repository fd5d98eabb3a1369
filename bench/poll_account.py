"""What a parked long poll costs the proxy, object by object.

    .venv/bin/python -m bench.poll_account [--polls 2000] [--clients own|shared]
        [--no-trace] [--out FILE]

The proxy runs in this process (``ProxyApp``, notify mode, on uvloop as ``rmq-proxy`` runs),
in front of two broker stubs run as processes of their own, so that what this process holds
is the proxy's. Client processes open the polls with the lean client (``testkit``): on a
few shared connections (``--clients shared``, the default: the per-poll cost alone), or
each poll as a client of its own with its own connection and a Telemetry stream that has
exchanged its settings (``--clients own``, as every official client holds one).

The polls are opened in two halves. Between the first half parked and all of them
parked, per poll:

- ``rss``: the process's RSS growth, the figure ``bench.grpc_floor`` gives for a bare grpcio
  servicer holding the same calls (run it with the same ``--polls`` to compare; with
  ``--no-trace``, as tracemalloc's own records add to RSS);
- ``python``: bytes Python allocated and still holds, by the part of the code that
  allocated them (``proxy``, ``grpc``, ``asyncio``, ``protobuf``, ``other``) and by line;
- ``objects``: objects the garbage collector tracks, by type: how many more per poll and
  their ``sys.getsizeof`` (the objects themselves, not what they point to).

Everything C (grpcio's core, the HTTP/2 state of a connection) shows only in ``rss``.
Writes the account as JSON to ``--out``, and a summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

from bench.grpc_floor import client_env, rss_bytes
from proxy.app import ProxyApp
from proxy.config import ProxyConfig, ReceiveConfig, ReceiveMode
from proxy.loop import run_main
from testkit.processes import System, terminate

GROUP = TOPIC = "account"
AWAIT_MS = 60_000  # longer than the whole measurement: no poll ends while it runs
SETTLE_S = 3.0  # a half is parked; then this long for the allocator and the probes to settle
PER_PROCESS = 250

# Opens ``count`` polls, then holds them until stdin closes. Shared: every 500 polls share a
# connection. Own: each poll is a client with its own connection and Telemetry stream.
CLIENT = (
    """
import asyncio, sys
sys.path.insert(0, ".")
from testkit.lean_client import LeanClient, SettingsClient
async def main(endpoint, first, count, own):
    if own:  # one at a time, as clients arrive
        clients = [SettingsClient(endpoint, f"account-{first + i}", own_connection=True)
                   for i in range(count)]
        for c in clients:
            await c.prepare("{group}", "{topic}", {await_ms})
    else:
        shared = [LeanClient(endpoint, f"account-{first}-{i}", own_connection=True)
                  for i in range(max(count // 500, 1))]
        clients = [shared[i % len(shared)] for i in range(count)]
    polls = [asyncio.ensure_future(c.receive("{group}", "{topic}", await_ms={await_ms},
                                             batch=1))
             for c in clients]
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for p in polls:
        p.cancel()
asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "own"))
""".replace("{group}", GROUP)
    .replace("{topic}", TOPIC)
    .replace("{await_ms}", str(AWAIT_MS))
)


def part_of(filename: str) -> str:
    """The part of the code a Python allocation was made in."""
    path = filename.replace(os.sep, "/")
    for marker, part in (
        ("/proxy/", "proxy"),
        ("/grpc/", "grpc"),
        ("/asyncio/", "asyncio"),
        ("/google/protobuf/", "protobuf"),
    ):
        if marker in path:
            return part
    return "other"


def census() -> tuple[Counter[str], Counter[str]]:
    """Objects the collector tracks, and their sizes, by type name."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        module = type(obj).__module__
        key = name if module == "builtins" else f"{module}.{name}"
        counts[key] += 1
        sizes[key] += sys.getsizeof(obj)
    return counts, sizes


async def wait_parked(app: ProxyApp, count: int, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while sum(app.engine.in_flight.values()) < count:
        if loop.time() > deadline:
            raise RuntimeError(
                f"{sum(app.engine.in_flight.values())} of {count} polls parked after "
                f"{timeout_s:.0f} s"
            )
        await asyncio.sleep(0.2)


async def account(polls: int, own: bool, trace: bool) -> dict[str, object]:
    system = await System(brokers=2, modes=()).start()
    clients: list[asyncio.subprocess.Process] = []
    app: ProxyApp | None = None
    try:
        await system.create_topic(TOPIC)
        receive = ReceiveConfig(mode=ReceiveMode.NOTIFY, max_polling_ms=AWAIT_MS)
        config = ProxyConfig(
            grpc_port=0,
            http_port=0,
            namesrv_addrs=[system.namesrv_address],
            receive=receive,
            proxy_id="account",
        )
        config.max_telemetry_streams = max(config.max_telemetry_streams, 2 * polls)
        config.receive.max_in_flight = max(config.receive.max_in_flight, 2 * polls)
        app = ProxyApp(config)
        await app.start()
        endpoint = f"127.0.0.1:{app.grpc_port}"
        await asyncio.sleep(1.0)
        gc.collect()
        if trace:
            tracemalloc.start(12)
        rss: list[int] = []
        snapshots: list[str] = []  # files (``keep``)
        censuses = []
        half = polls // 2
        env = client_env()
        for n in (1, 2):
            # Own connections: at most PER_PROCESS clients per client process.
            step = PER_PROCESS if own else half
            for first in range((n - 1) * half, n * half, step):
                count = min(step, n * half - first)
                args = [endpoint, str(first), str(count), "own" if own else "shared"]
                clients.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable, "-c", CLIENT, *args, stdin=asyncio.subprocess.PIPE, env=env
                    )
                )
            await wait_parked(app, n * half, timeout_s=60 + half / 20)
            await asyncio.sleep(SETTLE_S)
            gc.collect()
            rss.append(rss_bytes())
            if trace:
                # The census first, and the first snapshot kept on disk meanwhile: the
                # snapshot's own list of traces would count as objects of the polls.
                censuses.append(census())
                snapshots.append(keep(tracemalloc.take_snapshot(), n))
        result: dict[str, object] = {
            "polls": polls,
            "clients": "own" if own else "shared",
            "traced": trace,
            "rss_per_poll_bytes": round((rss[1] - rss[0]) / half),
        }
        if trace:
            result.update(python_account([tracemalloc.Snapshot.load(f) for f in snapshots], half))
            result["objects"] = object_account(censuses, half)
        return result
    finally:
        for client in clients:
            if client.stdin is not None:
                client.stdin.close()
        for client in clients:
            await terminate(client, 10)
        if app is not None:
            await app.stop()
        await system.stop()
        tracemalloc.stop()
        for path in snapshots:
            with contextlib.suppress(OSError):
                os.unlink(path)


def keep(snapshot: tracemalloc.Snapshot, n: int) -> str:
    """Write ``snapshot`` to a temporary file and return its name (the caller drops it)."""
    path = os.path.join(tempfile.gettempdir(), f"poll-account-{os.getpid()}-{n}.snapshot")
    snapshot.dump(path)
    return path


def python_account(snapshots: list[tracemalloc.Snapshot], per: int) -> dict[str, object]:
    """Python bytes held per poll, by part of the code and by the line that allocated them
    (the innermost frame in proxy/ when there is one: what the proxy asked for)."""
    diff = snapshots[1].compare_to(snapshots[0], "traceback")
    parts: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for stat in diff:
        frames = list(reversed(stat.traceback))  # the allocating frame first
        ours = next((f for f in frames if part_of(f.filename) == "proxy"), None)
        top = frames[0]
        parts[part_of(top.filename)] += stat.size_diff
        where = ours or top
        lines[f"{Path(where.filename).name}:{where.lineno}"] += stat.size_diff
    return {
        "python_per_poll_bytes": round(sum(parts.values()) / per),
        "python_by_part": {k: round(v / per) for k, v in parts.most_common()},
        "python_by_line": {k: round(v / per) for k, v in lines.most_common(15)},
    }


def object_account(
    censuses: list[tuple[Counter[str], Counter[str]]], per: int
) -> list[dict[str, object]]:
    """Tracked objects per poll by type, those with at least one per 10 polls."""
    (count0, size0), (count1, size1) = censuses
    rows = []
    for key in count1:
        more = count1[key] - count0.get(key, 0)
        if more * 10 >= per:
            rows.append(
                {
                    "type": key,
                    "per_poll": round(more / per, 2),
                    "bytes_per_poll": round((size1[key] - size0.get(key, 0)) / per),
                }
            )
    rows.sort(key=lambda r: -int(r["bytes_per_poll"]))  # type: ignore[call-overload]
    return rows


def summary(result: dict[str, object]) -> str:
    out = [
        f"{result['polls']} polls, clients {result['clients']}: "
        f"RSS {int(result['rss_per_poll_bytes']) / 1024:.1f} KB per poll"  # type: ignore[call-overload]
    ]
    if result["traced"]:
        out.append(
            f"Python {int(result['python_per_poll_bytes']) / 1024:.1f} KB per poll"  # type: ignore[call-overload]
            " by part: " + ", ".join(f"{k} {v} B" for k, v in result["python_by_part"].items())  # type: ignore[attr-defined]
        )
        out.append("by line (the proxy's frame where there is one):")
        out += [f"  {v:7d} B  {k}" for k, v in result["python_by_line"].items()]  # type: ignore[attr-defined]
        out.append("tracked objects per poll:")
        out += [
            f"  {r['per_poll']:6.2f} x {r['type']:<48} {r['bytes_per_poll']:6d} B"
            for r in result["objects"]  # type: ignore[attr-defined]
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--polls", type=int, default=2000)
    parser.add_argument("--clients", choices=("shared", "own"), default="shared")
    parser.add_argument("--no-trace", action="store_true", help="RSS only, no tracemalloc")
    parser.add_argument("--out", type=Path, default=Path("results/poll-account.json"))
    args = parser.parse_args(argv)
    result = run_main(account(args.polls, args.clients == "own", not args.no_trace))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
