"""Head to head with the Apache RocketMQ proxy (issue 12), in one run.

    .venv/bin/python -m bench.peer
        [--scenarios reported,lite,priority,sparse,busy,fanin,remoting,overhead,stub]
        [--rounds 2] [--out results/bench-peer]        # make bench-peer

One real cluster (Apache RocketMQ 5.5.0 from ``make rocketmq``: a name server and 2 brokers,
Profile.BENCH JVMs) with the Apache proxy (cluster mode) in front, and our proxy in
``notify``, ``adaptive`` and ``coupled`` on the same brokers; every scenario runs them in
shuffled order within each round. ``stub`` then runs sparse and busy on our proxy over
broker stubs, as ``make bench-modes`` does, in the same run (after the real ones).

Scenarios:

- ``reported``: apache/rocketmq#9145. One official Python SimpleConsumer
  (``official_consumer.py`` in ``.venv-interop``, await 10 s) per proxy; messages sent one
  at a time, at random intervals, each to a random broker. False empties and
  send-to-receive latency (wall clock in both processes).
- ``sparse``, ``busy``: scenarios.py's code unchanged, with the Apache proxy as one more
  "mode". The lean load generator sends its settings over Telemetry first, as the official
  clients do (``SettingsClient``): the Apache proxy reads a receive's subscription from them.
- ``lite``: lite topics (RocketMQ 5.5): official Python lite consumers of one group
  subscribed to 1,000 and 10,000 lite topics under one parent, messages at random intervals
  to random lite topics. LitePushConsumers on every proxy; LiteSimpleConsumers on ours only
  (the Apache proxy 5.5.0 refuses them).
- ``priority``: priority messages (RocketMQ 5.4+): a backlog of priority-0 messages on a
  PRIORITY topic, then a few priority-3 ones; one consumer receiving through each proxy:
  the time until every high one is in, and how many low ones came first.
- ``remoting``: the remoting port (``bench/remoting_peer.py``): the official Java client
  5.5.0's DefaultMQProducer and DefaultMQPushConsumer (the 4.x API) through ours and the
  Apache proxy's remoting port: sends and deliveries per second, latency p50 / p99.
- ``fanin``: idle long polls on each proxy in turn: RSS per poll (slope from half to all of
  the polls) of each proxy process, and pops parked on the brokers (POLLING_INFO). The
  clients share a connection; ``--fanin-own-connections`` gives each its own, as separate
  applications have (over TLS each has its own either way: grpcio shares no TLS connection
  between channels).
- ``overhead``: pop+ack of a backlog through each proxy and straight to the brokers:
  msg/s and CPU ms per 1,000 messages of the proxy, the brokers and the load generator.

``--client-tls``: the lean clients connect to every proxy over TLS, trusting the certificate
it presents (the Apache proxy's test-mode one, ours self-signed; both serve TLS beside
plaintext by default).

Broker requests are counted on the brokers' side for every proxy (the brokers' own
``rocketmq_rpc_latency`` histogram, Prometheus exporter, summed per request code over the
slots of that proxy): the Apache proxy has no count of its own broker requests. Our proxies
also count them themselves (``rocketmq_proxy_rpc_latency``); both are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from bench import scenarios
from bench.bench_proxy import aligned, load_average, machine
from bench.calibrate_client import DRIVER, INTEROP_PYTHON
from bench.scenarios import ModeTally, ms, percentile
from proxy.loop import run_main
from proxy.receive.timeline import timelines
from proxy.receive.types import PolledMessage
from proxy.remoting.answers import BrokerError
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.lite import lite_queue_index
from proxy.remoting.message import Prop
from rocketmq_local import admin
from rocketmq_local.admin import wait_visible
from testkit.lean_client import TLS_ENDPOINTS, LeanClient, SettingsClient, server_tls
from testkit.metrics_text import every_sample
from testkit.processes import Process, System, established_to, proxy_label, quiet_collector

PEER = "apache"  # the Apache RocketMQ proxy 5.5.0 (cluster mode, its JVM from the launcher)
RUST = "rust"  # the rocketmq-rust project's proxy, rocketmq-proxy 1.0.0 (scripts/rust-proxy.sh)
# Proxies that are not ours: they count no broker requests of their own, so theirs are
# counted on the brokers' side.
FOREIGN = (PEER, RUST)
RUST_BUILD = Path(__file__).resolve().parents[1] / "scripts" / "rust-proxy.sh"
RUST_BINARY = Path(__file__).resolve().parents[1] / ".cache/rust-proxy/bin/rocketmq-proxy-rust"
OURS = ("notify", "adaptive", "coupled")
# Requests of the harness itself (sends, topic and group creation, POLLING_INFO), left
# out of a proxy's broker requests counted on the brokers' side.
HARNESS_CODES = {
    "send_message", "send_message_v2", "send_batch_message", "update_and_create_topic",
    "update_and_create_subscriptiongroup", "polling_info", "get_broker_runtime_info",
}  # fmt: skip


# -- the load generator's client: settings over Telemetry first -----------------------------


# -- the system: a real cluster with the Apache proxy, broker metrics on --------------------


async def start_rust_proxy(binary: Path, namesrv: str, ready_s: float = 60.0) -> Process:
    """The Rust proxy in cluster mode on a free port, in front of ``namesrv``; ready once it
    answers a QueryRoute (any status: it is serving). RuntimeError saying why otherwise."""
    from rocketmq_local.launcher import free_port_block

    port = free_port_block()
    log_path = binary.parent.parent / "rust-proxy.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            str(binary), "--mode", "cluster", "--namesrvAddr", namesrv,
            "--grpcListenAddr", f"127.0.0.1:{port}",
            stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    process = Process(RUST, proc, {"grpc": f"127.0.0.1:{port}"})
    client = LeanClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + ready_s
    try:
        while True:
            if proc.returncode is not None:
                tail = log_path.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"it exited with code {proc.returncode}: {tail}")
            try:
                await asyncio.wait_for(client.query_route("bench-warm-up"), 3)
                return process
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    return process  # it answered: serving (the topic is created later)
            except TimeoutError:
                pass
            if time.monotonic() > deadline:
                proc.kill()
                await proc.wait()
                raise RuntimeError(f"no gRPC answer within {ready_s:.0f} s")
            await asyncio.sleep(0.5)
    finally:
        await client.close()


def build_rust_proxy() -> tuple[Path | None, str | None]:
    """scripts/rust-proxy.sh (cargo, once, cached under .cache/rust-proxy): the binary, or
    None and why not."""
    import subprocess

    done = subprocess.run([str(RUST_BUILD)], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not RUST_BINARY.exists():
        return None, f"it did not build ({RUST_BUILD.name}): {done.stderr.strip()[-1500:]}"
    return RUST_BINARY, None


class PeerSystem(System):
    """``System(backend="real")`` plus the Apache proxy (``proxies["apache"]``, its JVM) and
    the brokers' Prometheus exporters, from which broker requests are counted per slot."""

    def __init__(
        self,
        brokers: int = 2,
        modes=OURS,
        apache: bool = True,
        rust: Path | None = None,
        notify_workers=(1,),
        proxy_log_level: str = "warning",
        log_dir: Path | None = None,
    ) -> None:
        # Our proxies' log level: "debug" logs each poll's stages (proxy/receive/timeline.py).
        levels = {m: ["--log-level", proxy_log_level] for m in ("notify", "adaptive", "coupled")}
        super().__init__(
            brokers=brokers, modes=modes, backend="real", proxy_args=levels, log_dir=log_dir
        )
        # Notify proxies of more workers (``rmq-proxy --workers N``), beside the others.
        for n in notify_workers:
            self.proxy_specs[proxy_label("notify", n)] = ("notify", n)
        self.modes = tuple(self.proxy_specs)
        self.apache = apache
        self.rust = rust  # the Rust proxy's binary, to run beside the others
        self.rust_missing: str | None = None  # why it is not running, when asked for
        self.metrics_ports: dict[str, int] = {}
        self.broker_side: dict[str, Counter] = {}
        self._at_start: Counter | None = None

    async def _start_real(self) -> str:
        from rocketmq_local.launcher import Profile, RealCluster, free_port_block

        def conf_of(name: str) -> dict[str, str]:
            port = self.metrics_ports.setdefault(name, free_port_block())
            return {
                "metricsExporterType": "PROM",
                "metricsPromExporterHost": "127.0.0.1",
                "metricsPromExporterPort": str(port),
            }

        self.cluster = await asyncio.to_thread(
            RealCluster.start,
            self.broker_count,
            profile=Profile.BENCH,
            apache_proxy=self.apache,
            broker_conf_of=conf_of,
        )
        c = self.cluster
        self.namesrv = Process("namesrv", c.namesrv.popen, {"remoting": c.namesrv_address})
        for b in c.brokers:
            self.brokers.append(Process(b.name, b.process.popen, {"remoting": b.address}))
            self.broker_clients.append(scenarios_broker_client(b.name, b.address))
        if c.proxy is not None:
            apache = c.proxy
            self.proxies[PEER] = Process(PEER, apache.process.popen, {"grpc": apache.grpc_address})
            self.modes = (PEER, *self.modes)
        if self.rust is not None:
            try:
                self.proxies[RUST] = await start_rust_proxy(self.rust, c.namesrv_address)
                self.modes = (RUST, *self.modes)
            except RuntimeError as exc:
                self.rust_missing = str(exc)
                print(f"the Rust proxy does not run: {exc}", flush=True)
        return c.namesrv_address

    async def start(self) -> PeerSystem:
        await super().start()
        try:
            await self.warm_brokers()
        except BaseException:
            await self.stop()
            raise
        return self

    async def warm_brokers(self, groups: int = 8) -> None:
        """Before any scenario, pop a message from every broker with a few new groups. A
        broker's first pops after it started are its slowest: on a fresh 5.5.0 cluster at
        load 25-35 the first pop that found a message took 0.8-0.9 s, the first empty one
        0.2-0.5 s, and both settled to 10-90 ms after 4-5 groups. Without this, whichever
        proxy comes first in round 0 of the reported case pays for it in its first
        message, and not because it is cold itself (issue 26)."""
        topic = "bench-warm-up"
        await self.create_topic(topic)
        for n in range(groups):
            group = f"bench-warm-up-{n}"
            for client in self.broker_clients:
                await client.send(topic, b"warm-up", properties={Prop.UNIQ_KEY: uuid.uuid4().hex})
                popped = await client.pop(
                    group, topic, max_nums=16, invisible_ms=30_000, poll_ms=0, timeout=30
                )
                for message in popped.messages:
                    handle = PolledMessage(client.name, group, message).popped
                    await client.ack(group, handle.topic, handle.checkpoint, timeout=10)

    async def stop(self) -> None:
        # The launcher stops the Apache proxy's JVM (by pid) with the cluster.
        self.proxies.pop(PEER, None)
        await super().stop()

    async def broker_counts(self) -> Counter:
        """Requests every broker has answered so far, by request code (all brokers)."""
        totals: Counter = Counter()
        async with aiohttp.ClientSession() as http:
            for port in self.metrics_ports.values():
                async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                    text = await response.text()
                for name, labels, value in every_sample(text):
                    counted = name.startswith("rocketmq_rpc_latency") and name.endswith("_count")
                    if counted and "request_code" in labels:
                        totals[labels["request_code"].lower()] += int(value)
        return totals

    def reset_counts(self) -> None:
        self.broker_side = {label: Counter() for label in self.modes}

    async def slot_edge(self, label: str, starting: bool) -> None:
        counts = await self.broker_counts()
        if starting:
            self._at_start = counts
            return
        side = self.broker_side.setdefault(label, Counter())
        for code, n in counts.items():
            if code not in HARNESS_CODES:
                side[code] += n - (self._at_start or Counter()).get(code, 0)

    async def metrics(self, label: str) -> dict[str, float]:
        if label in FOREIGN:  # the brokers' count over its slots, as if it were its own
            return {f"rpc:remoting:{c}": n for c, n in self.broker_side.get(label, {}).items()}
        return await super().metrics(label)

    async def parked_pops(self, group: str, topic: str, queues: int = 4) -> int:
        """POP requests parked on all brokers for (group, topic): POLLING_INFO per queue
        (a real broker counts parked pops per queue, -1 for "any queue"; it has no count
        of parked NOTIFICATION requests)."""
        total = 0
        for client in self.broker_clients:
            for queue in range(-1, queues):
                response = await client.remoting.invoke(
                    RemotingCommand(
                        RequestCode.POLLING_INFO,
                        {"consumerGroup": group, "topic": topic, "queueId": str(queue)},
                    ),
                    3.0,
                )
                if response.code == 0:
                    total += int(response.fields.get("pollingNum", 0))
        return total


