"""The proxy benchmark: every receive mode side by side, in one run per scenario.

    .venv/bin/python -m tests.bench.bench_proxy [--scenarios sparse,busy,fanin,overhead]

Starts a name server, 4 brokers and one proxy per mode as separate processes on loopback,
drives them with a lean gRPC load generator (the calls the official SimpleConsumer makes),
prints a table per scenario, and writes results.json and PNG charts to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path

from tests.bench import scenarios
from tests.bench.processes import MODES, System


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"


def aligned(lines: list[list[str]]) -> str:
    """Rows of cells as left-aligned columns."""
    widths = [max(len(cell) for cell in column) for column in zip(*lines, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    )


def table(title: str, rows: dict[str, dict], columns: list[str]) -> str:
    head = ["mode", *columns]
    lines = [
        [mode, *("-" if row.get(c) is None else str(row.get(c)) for c in columns)]
        for mode, row in rows.items()
    ]
    return f"{title}\n{aligned([head, *lines])}"


SPARSE_COLUMNS = [
    "delivered",
    "latency_ms_p50",
    "latency_ms_p99",
    "latency_ms_max",
    "false_empties",
    "empty_answers",
    "broker_requests_per_message",
]
BUSY_COLUMNS = [
    "delivered_per_s",
    "receive_rate_per_s",
    "broker_requests_per_message",
    "proxy_cpu_s_per_1000",
]
FANIN_COLUMNS = [
    "polls_in_flight",
    "proxy_kb_per_poll",
    "proxy_kb_per_poll_from_zero",
    "broker_parked_pops",
    "broker_parked_notifications",
    "wakeup_ms_p50",
    "wakeup_ms_p99",
    "too_many_requests",
]


async def run(args: argparse.Namespace) -> dict:
    results: dict = {
        "machine": machine(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "args": vars(args),
    }
    wanted = args.scenarios.split(",")
    if set(wanted) - {"sparse", "busy", "fanin", "overhead"}:
        raise SystemExit(f"unknown scenario in {args.scenarios}")
    system = await System(brokers=4, modes=MODES).start()
    try:
        if "sparse" in wanted:
            results["sparse"] = await scenarios.sparse(
                system, rounds=args.rounds, slot_s=args.sparse_slot_s
            )
            print(
                table(
                    "\nSparse: 2 consumers, await 10 s, a message every 200-500 ms",
                    results["sparse"],
                    SPARSE_COLUMNS,
                ),
                flush=True,
            )
        if "busy" in wanted:
            results["busy"] = await scenarios.busy(
                system,
                rounds=args.rounds,
                slot_s=args.busy_slot_s,
                rate=args.busy_rate,
                consumers=args.busy_consumers,
            )
            print(
                table(
                    f"\nBusy: {args.busy_consumers} consumers, {args.busy_rate} msg/s",
                    results["busy"],
                    BUSY_COLUMNS,
                ),
                flush=True,
            )
        if "fanin" in wanted:
            results["fanin"] = {}
            for polls in args.fanin_polls:
                results["fanin"][polls] = await scenarios.fan_in(system, polls=polls)
                print(
                    table(
                        f"\nIdle fan-in: {polls} idle long polls on one proxy",
                        results["fanin"][polls],
                        FANIN_COLUMNS,
                    ),
                    flush=True,
                )
        if "overhead" in wanted:
            results["overhead"] = await scenarios.overhead(
                system,
                rounds=args.rounds,
                messages=args.overhead_messages,
                profile=str(args.out) if args.profile else None,
            )
            o = results["overhead"]
            print(
                f"\nOverhead: pop+ack through the proxy {o['proxy_msgs_per_s']} msg/s, "
                f"straight to the brokers {o['direct_msgs_per_s']} msg/s "
                f"({o['proxy_share_of_direct']:.0%})",
                flush=True,
            )
            for path, spent in o["cpu_ms_per_1000"].items():
                parts = ", ".join(f"{who} {ms_}" for who, ms_ in spent.items())
                print(f"  CPU ms per 1,000 messages, {path} path: {parts}", flush=True)
    finally:
        await system.stop()
    return results


def charts(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if "sparse" in results:
        fig, ax = plt.subplots(figsize=(7, 4))
        for mode, row in results["sparse"].items():
            values = sorted(row["latencies_ms"])
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=mode)
        ax.set_xscale("log")
        ax.set_xlabel("delivery latency, send acknowledged to received (ms, log)")
        ax.set_ylabel("share of messages")
        ax.set_title("Sparse scenario: delivery latency by mode")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "latency_by_mode.png", dpi=120)
        written.append("latency_by_mode.png")
    if "sparse" in results or "busy" in results:
        fig, ax = plt.subplots(figsize=(7, 4))
        for mode in MODES:
            points = [
                (
                    results[s][mode]["receive_rate_per_s"],
                    results[s][mode]["broker_requests_per_message"],
                )
                for s in ("sparse", "busy")
                if s in results and results[s][mode]["broker_requests_per_message"] is not None
            ]
            if points:
                ax.plot(*zip(*sorted(points), strict=True), marker="o", label=mode)
        ax.set_xscale("log")
        ax.set_xlabel("client receive requests per second (log)")
        ax.set_ylabel("broker requests per delivered message")
        ax.set_title("Broker cost against request rate")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "broker_requests_vs_rate.png", dpi=120)
        written.append("broker_requests_vs_rate.png")
    return written


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--scenarios", default="sparse,busy,fanin,overhead")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per scenario")
    p.add_argument("--sparse-slot-s", type=float, default=12.0)
    p.add_argument("--busy-slot-s", type=float, default=8.0)
    p.add_argument("--busy-rate", type=int, default=1000, help="messages per second produced")
    p.add_argument("--busy-consumers", type=int, default=64)
    p.add_argument(
        "--fanin-polls", type=lambda s: [int(x) for x in s.split(",")], default=[2000, 5000]
    )
    p.add_argument("--overhead-messages", type=int, default=20_000)
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the notify proxy during the overhead scenario (speedscope JSON in --out)",
    )
    p.add_argument("--out", default="results/bench", help="directory for results.json and charts")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import uvloop

        results = uvloop.run(run(args))
    except ImportError:
        results = asyncio.run(run(args))
    results["charts"] = charts(results, out)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {out / 'results.json'} and {', '.join(results['charts'])}")


if __name__ == "__main__":
    main()
