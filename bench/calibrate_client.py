"""Check the lean load generator once against the official client (benchmark calibration).

    .venv/bin/python -m bench.calibrate_client [--messages N] [--out results/bench]

Starts a name server, 4 brokers and a notify proxy as separate processes on loopback and runs
the same sparse workload twice, in a random order: once consumed by the official
rocketmq-python-client 5.1.2 SimpleConsumer (``testkit/official/official_consumer.py`` in
``.venv-interop``), once by the benchmark's own consumer (``scenarios.Consumers`` over
``LeanClient``). One consumer, one topic per run; a producer sends straight to a random broker
every 200-500 ms from a seeded RNG, so both runs see the same sends at the same offsets.

For each client: messages delivered, latency from the send's acknowledgement to the receive
returning (wall clock in both processes), empty answers, gRPC calls per delivered message by
RPC (the proxy's /metrics), the long-polling time the proxy granted (its event log) and broker
requests per message. Prints the two side by side and writes calibration.json to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_proxy import aligned, machine
from bench.scenarios import Consumers, ModeTally, ms, percentile
from testkit.processes import System, broker_requests, scrape

REPO = Path(__file__).resolve().parents[1]
INTEROP_PYTHON = REPO / ".venv-interop" / "bin" / "python"
DRIVER = Path(__file__).resolve().parents[1] / "testkit" / "official" / "official_consumer.py"
CLIENTS = ("official", "lean")
BODY_BYTES = 64


class Run:
    """What one client's run saw; ``sent`` maps message ids to the wall-clock time their
    send was acknowledged, ``received`` to the wall-clock time they arrived (first time)."""

    def __init__(self, client: str, topic: str, group: str) -> None:
        self.client, self.topic, self.group = client, topic, group
        self.sent: dict[str, float] = {}
        self.received: dict[str, float] = {}
        self.bench_latencies: list[float] = []  # the lean run: scenarios.Consumers' own
        self.delivered = 0  # messages handed to the consumer, duplicates included
        self.empties = 0
        self.receives = 0
        self.errors: list[str] = []
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.seconds = 0.0
        self.driver_summary: dict | None = None

    def all_in(self) -> bool:
        return all(i in self.received for i in self.sent)


async def produce(system: System, run: Run, messages: int, seed: int, on_sent=None) -> None:
    """``messages`` sends, each 200-500 ms after the last, each to a random broker; the same
    ``seed`` gives the same intervals and brokers."""
    rng = random.Random(seed)
    for i in range(messages):
        await asyncio.sleep(rng.uniform(0.2, 0.5))
        body = f"calib-{run.client}-{i:04d}".encode().ljust(BODY_BYTES, b".")
        result = await rng.choice(system.broker_clients).send(run.topic, body)
        run.sent[result.msg_id] = time.time()
        if on_sent is not None:
            on_sent(result.msg_id)


async def drain(run: Run, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not run.all_in() and time.monotonic() < end:  # noqa: ASYNC110 - bounded poll
        await asyncio.sleep(0.05)


# -- the lean consumer: the benchmark's own Consumers, unchanged ------------------------------


async def run_lean(system: System, run: Run, args: argparse.Namespace) -> None:
    tally = ModeTally()
    available: dict[str, float] = {}  # perf_counter at send ack, as scenarios.sparse keeps it
    crowd = Consumers(
        system.proxies["notify"].address["grpc"],
        run.group,
        run.topic,
        tally,
        available,
        args.await_s * 1000,
    )

    def on_sent(msg_id: str) -> None:
        available[msg_id] = time.perf_counter()

    # Consumers counts latencies itself; wrap its client's receive to see each id arrive.
    crowd.start(1)
    client = crowd.clients[0]
    receive = client.receive

    async def receive_and_note(*a, **kw):
        result = await receive(*a, **kw)
        now = time.time()
        for m in result.messages:
            run.received.setdefault(m.system_properties.message_id, now)
        return result

    client.receive = receive_and_note  # type: ignore[method-assign]  # a wrapper, same shape
    try:
        await asyncio.sleep(0.5)  # the consumer is polling, as in scenarios.sparse
        await produce(system, run, args.messages, args.seed, on_sent)
        await drain(run, args.await_s + 5)
    finally:
        await crowd.stop()
    # The bench's own latencies (perf_counter in this process), to check the wall-clock ones.
    run.bench_latencies = list(tally.latencies)
    run.delivered, run.empties, run.receives = tally.delivered, tally.empties, tally.receives


# -- the official consumer: a SimpleConsumer in .venv-interop -------------------------------


def _log_file(path: Path):
    return path.open("wb")


async def run_official(system: System, run: Run, args: argparse.Namespace, home: Path) -> None:
    if not INTEROP_PYTHON.exists():
        raise SystemExit(f"{INTEROP_PYTHON} is missing: run `make interop-deps`")
    env = dict(os.environ, HOME=str(home))
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    stderr_path = home / f"official-{run.topic}.stderr"
    with _log_file(stderr_path) as stderr:
        proc = await asyncio.create_subprocess_exec(
            str(INTEROP_PYTHON),
            str(DRIVER),
            "--endpoint",
            system.proxies["notify"].address["grpc"],
            "--group",
            run.group,
            "--topic",
            run.topic,
            "--await-seconds",
            str(args.await_s),
            "--deadline-seconds",
            str(args.messages * 0.5 + 4 * args.await_s + 120),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    events: list[dict] = []
    reader: asyncio.Task | None = None
    try:
        assert proc.stdout is not None and proc.stdin is not None  # PIPEs
        stdout, stdin = proc.stdout, proc.stdin
        line = await asyncio.wait_for(stdout.readline(), 60)
        ready = json.loads(line) if line.strip() else {}
        if ready.get("event") != "ready":
            raise RuntimeError(
                f"official consumer did not start: {line!r}; stderr: "
                f"{stderr_path.read_text(errors='replace')[-2000:]}"
            )

        async def read() -> None:
            while line := await stdout.readline():
                event = json.loads(line)
                events.append(event)
                if event["event"] == "message":
                    run.received.setdefault(event["id"], event["t"])

        reader = asyncio.ensure_future(read())
        # The SimpleConsumer's first receive goes out at once after "ready".
        await asyncio.sleep(0.5)
        await produce(system, run, args.messages, args.seed)
        await drain(run, args.await_s + 5)
        stdin.write(b"stop\n")
        await stdin.drain()
        stdin.close()
        # The receive in progress ends within await + 3 s; then shutdown.
        await asyncio.wait_for(proc.wait(), args.await_s + 3 + 20)
        await asyncio.wait_for(reader, 5)
    finally:
        if reader is not None and not reader.done():
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        run.errors.append(f"driver exit {proc.returncode}: {stderr_path.read_text()[-2000:]}")
    for event in events:
        if event["event"] == "message":
            run.delivered += 1
        elif event["event"] == "empty":
            run.empties += 1
        elif event["event"] == "error":
            run.errors.append(event["error"])
        elif event["event"] == "done":
            run.driver_summary = event
            run.receives = event["receives"]


# -- measurement ----------------------------------------------------------------------------


def delta(run: Run, key: str) -> float:
    return run.after.get(key, 0.0) - run.before.get(key, 0.0)


def read_events(directory: Path) -> list[dict]:
    """Every event the proxy logged, finished files and any still under a temporary name."""
    events = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def summarise(run: Run, events: list[dict]) -> dict:
    delivered = run.delivered
    latencies = [run.received[i] - t for i, t in run.sent.items() if i in run.received]
    rpcs = {
        key.split(":", 2)[2]: round(delta(run, key))
        for key in sorted(set(run.after) | set(run.before))
        if key.startswith("rpc:grpc:") and delta(run, key) > 0
    }
    mine = [e for e in events if e.get("topic") == run.topic and e.get("group") == run.group]
    granted = [e["polling_ms"] for e in mine if e.get("is_long_polling")]
    waits = [e["wait_ms"] for e in mine]
    wait_count = delta(run, "rocketmq_proxy_receive_wait_seconds_count")
    wait_sum = delta(run, "rocketmq_proxy_receive_wait_seconds_sum")
    requests = broker_requests(run.before, run.after)
    return {
        "client": run.client,
        "topic": run.topic,
        "group": run.group,
        "seconds": round(run.seconds, 1),
        "sent": len(run.sent),
        "delivered": delivered,
        "unique_delivered": sum(1 for i in run.sent if i in run.received),
        "undelivered_at_end": sum(1 for i in run.sent if i not in run.received),
        "receives_client_side": run.receives,
        "empty_answers": run.empties,
        "latency_ms_p50": ms(percentile(latencies, 0.5)),
        "latency_ms_p99": ms(percentile(latencies, 0.99)),
        "latency_ms_max": ms(max(latencies) if latencies else None),
        "latency_ms_mean": ms(statistics.fmean(latencies) if latencies else None),
        "latencies_ms": [ms(x) for x in latencies],
        "bench_latency_ms_p50": ms(percentile(run.bench_latencies, 0.5)),
        "bench_latency_ms_p99": ms(percentile(run.bench_latencies, 0.99)),
        "grpc_calls": rpcs,
        "grpc_calls_per_message": {
            rpc: round(n / delivered, 3) if delivered else None for rpc, n in rpcs.items()
        },
        "proxy_receives": {
            result: round(delta(run, f"receive:notify:{result}"))
            for result in ("found", "empty", "error")
        },
        "proxy_receive_wait_ms_mean": (
            round(wait_sum / wait_count * 1000, 1) if wait_count else None
        ),
        "granted_polling_ms": {
            "polls": len(granted),
            "min": min(granted) if granted else None,
            "median": statistics.median(granted) if granted else None,
            "max": max(granted) if granted else None,
        },
        "event_log": {
            "receives": len(mine),
            "found": sum(1 for e in mine if e.get("result") == "found"),
            "empty": sum(1 for e in mine if e.get("result") == "empty"),
            # A poll the client cancels is logged as "found" with no messages.
            "found_without_messages": sum(
                1 for e in mine if e.get("result") == "found" and not e.get("messages")
            ),
            "short_polling_hits": sum(1 for e in mine if e.get("is_short_polling_hit")),
            "wait_ms_p50": percentile(waits, 0.5),
            "pops": sum(e.get("pops", 0) for e in mine),
            "notifications": sum(e.get("notifications", 0) for e in mine),
        },
        "broker_requests": round(requests),
        "broker_requests_per_message": round(requests / delivered, 2) if delivered else None,
        "errors": run.errors,
        "driver": run.driver_summary,
    }


def verdict(rows: dict[str, dict]) -> list[str]:
    off, lean = rows["official"], rows["lean"]
    per_off, per_lean = off["grpc_calls_per_message"], lean["grpc_calls_per_message"]
    lines = []
    for rpc in ("receive_message", "ack_message"):
        a, b = per_off.get(rpc), per_lean.get(rpc)
        same = a is not None and b is not None and abs(a - b) <= max(0.15 * max(a, b), 0.1)
        lines.append(
            f"{rpc} per delivered message: official {a}, lean {b} -> "
            f"{'the same' if same else 'DIFFERENT'}"
        )
    only_official = sorted(set(off["grpc_calls"]) - set(lean["grpc_calls"]))
    only_lean = sorted(set(lean["grpc_calls"]) - set(off["grpc_calls"]))
    if only_official:
        lines.append(
            "calls only the official client makes: "
            + ", ".join(f"{r} x{off['grpc_calls'][r]}" for r in only_official)
            + " (start-up, heartbeat every 10 s, shutdown; none scales with messages)"
        )
    if only_lean:
        lines.append("calls only the lean client makes: " + ", ".join(only_lean))
    lines.append(
        "Telemetry (one stream per client, settings every 300 s) is not in the proxy's "
        "rpc metric; the official client opens it, the lean client does not."
    )
    if off["latency_ms_p50"] is not None and lean["latency_ms_p50"] is not None:
        diff = off["latency_ms_p50"] - lean["latency_ms_p50"]
        lines.append(
            f"latency p50: official {off['latency_ms_p50']} ms, lean {lean['latency_ms_p50']} ms "
            f"(official {'+' if diff >= 0 else ''}{diff:.2f} ms); p99 official "
            f"{off['latency_ms_p99']} ms, lean {lean['latency_ms_p99']} ms"
        )
    return lines


TABLE_ROWS = [
    ("sent", "sent"),
    ("delivered", "delivered"),
    ("undelivered_at_end", "undelivered at end"),
    ("latency_ms_p50", "latency p50 ms"),
    ("latency_ms_p99", "latency p99 ms"),
    ("latency_ms_max", "latency max ms"),
    ("bench_latency_ms_p50", "  same, bench clock p50"),
    ("empty_answers", "empty answers"),
    ("broker_requests_per_message", "broker requests / msg"),
]


def table(rows: dict[str, dict]) -> str:
    lines: list[tuple[str, ...]] = [("", *CLIENTS)]

    def cell(v) -> str:
        return "-" if v is None else str(v)

    for key, label in TABLE_ROWS:
        lines.append((label, *(cell(rows[c][key]) for c in CLIENTS)))
    rpcs = sorted({r for c in CLIENTS for r in rows[c]["grpc_calls"]})
    for rpc in rpcs:
        lines.append(
            (
                f"grpc {rpc} / msg (total)",
                *(
                    f"{cell(rows[c]['grpc_calls_per_message'].get(rpc, 0))} "
                    f"({rows[c]['grpc_calls'].get(rpc, 0)})"
                    for c in CLIENTS
                ),
            )
        )
    granted = [rows[c]["granted_polling_ms"] for c in CLIENTS]
    lines.append(
        ("granted polling ms median", *(f"{g['median']} ({g['polls']} polls)" for g in granted))
    )
    received = [rows[c]["proxy_receives"] for c in CLIENTS]
    lines.append(
        ("proxy receives", *(f"{r['found']} found / {r['empty']} empty" for r in received))
    )
    lines.append(
        ("proxy wait ms mean", *(cell(rows[c]["proxy_receive_wait_ms_mean"]) for c in CLIENTS))
    )
    return aligned([list(line) for line in lines])


async def calibrate(args: argparse.Namespace) -> dict:
    order = list(CLIENTS)
    random.SystemRandom().shuffle(order)
    with tempfile.TemporaryDirectory(prefix="rmq-calibrate-") as tmp:
        tmp_path = Path(tmp)
        event_dir = tmp_path / "events"
        home = tmp_path / "home"
        home.mkdir()
        system = System(
            brokers=4,
            modes=("notify",),
            # JSON lines: read back while the proxy still writes them (read_events), which
            # a Parquet file without its footer cannot be.
            proxy_args={
                "notify": ["--event-log-dir", str(event_dir), "--event-log-format", "jsonl"]
            },
        )
        runs: dict[str, Run] = {}
        try:
            await system.start()
            proxy = system.proxies["notify"]
            for client in order:
                run = runs[client] = Run(client, f"calib-{client}", f"calib-{client}")
                await system.create_topic(run.topic)
                print(f"running {client} ...", flush=True)
                run.before = await scrape(proxy)
                t0 = time.monotonic()
                if client == "lean":
                    await run_lean(system, run, args)
                else:
                    await run_official(system, run, args, home)
                run.seconds = time.monotonic() - t0
                # Probes and parked pops of the last poll end within one polling time.
                await asyncio.sleep(args.await_s + 1)
                run.after = await scrape(proxy)
        finally:
            await system.stop()
        events = read_events(event_dir) if event_dir.exists() else []
    rows = {client: summarise(runs[client], events) for client in CLIENTS}
    return {
        "machine": machine(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "order": order,
        "workload": (
            f"1 consumer, await {args.await_s} s, batch 16, invisible 30 s, {args.messages} "
            f"messages of {BODY_BYTES} B, one every 200-500 ms (seed {args.seed}) to a random "
            "one of 4 brokers; notify proxy"
        ),
        "clients": rows,
        "verdict": verdict(rows),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=40)
    p.add_argument("--await-s", type=int, default=10, help="long-polling time, whole seconds")
    p.add_argument("--seed", type=int, default=7, help="the producer's RNG seed")
    p.add_argument("--out", type=Path, default=Path("results/bench"))
    args = p.parse_args()
    if args.messages < 1 or args.await_s < 1:
        p.error("--messages and --await-s must be positive")
    results = asyncio.run(calibrate(args))
    print(f"\nCalibration: {results['workload']}; order {' then '.join(results['order'])}")
    print(table(results["clients"]))
    print()
    for line in results["verdict"]:
        print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "calibration.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