def scenarios_broker_client(name: str, address: str):
    from proxy.remoting.broker_client import BrokerClient

    return BrokerClient(name, address)


def broker_side_summary(system: PeerSystem, rows: dict[str, dict]) -> None:
    """Add the brokers' count of each proxy's requests to its row of a scenario."""
    for label, row in rows.items():
        side = system.broker_side.get(label, Counter())
        total = sum(side.values())
        row["broker_requests_brokers_count"] = round(total)
        row["broker_requests_by_code_brokers_count"] = {str(c): round(n) for c, n in side.items()}
        delivered = row.get("delivered")
        row["broker_requests_per_message_brokers_count"] = (
            round(total / delivered, 2) if delivered else None
        )


# -- the reported case: one official SimpleConsumer per proxy -------------------------------


async def _official(system: PeerSystem, label: str, topic: str, group: str, await_s: int,
                    home: Path, work, *, consumers: int = 1, extra: tuple[str, ...] = (),
                    ready_s: float = 90,
                    graceful: bool = True) -> tuple[list[dict], list[str]]:  # fmt: skip
    """Run ``consumers`` official consumers on ``label``'s proxy while ``work()`` runs; their
    events, each with ``c``, the consumer's index. ``extra``: more driver arguments (a lite
    consumer's); ``ready_s``: how long each may take to start (a lite consumer subscribes
    one lite topic at a time); ``graceful=False``: kill them once ``work()`` is done rather
    than wait for the receive in progress (up to ``await_s``) to end."""
    env = dict(os.environ, HOME=str(home))
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    procs: list[asyncio.subprocess.Process] = []
    events: list[dict] = []
    errors: list[str] = []
    readers: list[asyncio.Future] = []
    try:
        for c in range(consumers):
            stderr_path = home / f"official-{topic}-{c}.stderr"
            with stderr_path.open("wb") as stderr:
                procs.append(await asyncio.create_subprocess_exec(
                    str(INTEROP_PYTHON), str(DRIVER),
                    "--endpoint", system.proxies[label].address["grpc"],
                    "--group", group, "--topic", topic, "--await-seconds", str(await_s),
                    "--deadline-seconds", "900", *extra,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=stderr, env=env,
                ))  # fmt: skip

        async def started(c: int, proc) -> None:
            line = await asyncio.wait_for(proc.stdout.readline(), ready_s)
            if not line.strip() or json.loads(line).get("event") != "ready":
                text = (home / f"official-{topic}-{c}.stderr").read_text(errors="replace")
                raise RuntimeError(f"official consumer {c} did not start on {label}: "
                                   f"{line!r}: {text[-1500:]}")  # fmt: skip
            events.append(json.loads(line) | {"c": c})

        await asyncio.gather(*(started(c, p) for c, p in enumerate(procs)))

        async def read(c: int, proc) -> None:
            while line := await proc.stdout.readline():
                events.append(json.loads(line) | {"c": c})

        readers = [asyncio.ensure_future(read(c, p)) for c, p in enumerate(procs)]
        await work(events)
        for proc in procs:
            if not graceful:
                proc.kill()
                continue
            assert proc.stdin is not None  # PIPE
            proc.stdin.write(b"stop\n")
            await proc.stdin.drain()
            proc.stdin.close()
        for proc in procs:
            await asyncio.wait_for(proc.wait(), await_s + 30)
        await asyncio.wait_for(asyncio.gather(*readers), 5)
    finally:
        for reader in readers:
            if not reader.done():
                reader.cancel()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    errors += [e["error"] for e in events if e["event"] == "error"]
    return events, errors


