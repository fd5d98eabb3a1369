"""The proxy benchmark: every receive mode side by side, in one run per scenario.

    .venv/bin/python -m bench.bench_proxy [--scenarios sparse,busy,fanin,phased,overhead,filtered]
    .venv/bin/python -m bench.bench_proxy --backend real   # sparse on real RocketMQ
    .venv/bin/python -m bench.bench_proxy --scenarios overhead --modes notify --client-tls

Starts a name server, 4 brokers and one proxy per mode as separate processes on loopback,
drives them with a lean gRPC load generator (the calls the official SimpleConsumer makes),
prints a table per scenario and a summary of all of them (broker requests per delivered
message, TOO_MANY_REQUESTS, latency, and whether adaptive kept up with the better of notify
and coupled), and writes results.json and PNG charts to --out.

``--backend real`` runs the same scenario code against Apache RocketMQ 5 (the jars of
``make rocketmq``): a real name server and 3 real brokers (Profile.BENCH JVMs) from
rocketmq_local/launcher.py, the sparse scenario, modes notify, adaptive and coupled.

The proxies run with their defaults (``security.tls_mode = permissive``: the port takes
TLS and plaintext clients through the front) and whatever ``RMQ_PROXY_*`` this process's
environment holds, e.g. ``RMQ_PROXY_SECURITY_TLS_MODE=enforcing`` (gRPC serves TLS itself,
no front; needs ``--client-tls``). ``--client-tls``: the load generator's clients connect
over TLS, trusting the certificate each proxy presents (its self-signed one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path

import aiohttp

from bench import scenarios
from proxy.loop import run_main
from testkit.lean_client import TLS_ENDPOINTS, server_tls
from testkit.processes import BACKENDS, MODES, System, quiet_collector

# What each backend runs when no flag says otherwise. The real backend measures the sparse
# case only: fan-in counts parked requests with the stub's POLLING_INFO, and the busy and
# overhead scenarios are not yet checked against real brokers.
DEFAULTS = {
    "stub": {"brokers": 4, "modes": ",".join(MODES),
             "scenarios": "sparse,busy,fanin,phased,overhead,filtered",
             "rounds": 2, "sparse_warmup_s": 0.0},
    "real": {"brokers": 3, "modes": "notify,adaptive,coupled", "scenarios": "sparse",
             "rounds": 3, "sparse_warmup_s": 5.0},
}  # fmt: skip
REAL_SCENARIOS = {"sparse"}


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


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
    "send_retries",
]
FILTERED_COLUMNS = [
    "delivered",
    "latency_ms_p50",
    "latency_ms_p99",
    "false_empties",
    "broker_requests_per_message",
    "undelivered_at_end",
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
    "broker_requests_per_message",
    "coupled_share",
]
PHASED_COLUMNS = [
    "delivered",
    "broker_requests_per_message",
    "too_many_requests",
    "latency_ms_p50",
    "latency_ms_p99",
    "coupled_share",
    "adaptive_mode_at_end",
    "handed_back",
]
SCENARIOS = ("sparse", "busy", "fanin", "phased", "overhead", "filtered")


def summary_rows(results: dict) -> dict[str, dict[str, dict]]:
    """Every measured case (a scenario, a fan-in size, a phase) -> mode -> broker requests
    per delivered message, TOO_MANY_REQUESTS answered, latency p50 / p99 (delivery, or
    wake-up for idle polls)."""
    cases: dict[str, dict[str, dict]] = {}

    def row(r: dict, p50: str, p99: str) -> dict:
        return {
            "broker_requests_per_message": r.get("broker_requests_per_message"),
            "too_many_requests": r.get("too_many_requests", 0),
            "latency_ms_p50": r.get(p50),
            "latency_ms_p99": r.get(p99),
        }

    for name in ("sparse", "busy"):
        if name in results:
            cases[name] = {m: row(r, "latency_ms_p50", "latency_ms_p99")
                           for m, r in results[name].items()}  # fmt: skip
    for polls, by_mode in results.get("fanin", {}).items():
        cases[f"fanin {polls}"] = {m: row(r, "wakeup_ms_p50", "wakeup_ms_p99")
                                   for m, r in by_mode.items()}  # fmt: skip
    if "phased" in results:
        for phase in ("quiet", "busy", "idle"):
            cases[f"phased: {phase}"] = {
                m: row(phases[phase], "latency_ms_p50", "latency_ms_p99")
                for m, phases in results["phased"].items()
            }
    return cases


def verdicts(cases: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per case: is adaptive within 10 % of the better of notify and coupled on broker
    requests per message, and does it answer TOO_MANY_REQUESTS only where notify does."""
    out = {}
    for case, by_mode in cases.items():
        if not {"adaptive", "notify", "coupled"} <= by_mode.keys():
            continue
        costs = [by_mode[m]["broker_requests_per_message"] for m in ("notify", "coupled")]
        costs = [c for c in costs if c is not None]
        mine = by_mode["adaptive"]["broker_requests_per_message"]
        best = min(costs) if costs else None
        out[case] = {
            "best_of_notify_coupled": best,
            "adaptive": mine,
            "within_10_percent": None if mine is None or best is None else mine <= 1.1 * best,
            "no_too_many_where_notify_has_none": not (
                by_mode["notify"]["too_many_requests"] == 0
                and by_mode["adaptive"]["too_many_requests"] > 0
            ),
        }
    return out


