"""What registering the proxy's clients with the brokers costs the brokers: their extra
requests per client per minute (HEART_BEAT on the clients' behalf) and per consumer lag
refresh (GET_CONSUME_STATS), for one proxy and for a fleet of three, and the connections
they hold.

    .venv/bin/python -m bench.registration_cost [--clients 100] [--groups 10]
        [--rounds 3] [--fleets 1,3] [--out results/bench-registrations.json]
                                                          # make bench-registrations

Broker stubs (``--brokers``, 2) and, per fleet size, that many proxy processes; ``--clients``
lean consumers (SimpleConsumer settings over Telemetry, as the official clients open them)
of ``--groups`` groups on one topic, spread over the proxies in turn. Once every client is
registered, each proxy's own count of its broker requests is read just after one of its
heartbeat rounds (and lag refreshes) ends, and again ``--rounds`` rounds later: the
difference, by request code, is what the brokers served per round for the registrations
and per refresh for the lag (no client polls meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from proxy.loop import run_main
from proxy.processor.registrations import HEARTBEAT_S
from rocketmq_local import admin
from testkit.lean_client import SettingsClient
from testkit.processes import Process, System, scrape, status
from testkit.waits import wait_until

TOPIC = "RegistrationCost"


async def one_fleet(proxies: int, clients: int, groups: int, brokers: int, rounds: int) -> dict:
    system = System(brokers=brokers, modes=())
    await system.start()
    consumers: list[SettingsClient] = []
    try:
        namesrv = system.namesrv_address
        await asyncio.to_thread(admin.create_topic, namesrv, TOPIC, 4)
        for i in range(proxies):
            label = f"p{i}"
            system.proxies[label] = await system._spawn_proxy(label, namesrv, "notify", 1, [])
        fleet = list(system.proxies.values())
        for i in range(clients):
            proxy = fleet[i % proxies]
            client = SettingsClient(proxy.address["grpc"], f"cost-client-{i}")
            await client.prepare(f"CostGroup{i % groups}", TOPIC, 1000)
            consumers.append(client)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = [(await status(p))["registrations"] for p in fleet]
            if sum(s["clients"] for s in states) == clients and all(
                s["heartbeats_sent"] >= s["clients"] * brokers for s in states
            ):
                break
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"not every client registered: {states}")
        measured = await asyncio.gather(
            *(_per_round(p, "registrations", "rounds", "heart_beat", rounds) for p in fleet),
            *(_per_round(p, "consumer_lag", "refreshes", "get_consume_stats", rounds)
              for p in fleet),
        )  # fmt: skip
        states = [(await status(p))["registrations"] for p in fleet]
    finally:
        for client in consumers:
            await client.close()
        await system.stop()

    heartbeats = sum(measured[:proxies])  # per round (30 s), all proxies together
    stats = sum(measured[proxies:])  # per lag refresh, all proxies together
    return {
        "proxies": proxies,
        "clients": clients,
        "groups": groups,
        "brokers": brokers,
        "rounds": rounds,
        "heartbeats_per_round": heartbeats,
        "heartbeats_per_client_per_minute": round(heartbeats / clients * 60 / HEARTBEAT_S, 2),
        "consume_stats_per_refresh": stats,
        "consume_stats_per_group_per_refresh": round(stats / groups, 2),
        "connections_per_broker": sum(s["connections"] for s in states) / brokers,
        "heartbeat_s": HEARTBEAT_S,
    }


async def _per_round(proxy: Process, part: str, counter: str, code: str, rounds: int) -> float:
    """The broker requests of ``code`` one of the proxy's rounds makes (heartbeats or lag
    refreshes, counted in /v1/status under ``part``/``counter``), averaged over ``rounds``
    whole rounds: read just after a round ends, and just after the last one."""

    async def count() -> int:
        return int((await status(proxy))[part][counter])

    async def next_round_after(seen: int) -> int:
        latest = seen

        async def moved() -> bool:
            nonlocal latest
            latest = await count()
            return latest != seen

        await wait_until(moved, timeout=3 * HEARTBEAT_S, step=0.1, what=f"{part} {counter}")
        return latest

    first = await next_round_after(await count())
    before = (await scrape(proxy)).get(f"rpc:remoting:{code}", 0.0)
    last = first
    while last < first + rounds:
        last = await next_round_after(last)
    after = (await scrape(proxy)).get(f"rpc:remoting:{code}", 0.0)
    return (after - before) / (last - first)


async def main_async(args: argparse.Namespace) -> int:
    results = []
    for proxies in (int(n) for n in args.fleets.split(",")):
        result = await one_fleet(proxies, args.clients, args.groups, args.brokers, args.rounds)
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"fleets": results}, indent=1) + "\n")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="30 s rounds to average over")
    parser.add_argument("--fleets", default="1,3", help="proxy counts to measure, in turn")
    parser.add_argument("--out", type=Path)
    raise SystemExit(run_main(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