async def send_one_at_a_time(
    brokers: list, topic: str, rng: random.Random, slot_s: float, gap_s: tuple[float, float],
    await_s: int, sent: dict[str, float], events: list[dict],
) -> int:  # fmt: skip
    """The reported case's producer: once the first receive is out, one message at a time
    at random intervals (``gap_s``), each to a random broker, for ``slot_s``; then wait (at
    most ``await_s`` + 5 s) until the consumer's ``events`` have every one. Each send goes
    into ``sent`` (id -> epoch seconds). How many sends were retried (SYSTEM_BUSY)."""
    retries = 0
    await asyncio.sleep(1.0)  # the first receive is out
    end = time.time() + slot_s
    while time.time() < end:
        await asyncio.sleep(rng.uniform(*gap_s))
        msg_id = uuid.uuid4().hex.upper()
        for attempt in range(3):
            try:
                await rng.choice(brokers).send(topic, b"x" * 64, properties={Prop.UNIQ_KEY: msg_id})
                break
            except BrokerError as exc:
                if exc.code != ResponseCode.SYSTEM_BUSY or attempt == 2:
                    raise
                retries += 1
        sent[msg_id] = time.time()
    await until_received(events, sent, await_s + 5)
    return retries


async def until_received(events: list[dict], sent: dict[str, float], within_s: float) -> None:
    """Wait (at most ``within_s``) until the consumers' ``events`` hold every id in ``sent``."""
    end = time.time() + within_s
    while time.time() < end:
        got = {e["id"] for e in events if e["event"] == "message"}
        if all(i in got for i in sent):
            return
        await asyncio.sleep(0.1)