def _n(value: object) -> str:
    return "-" if value is None else str(value)


def summary_table(cases: dict[str, dict[str, dict]], checks: dict[str, dict]) -> str:
    modes = sorted(  # labels: a mode, with -w<N> for a proxy of N workers
        {m for by_mode in cases.values() for m in by_mode},
        key=lambda m: (MODES.index(m.split("-w")[0]), m),
    )
    head = ["case", *(f"{m}: req/msg, TMR, p50/p99 ms" for m in modes), "adaptive within 10 %"]
    lines = [head]
    for case, by_mode in cases.items():
        cells = [case]
        for m in modes:
            r = by_mode.get(m)
            cells.append("-" if r is None else
                         f"{r['broker_requests_per_message']}, {r['too_many_requests']}, "
                         f"{_n(r['latency_ms_p50'])}/{_n(r['latency_ms_p99'])}")  # fmt: skip
        c = checks.get(case)
        cells.append("-" if c is None else
                     f"{c['within_10_percent']} (best {c['best_of_notify_coupled']}), "
                     f"TMR ok {c['no_too_many_where_notify_has_none']}")  # fmt: skip
        lines.append(cells)
    return aligned(lines)


async def proxy_security(system: System) -> dict[str, dict]:
    """Each proxy's TLS mode and its front's connections by kind, from /v1/status (None
    for a proxy that predates the TLS modes, or a supervisor of workers)."""
    out = {}
    async with aiohttp.ClientSession() as http:
        for label, proxy in system.proxies.items():
            async with http.get(f"http://{proxy.address['http']}/v1/status") as response:
                security = (await response.json()).get("security") or {}
            out[label] = {"tls_mode": security.get("tls_mode"), "front": security.get("front")}
    return out


