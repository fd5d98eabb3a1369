"""``make simulate``: a fleet of proxies through the real receive code, on simulated time.

Plays the grid of docs/scale.md (proxies x active keys, for notify, coupled, notify with
the per-broker probe cap, and notify with one prober per key in the fleet), and the two
cases that ``make bench-modes`` also measures (sparse, idle fan-in), and writes
``results/sim/results.json`` plus the Markdown tables of docs/scale.md
(``results/sim/tables.md``). ``bench/sim/plot.py`` draws the chart from the JSON.
``--quick`` plays a small grid in well under a minute.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from bench.sim.brokers import TOTAL_LIMIT
from bench.sim.fleet import PROXY_MAX_IN_FLIGHT, Scenario, run

FLEET_SHARE = 80_000  # probes a fleet may park on one broker with the cap: 80 % of the limit


def cap_for(proxies: int) -> int:
    """receive.max_probes_per_broker for a fleet of ``proxies``."""
    return max(1, FLEET_SHARE // proxies)


def sampled_for(keys: int, cap: int, least: int = 4, per_slot: int = 4) -> int:
    """Keys to play: at least ``least``, and enough that the scaled cap is ``per_slot``."""
    n = least if not cap else max(least, math.ceil(per_slot * keys / cap))
    return min(n, keys)


def grid(args) -> list[dict]:
    out = []
    for variant in args.variants:
        capped, shared = variant.endswith("+cap"), variant.endswith("+shared")
        mode = variant.removesuffix("+cap").removesuffix("+shared")
        for p in args.proxies:
            for k in args.keys:
                cap = cap_for(p) if capped else 0
                scn = Scenario(
                    mode=mode,
                    proxies=p,
                    brokers=args.brokers,
                    keys=k,
                    consumers=args.consumers,
                    sampled=sampled_for(k, cap, least=args.least_sampled),
                    rate=args.rate,
                    warmup_s=args.warmup,
                    measure_s=args.measure,
                    probe_cap=cap,
                    shared=shared,
                    seed=args.seed,
                    extra={"variant": variant, "case": "grid"},
                )
                r = run(scn)
                out.append(r)
                _line(r)
    return out


def agreement(args) -> list[dict]:
    """The two cases make bench-modes measures, as it measures them (docs/performance.md)."""
    out = []
    for mode in ("notify", "coupled", "slicing", "adaptive"):
        scn = Scenario(
            mode=mode,
            proxies=1,
            brokers=4,
            keys=1,
            sampled=1,
            consumers=2,
            await_s=10,
            warmup_s=2,
            measure_s=24,  # 2 rounds of 12 s
            send_interval=(0.2, 0.5),
            seed=args.seed,
            extra={"variant": mode, "case": "sparse"},
        )
        out.append(run(scn))
        _line(out[-1])
    for polls in (2_000, 5_000):
        for mode in ("notify", "coupled"):
            scn = Scenario(
                mode=mode,
                proxies=1,
                brokers=4,
                keys=1,
                sampled=1,
                consumers=polls,
                rate=0,
                await_s=20,
                warmup_s=21,
                measure_s=10,
                seed=args.seed,
                extra={"variant": mode, "case": f"idle-{polls}"},
            )
            out.append(run(scn))
            _line(out[-1])
    return out


def _line(r: dict) -> None:
    s = r["scenario"]
    print(
        f"{s['case']:>9} {s['variant']:>11} P={s['proxies']:<3} B={s['brokers']:<2} "
        f"K={s['keys']:<6} C={s['consumers']:<5} sampled={s['sampled']:<3} "
        f"notif/broker={r['parked_notifications_mean']:>7} pops/broker={r['parked_pops_mean']:>7} "
        f"FULL/s/broker={r['polling_full_per_s']:>9} req/s/broker={r['broker_requests_per_s']:>9} "
        f"false-empty={r['false_empties']}/{r['empties']} p99={r['latency_ms']['p99']} ms "
        f"({r['wall_s']} s)",
        flush=True,
    )


def tables(results: list[dict]) -> str:
    grid_rows = [r for r in results if r["scenario"]["case"] == "grid"]
    lines = []
    if grid_rows:
        lines += [
            "| variant | P | K | parked per broker (notifications + pops) "
            "| POLLING_FULL /s per broker | broker requests /s per broker | polls per proxy "
            "| false empties | latency p50 / p99 (ms) | requests per message |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in grid_rows:
            s = r["scenario"]
            parked = r["parked_notifications_mean"] + r["parked_pops_mean"]
            flag = " **over**" if parked >= TOTAL_LIMIT * 0.99 else ""
            polls = r["polls_per_proxy_max"]
            pflag = " **over**" if polls > PROXY_MAX_IN_FLIGHT else ""
            lat = r["latency_ms"]
            lines.append(
                f"| {s['variant']} | {s['proxies']} | {s['keys']:,} | {parked:,}{flag} "
                f"| {r['polling_full_per_s']:,} | {r['broker_requests_per_s']:,} "
                f"| {polls:,}{pflag} "
                f"| {r['false_empties']} / {r['empties']} | {lat['p50']} / {lat['p99']} "
                f"| {r['broker_requests_per_message']} |"
            )
    other = [r for r in results if r["scenario"]["case"] != "grid"]
    if other:
        lines += [
            "",
            "| case | mode | delivered | latency p50 / p99 / max (ms) | false empties "
            "| requests per message | parked on all brokers (notifications / pops) "
            "| POLLING_FULL /s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in other:
            s = r["scenario"]
            lat = r["latency_ms"]
            lines.append(
                f"| {s['case']} | {s['variant']} | {r['delivered']} "
                f"| {lat['p50']} / {lat['p99']} / {lat['max']} | {r['false_empties']} "
                f"| {r['broker_requests_per_message']} "
                f"| {r['fleet_parked_notifications']:,} / {r['fleet_parked_pops']:,} "
                f"| {r['polling_full_per_s'] * s['brokers']:,} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/sim")
    ap.add_argument("--proxies", type=int, nargs="+", default=[10, 30, 100])
    ap.add_argument("--keys", type=int, nargs="+", default=[1_000, 10_000, 20_000, 50_000])
    ap.add_argument("--brokers", type=int, default=50)
    ap.add_argument("--consumers", type=int, default=100, help="per key")
    ap.add_argument("--rate", type=float, default=0.25, help="messages/s per key")
    ap.add_argument("--warmup", type=float, default=22.0)
    ap.add_argument("--measure", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--least-sampled", type=int, default=4, help="keys played at least (more: tighter p99)"
    )
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["notify", "coupled", "notify+cap", "notify+shared"],
        help="receive modes; +cap: with receive.max_probes_per_broker = 80,000 / P; "
        "+shared: one prober per key in the fleet (notify+shared)",
    )
    ap.add_argument("--no-agreement", action="store_true")
    ap.add_argument("--quick", action="store_true", help="P 1 10, K 100 1000, B 8, C 20")
    args = ap.parse_args(argv)
    if args.quick:
        args.proxies, args.keys, args.brokers, args.consumers = [1, 10], [100, 1_000], 8, 20
    started = time.perf_counter()
    results = [] if args.no_agreement else agreement(args)
    results += grid(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "tables.md").write_text(tables(results))
    print(tables(results))
    print(f"{len(results)} runs in {time.perf_counter() - started:.0f} s; {out}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