async def reported(system: PeerSystem, *, rounds: int, slot_s: float, await_s: int,
                   gap_s: tuple[float, float], home: Path) -> dict:  # fmt: skip
    """apache/rocketmq#9145: one official SimpleConsumer, messages one at a time at random
    intervals to either broker. A false empty is an empty answer while a message had been
    waiting (send acknowledged, not yet received) for 100 ms or more."""
    rng = random.Random(9145)
    rows: dict[str, dict] = {}
    system.reset_counts()
    for round_no in range(rounds):
        for label in random.sample(system.modes, len(system.modes)):
            topic, group = f"reported-{label}-{round_no}", f"reported-{label}"
            await system.create_topic(topic)
            sent: dict[str, float] = {}
            retries = 0

            async def work(events: list[dict], topic=topic, sent=sent) -> None:
                nonlocal retries
                retries += await send_one_at_a_time(
                    system.broker_clients, topic, rng, slot_s, gap_s, await_s, sent, events
                )

            proxy = system.proxies[label]
            cpu0, load0 = proxy.cpu_seconds(), os.getloadavg()[0]
            await system.slot_edge(label, True)
            events, errors = await _official(system, label, topic, group, await_s, home, work)
            await system.slot_edge(label, False)
            received: dict[str, float] = {}
            for e in events:
                if e["event"] == "message":
                    received.setdefault(e["id"], e["t"])
            row = rows.setdefault(label, {"latencies": [], "empties": 0, "false_empties": 0,
                                          "sent": 0, "undelivered": 0, "receives": 0,
                                          "errors": [], "send_retries": 0, "proxy_cpu_s": 0.0,
                                          "slots": [], "messages": []})  # fmt: skip
            lat = [received[i] - t for i, t in sent.items() if i in received]
            # (id, sent, received) in epoch seconds: the stage table joins them with the
            # proxy's timeline of the poll that delivered each.
            row["messages"] += [(i, t, received[i]) for i, t in sent.items() if i in received]
            row["latencies"] += lat
            row["sent"] += len(sent)
            row["undelivered"] += sum(1 for i in sent if i not in received)
            row["send_retries"] += retries
            row["errors"] += errors[:5]
            row["proxy_cpu_s"] += proxy.cpu_seconds() - cpu0
            for e in events:
                if e["event"] == "empty":
                    row["empties"] += 1
                    t = e["t"]
                    if any(s <= t - 0.1 and received.get(i, float("inf")) > t
                           for i, s in sent.items()):  # fmt: skip
                        row["false_empties"] += 1
                elif e["event"] == "done":
                    row["receives"] += e["receives"]
            row["slots"].append(
                {
                    "round": round_no,
                    "load_1m": [load0, os.getloadavg()[0]],
                    "sent": len(sent),
                    "latency_ms_max": ms(max(lat, default=0)),
                    # The slot's first message: round 0's is the cold start (a fresh group
                    # and topic); None when it was not delivered.
                    "first_ms": ms(first_latency(sent, received)),
                }
            )
            print(
                f"  reported {label} r{round_no}: sent {len(sent)}, max "
                f"{ms(max(lat, default=0))} ms, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    out = {}
    for label, row in rows.items():
        lat = row.pop("latencies")
        out[label] = row | {
            "delivered": len(lat),
            "latency_ms_p50": ms(percentile(lat, 0.5)),
            "latency_ms_p99": ms(percentile(lat, 0.99)),
            "latency_ms_max": ms(max(lat) if lat else None),
            "latencies_ms": [round(x * 1000, 2) for x in lat],
        }
    broker_side_summary(system, out)
    return out


STAGE_COLUMNS = ["latency_ms", "mode", "found_by", "heard_ms", "pop_sent_ms", "popped_ms",
                 "written_ms", "client_ms"]  # fmt: skip


def slowest_stages(rows: dict[str, dict], log_dir: Path, count: int = 10) -> dict[str, list]:
    """The ``count`` slowest messages of the reported case per proxy of ours, each split into
    the stages of the poll that delivered it (its timeline, logged at debug), as times after
    the message was sent: ``heard_ms`` when the probe that found it answered (None when a
    pop found it without one), ``pop_sent_ms`` the pop that took it, ``popped_ms`` its answer,
    ``written_ms`` the answer written to the client, ``client_ms`` the client's receive.
    Proxy and bench share the machine's clock."""
    out: dict[str, list] = {}
    for label, row in rows.items():
        path = log_dir / f"proxy-{label}.log"
        if label in FOREIGN or not path.exists():
            continue
        polls = timelines(path.read_text(errors="replace"))
        slow = sorted(row["messages"], key=lambda m: m[2] - m[1], reverse=True)[:count]
        out[label] = [_stages_of(i, sent, got, polls.get(i)) for i, sent, got in slow]
    return out


def _stages_of(msg_id: str, sent: float, got: float, poll: dict | None) -> dict:
    entry: dict[str, Any] = {"latency_ms": ms(got - sent), "id": msg_id}
    if poll is None:  # no timeline: the proxy's log level was not debug, or the line was torn
        return entry
    marks = []
    for stage in poll["stages"]:
        name_detail, at = stage.rsplit("@", 1)
        name, _, detail = name_detail.partition(":")
        marks.append((name, detail, poll["arrived"] + float(at) / 1000 - sent))

    def first(name: str, after: float = float("-inf")) -> tuple[str, float] | None:
        return next(((d, t) for n, d, t in marks if n == name and t >= after), None)

    popped = next(((d, t) for n, d, t in marks if n == "popped" and not d.endswith("/0")), None)
    pop = max(((d, t) for n, d, t in marks if n == "pop" and popped and t <= popped[1]),
              key=lambda m: m[1], default=None)  # fmt: skip
    heard = max(((d, t) for n, d, t in marks if n == "has_msg" and pop and t <= pop[1]),
                key=lambda m: m[1], default=None)  # fmt: skip
    written = first("written")
    entry |= {
        "mode": poll["mode"],
        "found_by": "probe" if heard else "pop",
        "heard_ms": ms(heard[1]) if heard else None,
        "pop_sent_ms": ms(pop[1]) if pop else None,
        "popped_ms": ms(popped[1]) if popped else None,
        "written_ms": ms(written[1]) if written else None,
        "client_ms": ms(got - sent),
        "stages": poll["stages"],
    }
    return entry


def first_latency(sent: dict[str, float], received: dict[str, float]) -> float | None:
    """Send-to-receive latency of the first message sent (``sent`` keeps send order)."""
    first = next(iter(sent), None)
    if first is None or first not in received:
        return None
    return received[first] - sent[first]


FIRST_COLUMNS = ["cold_first_ms", "first_ms_later_rounds", "first_ms_max",
                 "latency_ms_p50"]  # fmt: skip


def first_messages(rows: dict[str, dict]) -> dict[str, dict]:
    """The reported case's first message of each slot, per proxy, a row of its own: round
    0's is the cold start (fresh group, topic and consumer), later rounds' a fresh topic of
    a group the proxy has seen. An undelivered first message counts as None."""
    out = {}
    for label, row in rows.items():
        firsts = [slot["first_ms"] for slot in row["slots"]]
        cold = [f for slot, f in zip(row["slots"], firsts, strict=True) if slot["round"] == 0]
        later = [f for slot, f in zip(row["slots"], firsts, strict=True) if slot["round"] > 0]
        out[label] = {
            "cold_first_ms": cold[0] if cold else None,
            "first_ms_later_rounds": later,
            "first_ms_max": max((f for f in firsts if f is not None), default=None),
            "latency_ms_p50": row["latency_ms_p50"],
        }
    return out


# -- lite topics: many light topics under one parent, few consumers -----------------------


async def create_lite(system: PeerSystem, parent: str, group: str, quota: int) -> None:
    """A LITE parent topic and a lite consumer group bound to it, allowed ``quota`` lite
    topics per client, on every broker (``rocketmq_local.admin``)."""
    namesrv = system.namesrv_address
    await asyncio.to_thread(admin.create_topic, namesrv, parent, 4, message_type="LITE")
    await asyncio.to_thread(
        admin.create_group, namesrv, group, lite_parent=parent, lite_quota=quota
    )


async def lite(system: PeerSystem, *, lite_topics: int, consumers: int, slot_s: float,
               await_s: int, gap_s: tuple[float, float], home: Path,
               push: bool = True) -> dict:  # fmt: skip
    """Lite topics (RocketMQ 5.5), the load they are made for: ``lite_topics`` light topics
    under one parent topic, ``consumers`` official Python lite consumers of one group
    subscribed to all of them, a message every ``gap_s`` to a random lite topic, on the
    broker that owns it. LitePushConsumers by default: the Apache proxy 5.5.0 refuses a
    LiteSimpleConsumer's settings ("Client type is not consumer"). With ``push=False``,
    LiteSimpleConsumers, where a false empty is an empty answer to any consumer while a
    message had been waiting for 100 ms or more (the group's consumers share every lite
    topic)."""
    rng = random.Random(83)
    brokers = sorted(system.broker_clients, key=lambda b: b.name)
    rows: dict[str, dict] = {}
    system.reset_counts()
    # A lite poll is served the same in every receive mode (receive/lite.py): of ours, the
    # default mode's proxy runs.
    labels = [label for label in system.modes if label in (*FOREIGN, "adaptive")]
    for label in random.sample(labels, len(labels)):
        if label == PEER and not push:
            rows[label] = {"lite_topics": lite_topics, "refused": "LITE_SIMPLE_CONSUMER"}
            continue
        parent = group = f"lite-{label}-{lite_topics}-{'push' if push else 'simple'}"
        await create_lite(system, parent, group, quota=lite_topics + 100)
        sent: dict[str, float] = {}
        proxy = system.proxies[label]
        rss: list[int] = []

        async def work(events: list[dict], parent=parent, sent=sent, proxy=proxy,
                       rss=rss) -> None:  # fmt: skip
            rss.append(proxy.rss_bytes())
            await asyncio.sleep(1.0)  # the first receives are out
            end = time.time() + slot_s
            while time.time() < end:
                await asyncio.sleep(rng.uniform(*gap_s))
                msg_id = uuid.uuid4().hex.upper()
                lite_topic = f"lt-{rng.randrange(lite_topics)}"
                # To the queue that owns the lite topic, as the Apache proxy and ours send
                # it: a 5.5.0 broker hands a lite message to a subscriber only there.
                broker, queue = divmod(lite_queue_index(lite_topic, 4 * len(brokers)), 4)
                await brokers[broker].send(
                    parent, b"x" * 64, queue_id=queue,
                    properties={Prop.UNIQ_KEY: msg_id, Prop.LITE_TOPIC: lite_topic},
                )  # fmt: skip
                sent[msg_id] = time.time()
            rss.append(proxy.rss_bytes())
            await until_received(events, sent, await_s + 5)

        await system.slot_edge(label, True)
        events, errors = await _official(
            system, label, parent, group, await_s, home, work, consumers=consumers,
            extra=("--lite-topics", str(lite_topics), "--lite-prefix", "lt",
                   *(("--push",) if push else ())),
            ready_s=120 + lite_topics * 0.05,
        )  # fmt: skip
        await system.slot_edge(label, False)
        received: dict[str, float] = {}
        for e in events:
            if e["event"] == "message":
                received.setdefault(e["id"], e["t"])
        lat = [received[i] - t for i, t in sent.items() if i in received]
        empties = [e["t"] for e in events if e["event"] == "empty"]
        false_empties = sum(
            1 for t in empties
            if any(s <= t - 0.1 and received.get(i, float("inf")) > t for i, s in sent.items())
        )  # fmt: skip
        subscribe_s = [e["subscribe_s"] for e in events if e["event"] == "ready"]
        rows[label] = {
            "lite_topics": lite_topics,
            "consumers": consumers,
            "sent": len(sent),
            "delivered": len(lat),
            "undelivered": sum(1 for i in sent if i not in received),
            "duplicates": sum(1 for e in events if e["event"] == "message") - len(received),
            # Delivered at attempt 2 or later: handed back (or timed out) once at least.
            "redelivered": sum(
                1 for e in events if e["event"] == "message" and e.get("attempt", 1) > 1
            ),
            "latency_ms_p50": ms(percentile(lat, 0.5)),
            "latency_ms_p99": ms(percentile(lat, 0.99)),
            "latency_ms_max": ms(max(lat) if lat else None),
            "false_empties": false_empties,
            "empties": len(empties),
            "receives": sum(e["receives"] for e in events if e["event"] == "done"),
            "subscribe_s_max": round(max(subscribe_s), 1) if subscribe_s else None,
            "proxy_rss_mb": round(max(rss) / 2**20, 1) if rss else None,
            "errors": errors[:5],
            "latencies_ms": [round(x * 1000, 2) for x in lat],
        }
        print(f"  lite {label} {lite_topics}: sent {len(sent)}, delivered {len(lat)}, p99 "
              f"{rows[label]['latency_ms_p99']} ms, false empties {false_empties}, load "
              f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    broker_side_summary(system, rows)
    for row in rows.values():
        # The requests of consuming alone: the subscriptions' set-up (LITE_SUBSCRIPTION_CTL,
        # one per lite topic, consumer and broker) dwarfs them and is the same for both.
        by_code = row["broker_requests_by_code_brokers_count"]
        consuming = sum(by_code.get(c, 0) for c in LITE_CONSUMING_CODES)
        row["consuming_requests_per_message"] = (
            round(consuming / row["delivered"], 2) if row.get("delivered") else None
        )
    return rows


LITE_CONSUMING_CODES = ("pop_lite_message", "ack_message", "batch_ack_message",
                        "change_message_invisibletime")  # fmt: skip


# -- idle fan-in ----------------------------------------------------------------------------


async def fan_in(system: PeerSystem, *, polls: int, await_ms: int = 20_000,
                 wakeups: int = 10, own_connections: bool = False) -> dict:  # fmt: skip
    """``polls`` idle long polls (lean consumers, settings sent) on each proxy in turn;
    sharing one connection, or with ``own_connections`` each on its own."""
    results = {}
    for label in random.sample(system.modes, len(system.modes)):
        proxy = system.proxies[label]
        topic = group = f"fanin-{label}-{polls}"
        await system.create_topic(topic)
        tally = ModeTally()
        crowd = scenarios.Consumers(proxy.address["grpc"], group, topic, tally, {}, await_ms,
                                    batch=1,
                                    connections=polls if own_connections else 1)  # fmt: skip

        async def holding(n: int, group=group, topic=topic, proxy=proxy, label=label) -> int:
            """Polls held: ours count them; the Apache proxy's are its parked pops."""
            end = time.perf_counter() + 90 + n / 250  # 20,000 polls: 170 s
            seen = 0
            while time.perf_counter() < end:
                if label in FOREIGN:  # coupled receives: one parked pop per poll
                    seen = await system.parked_pops(group, topic)
                else:
                    seen = await scenarios._in_flight(proxy)
                if seen >= n * 0.98:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            return seen

        rss0 = proxy.rss_bytes()
        crowd.start(polls // 2)
        half = await holding(polls // 2)
        rss_half = proxy.rss_bytes()
        crowd.start(polls - polls // 2)
        held = await holding(polls)
        rss_full = proxy.rss_bytes()
        connections = established_to(int(proxy.address["grpc"].rsplit(":", 1)[1]))
        parked = await system.parked_pops(group, topic)
        # What holding them costs: the proxy's CPU over one long-poll period, in which every
        # poll ends empty once and its consumer sends the next.
        cpu0, held_from = proxy.cpu_seconds(), time.perf_counter()
        await asyncio.sleep(await_ms / 1000)
        idle_cpu = (proxy.cpu_seconds() - cpu0) / (time.perf_counter() - held_from)
        lat = []
        for _ in range(wakeups):
            crowd.received.clear()
            t0 = time.perf_counter()
            await random.choice(system.broker_clients).send(
                topic, b"wake", properties={Prop.UNIQ_KEY: uuid.uuid4().hex.upper()}
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(crowd.received.wait(), await_ms / 1000 + 5)
                lat.append(time.perf_counter() - t0)
            await asyncio.sleep(0.3)
        await crowd.stop()
        results[label] = {
            "polls_requested": polls,
            "polls_held": held,
            "client_connections": connections,
            "rss_mb_before": round(rss0 / 2**20, 1),
            "rss_mb_with_polls": round(rss_full / 2**20, 1),
            # The slope from half to all of the polls; none when the second half was not
            # held (a proxy that turned clients away: too_many_requests).
            "kb_per_poll": (
                round((rss_full - rss_half) / (held - half) / 1024, 2) if held > half else None
            ),
            "kb_per_poll_from_zero": (round((rss_full - rss0) / held / 1024, 2) if held else None),
            "broker_parked_pops": parked,
            "idle_cpu_cores": round(idle_cpu, 3),
            "wakeups": len(lat),
            "wakeup_ms_p50": ms(statistics.median(lat)) if lat else None,
            "wakeup_ms_p99": ms(percentile(lat, 0.99)),
            "wakeup_ms_max": ms(max(lat)) if lat else None,
            "too_many_requests": tally.too_many,
        }
        print(f"  fan-in {label} {polls}: {results[label]}", flush=True)
        await asyncio.sleep(await_ms / 1000 + 2)  # parked remnants time out
    return results


# -- overhead -------------------------------------------------------------------------------


async def overhead(system: PeerSystem, *, rounds: int, messages: int, workers: int = 16) -> dict:
    """Pop+ack of a backlog through the Apache proxy, our notify proxies (one of each worker
    count in the system) and straight to the brokers, in shuffled order each round."""
    peer = [label for label in FOREIGN if label in system.proxies]
    labels = [*peer, *(label for label in system.modes if label.split("-w")[0] == "notify")]
    paths = [*labels, "direct"]
    rates: dict[str, list[float]] = {p: [] for p in paths}
    waits: dict[str, list[float]] = {p: [] for p in paths}
    cpu: dict[str, defaultdict[str, float]] = {p: defaultdict(float) for p in paths}
    unfinished: dict[str, str] = {}
    per = 32 * len(system.broker_clients)
    total = messages // per * per
    for round_no in range(rounds):
        for path in random.sample(paths, len(paths)):
            topic, group = f"over-{path}-{round_no}", f"over-{path}"
            await system.create_topic(topic)
            await scenarios._fill(system, topic, total)
            await asyncio.sleep(1.0)
            procs = {p: system.proxies[p] for p in labels}

            def snapshot(procs=procs) -> dict[str, float]:
                return {
                    **{f"proxy {p}": proc.cpu_seconds() for p, proc in procs.items()},
                    "brokers": sum(b.cpu_seconds() for b in system.brokers),
                    "load_generator": time.process_time(),
                }

            before = snapshot()
            proxy = None if path == "direct" else path
            try:
                rate, took = await scenarios._consume(
                    system, proxy, topic, group, total, workers, limit_s=120.0
                )
            except scenarios.Unfinished as exc:
                unfinished[path] = str(exc)
                print(f"  overhead {path} r{round_no}: unfinished, {exc}", flush=True)
                continue
            after = snapshot()
            rates[path].append(rate)
            waits[path] += took
            for who, s in after.items():
                cpu[path][who] += (s - before[who]) * 1e6 / total / rounds
            print(f"  overhead {path} r{round_no}: {rate:.0f} msg/s, load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    return {
        "messages": total,
        "workers": workers,
        "msgs_per_s": {p: round(statistics.median(r)) for p, r in rates.items() if r},
        "unfinished": unfinished,
        "rounds": {p: [round(x) for x in r] for p, r in rates.items()},
        "receive_ms_p50": {p: ms(percentile(w, 0.5)) for p, w in waits.items()},
        "receive_ms_p99": {p: ms(percentile(w, 0.99)) for p, w in waits.items()},
        "cpu_ms_per_1000": {p: {w: round(v, 1) for w, v in c.items()} for p, c in cpu.items()},
    }


# -- priority -------------------------------------------------------------------------------


async def priority(
    system: PeerSystem, *, rounds: int, backlog: int, high: int, await_ms: int = 5000
) -> dict:
    """A backlog of ``backlog`` priority-0 messages on a PRIORITY topic, then ``high``
    priority-3 ones (sent straight to random brokers, before the consumer starts); one
    consumer then receives (batches of 32, acking each) through each proxy in turn until
    every high one is in: how long that takes, and how many low ones came before it."""
    namesrv = system.namesrv_address
    took: dict[str, list[float]] = {label: [] for label in system.modes}
    lows: dict[str, list[int]] = {label: [] for label in system.modes}
    for round_no in range(rounds):
        for label in random.sample(system.modes, len(system.modes)):
            run_id = uuid.uuid4().hex[:8]
            topic, group = f"prio-{label}-{run_id}", f"prio-{label}-{run_id}"
            await asyncio.to_thread(admin.create_topic, namesrv, topic, 4, message_type="PRIORITY")
            await asyncio.to_thread(admin.create_group, namesrv, group)
            sent: dict[int, list] = {}
            for n, prio in enumerate([0] * backlog + [3] * high):
                body = b"high" if prio else b"low"
                props = {Prop.PRIORITY: str(prio), Prop.UNIQ_KEY: f"{run_id}{n:024d}".upper()}
                which = random.randrange(len(system.broker_clients))
                broker = system.broker_clients[which]
                sent.setdefault(which, []).append(await broker.send(topic, body, properties=props))
            for which, results in sent.items():  # indexed by each broker before receiving
                await wait_visible(system.broker_clients[which], topic, results)
            client = SettingsClient(system.proxies[label].address["grpc"])
            await client.prepare(group, topic, await_ms)
            got_high = got_low = 0
            started = time.perf_counter()
            deadline = started + 60
            try:
                while got_high < high and time.perf_counter() < deadline:
                    result = await client.receive(group, topic, await_ms=await_ms, batch=32)
                    for msg in result.messages:
                        if msg.body == b"high":
                            got_high += 1
                        elif got_high < high:
                            got_low += 1
                    if result.messages:
                        await client.ack(group, topic, result.messages)
            finally:
                await client.close()
            if got_high == high:
                took[label].append(time.perf_counter() - started)
            lows[label].append(got_low)
            print(f"  priority {label} r{round_no}: {got_high}/{high} high after "
                  f"{got_low} low", flush=True)  # fmt: skip
    return {
        label: {
            "backlog": backlog,
            "high": high,
            "runs": rounds,
            "all_high_runs": len(took[label]),
            "all_high_ms_p50": ms(statistics.median(took[label])) if took[label] else None,
            "all_high_ms_max": ms(max(took[label])) if took[label] else None,
            "low_before_last_high_max": max(lows[label]),
        }
        for label in system.modes
    }


# -- the run --------------------------------------------------------------------------------

LITE_COLUMNS = ["sent", "delivered", "latency_ms_p50", "latency_ms_p99", "latency_ms_max",
                "false_empties", "empties", "redelivered", "subscribe_s_max", "proxy_rss_mb",
                "consuming_requests_per_message",
                "broker_requests_per_message_brokers_count"]  # fmt: skip
REPORTED_COLUMNS = ["sent", "delivered", "latency_ms_p50", "latency_ms_p99", "latency_ms_max",
                    "false_empties", "empties", "receives", "undelivered",
                    "broker_requests_per_message_brokers_count"]  # fmt: skip
SPARSE_COLUMNS = ["delivered", "latency_ms_p50", "latency_ms_p99", "latency_ms_max",
                  "false_empties", "empty_answers", "broker_requests_per_message",
                  "broker_requests_per_message_brokers_count"]  # fmt: skip
BUSY_COLUMNS = ["delivered_per_s", "receive_rate_per_s", "broker_requests_per_message",
                "broker_requests_per_message_brokers_count", "proxy_cpu_s_per_1000",
                "client_setup_s"]  # fmt: skip


def show(title: str, rows: dict[str, dict], columns: list[str]) -> None:
    lines = [["proxy", *columns]] + [
        [label, *("-" if row.get(c) is None else str(row.get(c)) for c in columns)]
        for label, row in rows.items()
    ]
    print(f"\n{title}\n{aligned(lines)}", flush=True)


# The summary's figures: (title, scenario, row key, True when lower is better).
FIGURES = [
    ("reported delivered / sent", "reported", "delivered_share", False),
    ("reported p99 ms", "reported", "latency_ms_p99", True),
    ("reported false empties", "reported", "false_empties", True),
    ("sparse broker req/msg", "sparse", "broker_requests_per_message_brokers_count", True),
    ("sparse p99 ms", "sparse", "latency_ms_p99", True),
    ("busy broker req/msg", "busy", "broker_requests_per_message_brokers_count", True),
    ("busy msg/s", "busy", "delivered_per_s", False),
]


def summary(results: dict) -> dict[str, dict[str, object]]:
    """One screen: each figure of each proxy, then ours (the best of our modes) over the
    best of the others (below 1 is ours ahead for a lower-is-better figure, above 1 for a
    higher-is-better one)."""
    figures: list[tuple[str, dict[str, float], bool]] = []  # title, per proxy, lower better
    for title, scenario, key, low in FIGURES:
        values = {}
        for proxy, counts in results.get(scenario, {}).items():
            if key == "delivered_share":  # each proxy's slots sent a different number
                sent = counts.get("sent")
                value = round(counts.get("delivered", 0) / sent, 2) if sent else None
            else:
                value = counts.get(key)
            if value is not None:
                values[proxy] = value
        figures.append((title, values, low))
    fanin = results.get("fanin", {})
    if fanin:
        most = max(fanin, key=int)
        figures.append((f"RSS KB per idle poll ({most})", {
            p: r["kb_per_poll"] for p, r in fanin[most].items() if r.get("kb_per_poll") is not None
        }, True))  # fmt: skip
    overhead = results.get("overhead", {})
    if overhead:
        rates = overhead["msgs_per_s"]
        direct = rates.get("direct")
        figures.append(("overhead msg/s", {p: v for p, v in rates.items() if p != "direct"}, False))
        if direct:
            figures.append(("overhead / direct", {
                p: round(v / direct, 2) for p, v in rates.items() if p != "direct"
            }, False))  # fmt: skip
    out: dict[str, dict[str, object]] = {}
    for title, values, low in figures:
        theirs = [v for p, v in values.items() if p in FOREIGN]
        ours = [v for p, v in values.items() if p not in FOREIGN]
        row: dict[str, object] = dict(values)
        if theirs and ours:
            best_ours = min(ours) if low else max(ours)
            best_theirs = min(theirs) if low else max(theirs)
            row["ours / best peer"] = round(best_ours / best_theirs, 2) if best_theirs else "-"
        out[title] = row
    return out


def show_summary(results: dict) -> None:
    table = summary(results)
    proxies = sorted({p for row in table.values() for p in row if p != "ours / best peer"},
                     key=lambda p: (p not in FOREIGN, p))  # fmt: skip
    columns = [*proxies, "ours / best peer"]
    lines = [["figure", *columns]] + [
        [title, *("-" if row.get(c) is None else str(row.get(c)) for c in columns)]
        for title, row in table.items()
    ]
    print(f"\nSummary (lower is better except msg/s and overhead / direct); load "
          f"{load_average()}\n{aligned(lines)}", flush=True)  # fmt: skip


async def run(args: argparse.Namespace, results: dict) -> dict:
    """Every scenario asked for, into ``results`` as each ends (what a failed run did
    is still written)."""
    wanted = args.scenarios.split(",")
    results.update({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "args": vars(args),
                    "load_average_1_5_15": {"start": load_average()}})  # fmt: skip
    scenarios.CLIENT_CLASS[0] = SettingsClient
    real = [s for s in wanted if s != "stub"]
    rust_binary = None
    if real and RUST in args.peers:
        rust_binary, why = await asyncio.to_thread(build_rust_proxy)
        if rust_binary is None:
            results["rust_missing"] = why
            print(f"the Rust proxy is left out: {why}", flush=True)
    if real:
        t0 = time.monotonic()
        system = await PeerSystem(
            brokers=args.brokers,
            modes=args.modes if "ours" in args.peers else (),
            apache=PEER in args.peers,
            rust=rust_binary,
            notify_workers=args.workers if "ours" in args.peers else (),
            proxy_log_level=args.proxy_log_level,
            log_dir=Path(args.out) / "logs" if args.proxy_log_level == "debug" else None,
        ).start()
        from rocketmq_local.launcher import rocketmq_version

        results["rocketmq"] = rocketmq_version()
        if args.client_tls:
            for proxy in system.proxies.values():
                address = proxy.address["grpc"]
                TLS_ENDPOINTS[address] = await asyncio.to_thread(server_tls, address)
        if system.rust_missing is not None:
            results["rust_missing"] = system.rust_missing
        theirs = [label for label in FOREIGN if label in system.proxies]
        ours = len(system.proxies) - len(theirs)
        print(f"real RocketMQ {results['rocketmq']}: {args.brokers} brokers, "
              f"{' and '.join([*theirs, f'{ours} of ours'])} "
              f"ready in {time.monotonic() - t0:.0f} s; clients over "
              f"{'TLS' if args.client_tls else 'plaintext'}; load {load_average()}",
              flush=True)  # fmt: skip
        try:
            if "reported" in wanted:
                home = Path(args.out) / "official-home"
                home.mkdir(parents=True, exist_ok=True)
                results["reported"] = await reported(
                    system, rounds=args.rounds, slot_s=args.reported_slot_s,
                    await_s=args.reported_await_s, gap_s=(args.gap_min_s, args.gap_max_s),
                    home=home,
                )  # fmt: skip
                results["load_average_1_5_15"]["after_reported"] = load_average()
                show(f"The reported case: official Python SimpleConsumer, await "
                     f"{args.reported_await_s} s, a message every {args.gap_min_s}-"
                     f"{args.gap_max_s} s to a random broker; load {load_average()}",
                     results["reported"], REPORTED_COLUMNS)  # fmt: skip
                if system.log_dir is not None:  # the polls' timelines are in the logs
                    results["reported_slowest"] = slowest_stages(results["reported"],
                                                                 system.log_dir)  # fmt: skip
                    for label, slow in results["reported_slowest"].items():
                        show(f"The reported case's 10 slowest messages through {label}: ms "
                             "after the send of the probe's answer, the pop that took it, "
                             "its answer, the write, the client's receive",
                             {str(n): e for n, e in enumerate(slow, 1)}, STAGE_COLUMNS)  # fmt: skip
                results["reported_first"] = first_messages(results["reported"])
                show("The reported case's first message per proxy (cold: round 0, a fresh "
                     "group and topic; then each later round's, a fresh topic), ms",
                     results["reported_first"], FIRST_COLUMNS)  # fmt: skip
            if "lite" in wanted:
                home = Path(args.out) / "official-home"
                home.mkdir(parents=True, exist_ok=True)
                results["lite"] = {}
                for kind in args.lite_clients:
                    for n in args.lite_topics:
                        results["lite"][f"{kind}-{n}"] = rows = await lite(
                            system, lite_topics=n, consumers=args.lite_consumers,
                            slot_s=args.lite_slot_s, await_s=args.reported_await_s,
                            gap_s=args.lite_gap_s, home=home, push=kind == "push",
                        )  # fmt: skip
                        show(f"Lite topics: {n} under one parent, {args.lite_consumers} "
                             f"official Python Lite{kind.capitalize()}Consumers subscribed to "
                             f"all, a message every {args.lite_gap_s[0]}-{args.lite_gap_s[1]} s "
                             f"to a random one; load {load_average()}", rows,
                             LITE_COLUMNS)  # fmt: skip
            if "priority" in wanted:
                results["priority"] = await priority(
                    system, rounds=args.rounds, backlog=args.priority_backlog,
                    high=args.priority_high,
                )  # fmt: skip
                show(f"Priority: {args.priority_high} priority-3 messages behind "
                     f"{args.priority_backlog} priority-0 ones, one consumer, batches of 32; "
                     f"load {load_average()}", results["priority"],
                     ["all_high_runs", "all_high_ms_p50", "all_high_ms_max",
                      "low_before_last_high_max"])  # fmt: skip
            if "sparse" in wanted:
                system.reset_counts()
                results["sparse"] = await scenarios.sparse(
                    system, rounds=args.rounds, slot_s=12.0, warmup_s=5.0
                )
                broker_side_summary(system, results["sparse"])
                results["load_average_1_5_15"]["after_sparse"] = load_average()
                show(f"Sparse (real brokers): 2 consumers, await 10 s, a message every "
                     f"200-500 ms; load {load_average()}",
                     results["sparse"], SPARSE_COLUMNS)  # fmt: skip
            if "busy" in wanted:
                system.reset_counts()
                results["busy"] = await scenarios.busy(
                    system, rounds=args.rounds, slot_s=8.0, rate=args.busy_rate,
                    consumers=args.busy_consumers,
                )  # fmt: skip
                broker_side_summary(system, results["busy"])
                results["load_average_1_5_15"]["after_busy"] = load_average()
                show(f"Busy (real brokers): {args.busy_consumers} consumers, {args.busy_rate} "
                     f"msg/s; load {load_average()}", results["busy"], BUSY_COLUMNS)  # fmt: skip
            if "fanin" in wanted:
                results["fanin"] = {}
                for polls in args.fanin_polls:
                    results["fanin"][polls] = await fan_in(
                        system, polls=polls, own_connections=args.fanin_own_connections
                    )
                    show(f"Idle fan-in: {polls} polls; load {load_average()}",
                         results["fanin"][polls],
                         ["polls_held", "client_connections", "kb_per_poll",
                          "kb_per_poll_from_zero",
                          "rss_mb_with_polls", "broker_parked_pops", "wakeup_ms_p50"])  # fmt: skip
            if "remoting" in wanted:
                from bench import remoting_peer

                assert system.cluster is not None and system.namesrv is not None  # real
                apache = system.cluster.proxy
                results["remoting"] = await remoting_peer.remoting(
                    system.namesrv.address["remoting"],
                    f"127.0.0.1:{apache.remoting_port}" if apache is not None else None,
                    messages=args.remoting_messages, home=Path(args.out) / "remoting-home",
                )  # fmt: skip
                show(f"Remoting port: the Java client 5.5.0's DefaultMQProducer sends "
                     f"{args.remoting_messages} messages one at a time to a "
                     f"DefaultMQPushConsumer; load {load_average()}", results["remoting"],
                     remoting_peer.COLUMNS)  # fmt: skip
            if "overhead" in wanted:
                results["overhead"] = await overhead(
                    system, rounds=args.rounds, messages=args.overhead_messages
                )
                o = results["overhead"]
                print(f"\nOverhead (real brokers): {o['msgs_per_s']}; load {load_average()}")
                for path, spent in o["cpu_ms_per_1000"].items():
                    print(f"  {path}: CPU ms per 1,000 msgs {spent}", flush=True)
        finally:
            await system.stop()
    if "stub" in wanted:
        stub = await System(brokers=4, modes=OURS, backend="stub").start()
        try:
            results["stub"] = {
                "sparse": await scenarios.sparse(stub, rounds=args.rounds, slot_s=12.0),
                "busy": await scenarios.busy(stub, rounds=args.rounds, slot_s=8.0,
                                             rate=args.busy_rate,
                                             consumers=args.busy_consumers),
            }  # fmt: skip
            show("Sparse (4 stub brokers)", results["stub"]["sparse"], SPARSE_COLUMNS[:-1])
            show("Busy (4 stub brokers)", results["stub"]["busy"], BUSY_COLUMNS)
        finally:
            await stub.stop()
    results["load_average_1_5_15"]["end"] = load_average()
    results["summary"] = summary(results)
    show_summary(results)
    return results


def charts(results: dict, out: Path) -> list[str]:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed: no charts")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for scenario in ("reported", "sparse"):
        for label, row in results.get(scenario, {}).items():
            values = sorted(row.get("latencies_ms", []))
            if values:
                ax.plot([max(v, 0.1) for v in values],
                        [(i + 1) / len(values) for i in range(len(values))],
                        label=f"{label} ({scenario})",
                        linestyle="-" if scenario == "reported" else ":")  # fmt: skip
    if ax.lines:
        ax.set_xscale("log")
        ax.set_xlabel("send acknowledged to received (ms, log)")
        ax.set_ylabel("share of messages")
        ax.set_title("Delivery latency by proxy, real RocketMQ brokers")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "latency_by_proxy.png", dpi=120)
        written.append("latency_by_proxy.png")
    plt.close(fig)
    if "overhead" in results:
        rates = results["overhead"]["msgs_per_s"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(list(rates), list(rates.values()))
        ax.set_ylabel("pop + ack, msg/s (median of rounds)")
        ax.set_title("Throughput by proxy, real RocketMQ brokers")
        fig.tight_layout()
        fig.savefig(out / "throughput_by_proxy.png", dpi=120)
        written.append("throughput_by_proxy.png")
        plt.close(fig)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--scenarios", default="reported,lite,priority,sparse,busy,fanin,remoting,overhead,stub"
    )
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", type=lambda s: tuple(s.split(",")), default=OURS,
                   help="our proxies' modes to run, default notify,adaptive,coupled")  # fmt: skip
    p.add_argument("--reported-slot-s", type=float, default=30.0)
    p.add_argument("--reported-await-s", type=int, default=10)
    p.add_argument("--gap-min-s", type=float, default=0.5)
    p.add_argument("--gap-max-s", type=float, default=3.0)
    p.add_argument(
        "--lite-topics",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1000, 10000],
        help="lite topics under the parent, per run",
    )
    p.add_argument("--lite-consumers", type=int, default=3)
    p.add_argument("--lite-clients", type=lambda s: s.split(","), default=["push", "simple"],
                   help="push: LitePushConsumers (every proxy); simple: LiteSimpleConsumers "
                   "(ours: the Apache proxy refuses them)")  # fmt: skip
    p.add_argument("--lite-slot-s", type=float, default=45.0)
    p.add_argument("--lite-gap-s", type=lambda s: tuple(float(x) for x in s.split(",")),
                   default=(0.1, 0.4), help="MIN,MAX seconds between lite messages: about "
                   "180 per row at the defaults, enough for a p99")  # fmt: skip
    p.add_argument("--priority-backlog", type=int, default=2000)
    p.add_argument("--priority-high", type=int, default=20)
    p.add_argument("--busy-rate", type=int, default=1000)
    p.add_argument("--busy-consumers", type=int, default=64)
    p.add_argument("--fanin-polls", type=lambda s: [int(x) for x in s.split(",")],
                   default=[2000])  # fmt: skip
    p.add_argument("--fanin-own-connections", action="store_true",
                   help="each fan-in client on a connection of its own (default: one "
                   "shared)")  # fmt: skip
    p.add_argument("--overhead-messages", type=int, default=20_000)
    p.add_argument(
        "--remoting-messages",
        type=int,
        default=5_000,
        help="messages of the remoting scenario, per proxy",
    )
    p.add_argument("--client-tls", action="store_true",
                   help="the lean clients connect over TLS, trusting each proxy's "
                   "certificate")  # fmt: skip
    p.add_argument("--workers", type=lambda s: tuple(int(x) for x in s.split(",")),
                   default=(1,), help="worker counts of notify proxies, e.g. 1,2: a notify "
                   "proxy of each runs every scenario beside the others")  # fmt: skip
    p.add_argument("--peers", type=lambda s: s.split(","), default=["apache", "rust", "ours"],
                   help="the proxies to compare: apache (the Apache proxy 5.5.0), rust "
                   "(rocketmq-proxy 1.0.0, built with cargo once), ours")  # fmt: skip
    p.add_argument("--proxy-log-level", default="warning",
                   help="our proxies' log level (to stderr); debug logs each poll's stages, "
                   "proxy/receive/timeline.py")  # fmt: skip
    p.add_argument("--out", default="results/bench-peer")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    try:
        quiet_collector()
        run_main(run(args, results))
        results["charts"] = charts(results, out)
    finally:
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        print(f"\nwrote {out / 'results.json'} {' '.join(results.get('charts', []))}")


if __name__ == "__main__":
    main()