async def run(args: argparse.Namespace) -> dict:
    results: dict = {
        "machine": machine(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "args": vars(args),
        "load_average_1_5_15": {"start": load_average()},
        "proxy_tls_mode": os.environ.get("RMQ_PROXY_SECURITY_TLS_MODE", "permissive (default)"),
    }
    wanted = args.scenarios.split(",")
    if set(wanted) - set(SCENARIOS):
        raise SystemExit(f"unknown scenario in {args.scenarios}")
    modes = tuple(args.modes.split(","))
    if set(modes) - set(MODES):
        raise SystemExit(f"unknown mode in {args.modes}")
    if args.backend == "real" and set(wanted) - REAL_SCENARIOS:
        raise SystemExit(f"--backend real runs only {sorted(REAL_SCENARIOS)} so far")
    if "overhead" in wanted and "notify" not in modes:
        raise SystemExit("the overhead scenario needs the notify mode")
    started = time.monotonic()
    system = await System(
        brokers=args.brokers, modes=modes, backend=args.backend, workers=args.workers
    ).start()
    results["system_start_s"] = round(time.monotonic() - started, 1)
    if args.client_tls:
        for proxy in system.proxies.values():
            address = proxy.address["grpc"]
            TLS_ENDPOINTS[address] = await asyncio.to_thread(server_tls, address)
    backend = f"{args.brokers} {'real RocketMQ' if args.backend == 'real' else 'stub'} brokers"
    print(f"{backend} and {len(system.proxies)} proxies ready in {results['system_start_s']} s "
          f"(tls_mode {results['proxy_tls_mode']}, clients over "
          f"{'TLS' if args.client_tls else 'plaintext'}); load average {load_average()}",
          flush=True)  # fmt: skip
    try:
        if "sparse" in wanted:
            results["sparse"] = await scenarios.sparse(
                system,
                rounds=args.rounds,
                slot_s=args.sparse_slot_s,
                warmup_s=args.sparse_warmup_s,
            )
            results["load_average_1_5_15"]["after_sparse"] = load_average()
            print(
                table(
                    f"\nSparse ({backend}): 2 consumers, await 10 s, a message every "
                    f"200-500 ms; load average {load_average()}",
                    results["sparse"],
                    SPARSE_COLUMNS,
                ),
                flush=True,
            )
            print("per slot: latency p50 / max ms, messages over 20 ms, 1-min load at start")
            for mode, row in results["sparse"].items():
                cells = [
                    f"r{s['round']} {s['latency_ms_p50']} / {s['latency_ms_max']}, "
                    f"{s['over_20_ms']}, {s['load_1m'][0]}"
                    for s in row["slots"]
                ]
                print(f"  {mode:<9} " + " | ".join(cells), flush=True)
        if "filtered" in wanted:
            results["filtered"] = await scenarios.filtered(
                system, rounds=args.rounds, slot_s=args.filtered_slot_s, rate=args.filtered_rate
            )
            for kind, rows in results["filtered"].items():
                print(
                    table(
                        f"\nFiltered ({kind}): 2 consumers matching 1 message in 10 of "
                        f"{args.filtered_rate:g} msg/s",
                        rows,
                        FILTERED_COLUMNS,
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
        if "phased" in wanted:
            results["phased"] = await scenarios.phased(
                system,
                quiet_s=args.phased_quiet_s,
                busy_s=args.phased_busy_s,
                rate=args.busy_rate,
                busy_consumers=args.busy_consumers,
                busy_batch=args.phased_batch,
                work_ms=args.phased_work_ms,
                idle_polls=args.phased_idle_polls,
            )
            for phase in ("quiet", "busy", "idle"):
                print(
                    table(
                        f"\nPhased, {phase}: one group and topic per mode through quiet "
                        f"({args.phased_quiet_s:g} s), busy ({args.phased_busy_s:g} s, "
                        f"{args.busy_consumers} consumers, {args.phased_work_ms:g} ms per "
                        f"message), idle ({args.phased_idle_polls} polls); load average "
                        f"{load_average()}",
                        {m: p[phase] for m, p in results["phased"].items()},
                        PHASED_COLUMNS,
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
            for path, rate in o["msgs_per_s"].items():
                print(f"  {path}: {rate} msg/s, receive p50 {o['receive_ms_p50'][path]} ms, "
                      f"p99 {o['receive_ms_p99'][path]} ms", flush=True)  # fmt: skip
            for path, spent in o["cpu_ms_per_1000"].items():
                parts = ", ".join(f"{who} {ms_}" for who, ms_ in spent.items())
                print(f"  CPU ms per 1,000 messages, {path} path: {parts}", flush=True)
        results["proxy_security"] = await proxy_security(system)
        print(f"\nTLS mode and the front's connections: {results['proxy_security']}", flush=True)
    finally:
        await system.stop()
    results["load_average_1_5_15"]["end"] = load_average()
    cases = summary_rows(results)
    if cases:
        results["summary"] = cases
        results["verdicts"] = verdicts(cases)
        loads = results["load_average_1_5_15"]
        print(f"\nSummary; load average 1/5/15 min at start {loads['start']}, at end "
              f"{loads['end']}")  # fmt: skip
        print(summary_table(cases, results["verdicts"]), flush=True)
    return results


def charts(results: dict, out: Path) -> list[str]:
    try:
        import matplotlib
    except ImportError:  # the bench extra (make bench-modes installs it)
        print("matplotlib not installed: no charts (pip install -e '.[bench]')")
        return []

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
        for mode in results["args"]["modes"].split(","):
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
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="stub",
        help="stub: our broker_stub; real: Apache RocketMQ 5 brokers (make rocketmq)",
    )
    p.add_argument("--brokers", type=int, help="default 4 stubs, 3 real brokers")
    p.add_argument("--modes", help="comma-separated; default all four (stub), "
                   "notify,adaptive,coupled (real)")  # fmt: skip
    p.add_argument(
        "--scenarios",
        help="default sparse,busy,fanin,phased,overhead,filtered (stub), sparse (real)",
    )
    p.add_argument(
        "--rounds", type=int, help="interleaved rounds per scenario (default 2 stub, 3 real)"
    )
    p.add_argument("--sparse-slot-s", type=float, default=12.0)
    p.add_argument(
        "--sparse-warmup-s",
        type=float,
        help="an unmeasured sparse slot per mode first (default 0 on stubs, 5 s on real)",
    )
    p.add_argument("--filtered-slot-s", type=float, default=12.0)
    p.add_argument(
        "--filtered-rate", type=float, default=50.0, help="messages per second, 1 in 10 matching"
    )
    p.add_argument("--busy-slot-s", type=float, default=8.0)
    p.add_argument("--busy-rate", type=int, default=1000, help="messages per second produced")
    p.add_argument("--busy-consumers", type=int, default=64)
    p.add_argument(
        "--fanin-polls", type=lambda s: [int(x) for x in s.split(",")], default=[2000, 5000]
    )
    p.add_argument("--phased-quiet-s", type=float, default=12.0)
    p.add_argument("--phased-busy-s", type=float, default=12.0)
    p.add_argument(
        "--phased-batch", type=int, default=4, help="messages per receive in the busy phase"
    )
    p.add_argument(
        "--phased-work-ms",
        type=float,
        default=80.0,
        help="a busy-phase consumer's time per message (64 x 1/80 ms = 800 msg/s < 1,000)",
    )
    p.add_argument("--phased-idle-polls", type=int, default=2000)
    p.add_argument("--overhead-messages", type=int, default=20_000)
    p.add_argument(
        "--workers",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        default=(1,),
        help="worker counts (rmq-proxy --workers) of each mode's proxy, e.g. 1,2: a proxy "
        "per count, side by side; the overhead scenario runs a path per notify proxy",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the notify proxy during the overhead scenario (speedscope JSON in --out)",
    )
    p.add_argument(
        "--client-tls",
        action="store_true",
        help="the clients connect over TLS, trusting each proxy's own certificate",
    )
    p.add_argument("--out", default="results/bench", help="directory for results.json and charts")
    args = p.parse_args()
    for name, value in DEFAULTS[args.backend].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quiet_collector()
    results = run_main(run(args))
    results["charts"] = charts(results, out)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {', '.join([str(out / 'results.json'), *results['charts']])}")


if __name__ == "__main__":
    main()
