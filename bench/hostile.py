"""Slow and hostile clients (issue 23, item 6): a client that opens streams and never reads
them, or floods the proxy with Heartbeats or Telemetry, must not hurt the other clients.

    python -m bench.hostile --out results/hostile [--seconds 30]      (make bench-hostile)

One proxy (``python -m proxy.cli --workers 1``) in front of a name server and broker stubs,
each a process on free loopback ports (``testkit/processes.py``), stopped by pid at the end.
In this process, well-behaved clients run through every phase (the lean client): producers
sending at a fixed rate (open loop: a send is started on its tick whatever the earlier ones
do), SimpleConsumers long-polling and acking what they get, a client heartbeating every
0.5 s, and one opening a Telemetry stream every second for its settings answer (a client
starting up). Per phase, their latencies (send, send-to-receive, ack, heartbeat, settings
round trip) and every error they see.

Phases: ``baseline`` (no hostile client), then each hostile kind alone, then ``all`` at once.
Each hostile kind is a process of its own (``--attack KIND``, run niced by
``--attacker-nice``: on a shared 2-core machine the attacker would otherwise take the
proxy's core, which a hostile client on its own host cannot):

- ``hoard``: ``--hoard-streams`` Telemetry streams over ``--connections`` connections, none
  ever read; a quarter send consumer settings and then sit idle, a quarter producer
  settings (a producer's stream has a reader task and an outbox in the proxy), a quarter
  send settings again every 5 s (answers pile up unread), a quarter send nothing at all.
  They use ``--hoard-clients`` client ids. Once all are open, one stream in ten is read
  once, to count how the proxy answered them.
- ``heartbeat``: ``--heartbeat-concurrency`` Heartbeat RPCs in flight at all times, half with
  a new client id each, half with one fixed id.
- ``telemetry``: ``--flood-streams`` Telemetry streams each writing settings, thread stack
  traces and verify-message results as fast as the proxy takes them, never reading; a
  stream the proxy ends is opened again at once.

Sampled every 0.5 s: the proxy process's RSS (VmRSS) and CPU. Per phase: RSS at the start,
peak, at the end of the measured window, and after a cool-down once the attacker is gone;
the RSS slope over the window's second half (MB/min; ``growing`` above 1 MB/min); proxy
and attacker CPU; the proxy's asyncio tasks and open file descriptors. Writes
``hostile.json`` and ``hostile.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.scenarios import percentile
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from testkit.lean_client import LeanClient, consumer_settings, millis
from testkit.processes import Process, System, quiet_collector, scrape, terminate
from testkit.processes import status as proxy_status

TOPIC, GROUP = "HostileTopic", "HostileGroup"
KINDS = ("hoard", "heartbeat", "telemetry")
PHASES = ("baseline", *KINDS, "all")
# What the good clients time, in the order of the table.
LATENCIES = ("send", "e2e", "ack", "heartbeat", "settings")
OK, NOT_FOUND = pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND
ROOT = Path(__file__).resolve().parents[1]


def _metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    return (
        ("x-mq-client-id", client_id),
        ("x-mq-language", "JAVA"),
        ("x-mq-protocol", "v2"),
        ("x-mq-client-version", "5.0.0"),
    )


def _consumer_settings() -> api.TelemetryCommand:
    return api.TelemetryCommand(
        settings=consumer_settings(pb.ClientType.SIMPLE_CONSUMER, GROUP, TOPIC, 5000)
    )


def _producer_settings() -> api.TelemetryCommand:
    return api.TelemetryCommand(
        settings=pb.Settings(
            client_type=pb.ClientType.PRODUCER,
            request_timeout=millis(3000),
            publishing=pb.Publishing(topics=[pb.Resource(name=TOPIC)]),
            user_agent=pb.UA(language=pb.Language.JAVA, version="5.0.0", platform="linux"),
        )
    )


# -- the attackers (``--attack KIND``, a process each) ---------------------------------------


class Attacker:
    """One hostile kind against ``target``; counts what it did for the report."""

    def __init__(self, target: str, args: argparse.Namespace) -> None:
        self.args = args
        self.channels = [
            grpc.aio.insecure_channel(
                target, options=[("grpc.use_local_subchannel_pool", 1), ("bench.connection", i)]
            )
            for i in range(args.connections)
        ]
        self.stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in self.channels]
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()  # hoard: how the probed streams were answered
        self.calls: list[grpc.aio.StreamStreamCall] = []
        self.started = time.perf_counter()

    def _error(self, what: str, exc: BaseException) -> None:
        code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__
        self.errors[f"{what}: {code}"] += 1

    async def close(self) -> None:
        for call in self.calls:
            call.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(c.close(None) for c in self.channels), return_exceptions=True), 10
            )

    def report(self) -> dict:
        seconds = time.perf_counter() - self.started
        return {
            "seconds": round(seconds, 1),
            "counts": dict(self.counts),
            "per_s": {k: round(v / seconds, 1) for k, v in self.counts.items()},
            "errors": dict(self.errors),
            "answers": dict(self.answers),
        }

    # hoard -------------------------------------------------------------------------------

    async def hoard(self, ready: asyncio.Event) -> None:
        streams, clients = self.args.hoard_streams, self.args.hoard_clients
        kinds = ("consumer", "producer", "resync", "silent")
        by_kind: dict[str, list[grpc.aio.StreamStreamCall]] = {k: [] for k in kinds}

        async def open_one(i: int) -> None:
            kind = kinds[i % len(kinds)]
            stub = self.stubs[i % len(self.stubs)]
            call = stub.Telemetry(metadata=_metadata(f"hoarder-{i % clients}"))
            self.calls.append(call)
            by_kind[kind].append(call)
            if kind == "silent":
                self.counts["streams_opened"] += 1
                return
            first = _producer_settings() if kind == "producer" else _consumer_settings()
            try:
                await asyncio.wait_for(call.write(first), 10)
                self.counts["streams_opened"] += 1
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError) as exc:
                self._error("open", exc)

        for start in range(0, streams, 100):
            await asyncio.gather(*(open_one(i) for i in range(start, min(streams, start + 100))))
        # One stream in ten (of those that sent settings) read once: how were they answered?
        probed = [c for k in ("consumer", "producer") for c in by_kind[k][::10]]

        async def probe(call: grpc.aio.StreamStreamCall) -> None:
            try:
                answer = await asyncio.wait_for(call.read(), 10)
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                self._error("probe", exc)
                return
            if isinstance(answer, api.TelemetryCommand):
                self.answers[pb.Code.Name(answer.status.code)] += 1
            else:  # the end of the stream
                self.answers[f"ended {(await call.code()).name}"] += 1

        await asyncio.gather(*(probe(c) for c in probed))
        ready.set()
        resync = by_kind["resync"]
        while True:  # settings again every 5 s on a quarter of them, never read
            await asyncio.sleep(5)
            for call in resync:
                if call.done():
                    continue
                try:
                    await asyncio.wait_for(call.write(_consumer_settings()), 1)
                    self.counts["resync_writes"] += 1
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError) as exc:
                    self._error("resync", exc)

    # heartbeat flood ---------------------------------------------------------------------

    async def heartbeat(self, ready: asyncio.Event) -> None:
        request = api.HeartbeatRequest(
            group=pb.Resource(name=GROUP), client_type=pb.ClientType.SIMPLE_CONSUMER
        )
        fixed = _metadata("flood-fixed")

        async def worker(w: int) -> None:
            stub = self.stubs[w % len(self.stubs)]
            for n in itertools.count():
                metadata = fixed if n % 2 else _metadata(f"flood-{w}-{n}")
                try:
                    response = await stub.Heartbeat(request, metadata=metadata, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    self._error("heartbeat", exc)
                    await asyncio.sleep(0.1)
                    continue
                self.counts["heartbeats"] += 1
                if response.status.code != OK:
                    self.errors[f"heartbeat: {pb.Code.Name(response.status.code)}"] += 1

        ready.set()
        await asyncio.gather(*(worker(w) for w in range(self.args.heartbeat_concurrency)))

    # telemetry flood ---------------------------------------------------------------------

    async def telemetry(self, ready: asyncio.Event) -> None:
        def commands(i: int) -> list[api.TelemetryCommand]:
            return [
                _producer_settings() if i % 2 else _consumer_settings(),
                api.TelemetryCommand(
                    thread_stack_trace=api.ThreadStackTrace(
                        nonce=f"n{i}", thread_stack_trace="at Hostile.run(Hostile.java:1)\n" * 40
                    )
                ),
                api.TelemetryCommand(verify_message_result=api.VerifyMessageResult(nonce=f"v{i}")),
            ]

        async def flood(i: int) -> None:
            """Write without reading; when the proxy ends the stream, open another."""
            stub = self.stubs[i % len(self.stubs)]
            mine = commands(i)
            n = 0
            while True:
                call = stub.Telemetry(metadata=_metadata(f"tflood-{i}"))
                self.calls.append(call)
                self.counts["telemetry_streams"] += 1
                while True:
                    try:
                        await call.write(mine[n % len(mine)])
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                        self._error("telemetry", exc)
                        break
                    n += 1
                    self.counts["telemetry_writes"] += 1
                call.cancel()
                self.calls.remove(call)

        ready.set()
        await asyncio.gather(*(flood(i) for i in range(self.args.flood_streams)))


async def _attack(args: argparse.Namespace) -> None:
    """Run one hostile kind until SIGTERM; print ``ready`` once it is under way, and its
    counts as one JSON line when it stops."""
    attacker = Attacker(args.target, args)
    stop, ready = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    work = asyncio.ensure_future(getattr(attacker, args.attack)(ready))
    waiting = asyncio.ensure_future(ready.wait())
    await asyncio.wait({work, waiting}, return_when=asyncio.FIRST_COMPLETED)
    print("ready", json.dumps(attacker.report()), flush=True)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    for task in (work, waiting, stopping):
        task.cancel()
    await asyncio.gather(work, waiting, stopping, return_exceptions=True)
    report = attacker.report()
    if work.done() and not work.cancelled() and work.exception() is not None:
        report["failed"] = repr(work.exception())
    await attacker.close()
    print("stats", json.dumps(report), flush=True)


@dataclass
class Running:
    """An attacker process the harness started."""

    kind: str
    process: Process
    ready: dict


async def start_attacker(kind: str, target: str, args: argparse.Namespace, log: Path) -> Running:
    command = [
        sys.executable, "-m", "bench.hostile", "--attack", kind, "--target", target,
        "--connections", str(args.connections), "--hoard-streams", str(args.hoard_streams),
        "--hoard-clients", str(args.hoard_clients),
        "--heartbeat-concurrency", str(args.heartbeat_concurrency),
        "--flood-streams", str(args.flood_streams), "--attacker-nice", str(args.attacker_nice),
    ]  # fmt: skip
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    process = Process(f"attacker-{kind}", proc)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
    except TimeoutError:
        line = ""
    if not line.startswith("ready "):
        await terminate(proc, 5)
        raise RuntimeError(
            f"attacker {kind} did not start (exit {proc.returncode}, {line!r}; see {log})"
        )
    return Running(kind, process, json.loads(line.split(" ", 1)[1]))


async def stop_attacker(running: Running) -> dict:
    """SIGTERM (its channels close), SIGKILL after 20 s; its counts."""
    proc = running.process.proc
    assert isinstance(proc, asyncio.subprocess.Process) and proc.stdout is not None
    await terminate(proc, 20)
    rest = (await proc.stdout.read()).decode().splitlines()
    stats = next((json.loads(x.split(" ", 1)[1]) for x in rest if x.startswith("stats ")), None)
    return stats or {"killed": True}


# -- the well-behaved clients -----------------------------------------------------------------


@dataclass
class Good:
    """Well-behaved clients on one proxy: what each call took, when it started, and every
    error (an exception, or a status other than OK; MESSAGE_NOT_FOUND for an empty poll)."""

    endpoint: str
    producers: int
    rate: float
    consumers: int
    latencies: list[tuple[float, str, float]] = field(default_factory=list)
    errors: list[tuple[float, str, str]] = field(default_factory=list)
    sent_at: dict[str, float] = field(default_factory=dict)
    tasks: list[asyncio.Task] = field(default_factory=list)
    clients: list[LeanClient] = field(default_factory=list)

    def _client(self, name: str) -> LeanClient:
        client = LeanClient(self.endpoint, name, own_connection=True)
        self.clients.append(client)
        return client

    def _error(self, t0: float, kind: str, what: str) -> None:
        self.errors.append((t0, kind, what))
        if len(self.errors) <= 5 or len(self.errors) % 100 == 0:
            print(f"  good client error #{len(self.errors)}: {kind}: {what}", flush=True)

    async def _timed(self, kind: str, call: Awaitable[Any]) -> Any | None:
        """Await ``call`` (a unary RPC), recording its latency under ``kind``, or its
        error (an exception, or a status other than OK); the response, None on an error."""
        t0 = time.perf_counter()
        try:
            response = await call
        except Exception as exc:
            self._error(t0, kind, _describe(exc))
            return None
        if response.status.code != OK:
            self._error(t0, kind, pb.Code.Name(response.status.code))
            return None
        self.latencies.append((t0, kind, time.perf_counter() - t0))
        return response

    def start(self) -> None:
        for i in range(self.producers):
            self.tasks.append(asyncio.ensure_future(self._produce(i)))
        for i in range(self.consumers):
            self.tasks.append(asyncio.ensure_future(self._consume(i)))
        self.tasks.append(asyncio.ensure_future(self._heartbeats()))
        self.tasks.append(asyncio.ensure_future(self._settings()))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 5)

    async def _produce(self, i: int) -> None:
        client = self._client(f"good-producer-{i}")
        in_flight: set[asyncio.Task] = set()
        ids = itertools.count()

        async def send_one() -> None:
            message_id = f"GOOD{i:04d}{next(ids):024d}"
            self.sent_at[message_id] = time.perf_counter()
            sent = client.send(TOPIC, b"x" * 128, message_id=message_id)
            if await self._timed("send", sent) is None:
                self.sent_at.pop(message_id, None)

        next_at = time.perf_counter()
        while True:
            next_at += 1 / self.rate
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            if len(in_flight) >= 500:  # a stuck proxy: count it, do not pile up
                self._error(time.perf_counter(), "send", "500 sends in flight, skipped")
                continue
            task = asyncio.ensure_future(send_one())
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)

    async def _consume(self, i: int) -> None:
        client = self._client(f"good-consumer-{i}")
        while True:
            t0 = time.perf_counter()
            try:
                got = await client.receive(GROUP, TOPIC, await_ms=5000, batch=16)
            except Exception as exc:
                self._error(t0, "receive", _describe(exc))
                await asyncio.sleep(0.2)
                continue
            now = time.perf_counter()
            if got.status not in (OK, NOT_FOUND):
                self._error(t0, "receive", pb.Code.Name(got.status))
                await asyncio.sleep(0.2)
            for m in got.messages:
                sent = self.sent_at.pop(m.system_properties.message_id, None)
                if sent is not None:
                    self.latencies.append((sent, "e2e", now - sent))
            if not got.messages:
                continue
            await self._timed("ack", client.ack(GROUP, TOPIC, got.messages))

    async def _heartbeats(self) -> None:
        client = self._client("good-heartbeat")
        request = api.HeartbeatRequest(
            group=pb.Resource(name=GROUP), client_type=pb.ClientType.SIMPLE_CONSUMER
        )
        while True:
            await asyncio.sleep(0.5)
            beat = client.stub.Heartbeat(request, metadata=client.metadata, timeout=10)
            await self._timed("heartbeat", beat)

    async def _settings(self) -> None:
        """A client starting up, once a second: its Telemetry stream, its settings, the
        answer, the end of the stream."""
        client = self._client("good-settings")
        for n in itertools.count():
            await asyncio.sleep(1.0)
            t0 = time.perf_counter()
            call = client.stub.Telemetry(metadata=_metadata(f"good-settings-{n}"))
            try:
                await asyncio.wait_for(call.write(_consumer_settings()), 10)
                answer = await asyncio.wait_for(call.read(), 10)
                if not isinstance(answer, api.TelemetryCommand):  # the end of the stream
                    self._error(t0, "settings", f"ended {(await call.code()).name}")
                elif answer.status.code != OK:
                    self._error(t0, "settings", pb.Code.Name(answer.status.code))
                else:
                    self.latencies.append((t0, "settings", time.perf_counter() - t0))
                await asyncio.wait_for(call.done_writing(), 5)
                await asyncio.wait_for(call.code(), 5)
            except Exception as exc:
                self._error(t0, "settings", _describe(exc))
            finally:
                call.cancel()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"gRPC {exc.code().name}"
    return type(exc).__name__


# -- sampling ---------------------------------------------------------------------------------


class Sampler:
    """The proxy's RSS and CPU seconds every ``period_s``."""

    def __init__(self, proxy: Process, period_s: float = 0.5) -> None:
        self.proxy, self.period_s = proxy, period_s
        self.samples: list[tuple[float, int, float]] = []  # (time, rss bytes, cpu s)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.samples.append(
                (time.perf_counter(), self.proxy.rss_bytes(), self.proxy.cpu_seconds())
            )
            await asyncio.sleep(self.period_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def between(self, t0: float, t1: float) -> list[tuple[float, int, float]]:
        return [s for s in self.samples if t0 <= s[0] <= t1]


def slope_mb_per_min(samples: list[tuple[float, int, float]]) -> float | None:
    """Least-squares slope of RSS over time."""
    if len(samples) < 3:
        return None
    ts = [s[0] for s in samples]
    ys = [s[1] / 1e6 for s in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    if not var:
        return None
    return round(sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var * 60, 2)


async def proxy_health(proxy: Process) -> dict:
    """The proxy's asyncio tasks and Telemetry streams (``/v1/status``; ``telemetry`` only
    from a proxy that reports it) and its open file descriptors."""
    status: dict = {}
    with contextlib.suppress(Exception):
        status = await proxy_status(proxy)
    try:
        fds: int | None = len(os.listdir(f"/proc/{proxy.pid}/fd"))
    except OSError:
        fds = None
    return {"tasks": status.get("tasks"), "fds": fds, "telemetry": status.get("telemetry")}


# -- the phases -------------------------------------------------------------------------------


def _latency_summary(values: list[float]) -> dict:
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 2)

    return {
        "n": len(values),
        "p50_ms": ms(percentile(values, 0.5)),
        "p99_ms": ms(percentile(values, 0.99)),
        "max_ms": ms(max(values) if values else None),
    }


async def run_phase(
    phase: str,
    args: argparse.Namespace,
    proxy: Process,
    good: Good,
    sampler: Sampler,
    logs: Path,
) -> dict:
    kinds = [] if phase == "baseline" else list(KINDS) if phase == "all" else [phase]
    print(f"phase {phase}: {', '.join(kinds) or 'no attacker'}", flush=True)
    t_attack = time.perf_counter()
    rss_before = proxy.rss_bytes()
    health_before = await proxy_health(proxy)
    attackers = []
    try:
        for kind in kinds:
            attackers.append(
                await start_attacker(kind, proxy.address["grpc"], args, logs / "attackers.log")
            )
        setup_s = time.perf_counter() - t_attack
        metrics0 = await scrape(proxy)
        t0, cpu0 = time.perf_counter(), proxy.cpu_seconds()
        acpu0 = sum(a.process.cpu_seconds() for a in attackers)
        await asyncio.sleep(args.seconds)
        t1, cpu1 = time.perf_counter(), proxy.cpu_seconds()
        acpu1 = sum(a.process.cpu_seconds() for a in attackers)
        health_end = await proxy_health(proxy)
        metrics1 = await scrape(proxy)
    finally:
        stats = {a.kind: {"ready": a.ready, "end": await stop_attacker(a)} for a in attackers}
    await asyncio.sleep(args.cooldown)
    t2 = time.perf_counter()
    health_after = await proxy_health(proxy)
    rss_after = proxy.rss_bytes()

    window = sampler.between(t_attack, t1)
    second_half = sampler.between(t0 + (t1 - t0) / 2, t1)
    latencies = {
        kind: _latency_summary([x for s, k, x in good.latencies if k == kind and t0 <= s <= t1])
        for kind in LATENCIES
    }
    in_window = Counter(f"{k}: {w}" for s, k, w in good.errors if t0 <= s <= t1)
    whole = Counter(f"{k}: {w}" for s, k, w in good.errors if t_attack <= s <= t2)
    heartbeats = metrics1.get("rpc:grpc:heartbeat", 0.0) - metrics0.get("rpc:grpc:heartbeat", 0.0)
    rss_peak = max([rss_before, *(s[1] for s in window)])
    slope = slope_mb_per_min(second_half)
    return {
        "phase": phase,
        "attackers": stats,
        "attacker_setup_s": round(setup_s, 1),
        "seconds": round(t1 - t0, 1),
        "good": latencies,
        "good_errors": sum(in_window.values()),
        "good_errors_by_kind": dict(in_window),
        "good_errors_whole_phase": dict(whole),
        "rss_mb": {
            "before": round(rss_before / 1e6, 1),
            "peak": round(rss_peak / 1e6, 1),
            "end": round((window[-1][1] if window else proxy.rss_bytes()) / 1e6, 1),
            "after_cooldown": round(rss_after / 1e6, 1),
        },
        "rss_slope_mb_per_min_second_half": slope,
        "rss_growing": slope is not None and slope > 1.0,
        "proxy_cpu_pct": round((cpu1 - cpu0) / (t1 - t0) * 100, 1),
        "attacker_cpu_pct": round((acpu1 - acpu0) / (t1 - t0) * 100, 1),
        "heartbeats_served_per_s": round(heartbeats / (t1 - t0), 1),
        "proxy_health": {"before": health_before, "end": health_end, "after": health_after},
        "load_1m": round(os.getloadavg()[0], 2),
    }


def _vs_baseline(phases: list[dict]) -> None:
    """Each phase's p99 over the baseline's, per latency kind."""
    base = next((p for p in phases if p["phase"] == "baseline"), None)
    if base is None:
        return
    for p in phases:
        p["p99_vs_baseline"] = {
            kind: round(p["good"][kind]["p99_ms"] / base["good"][kind]["p99_ms"], 2)
            if p["good"][kind]["p99_ms"] and base["good"][kind]["p99_ms"]
            else None
            for kind in LATENCIES
        }


def _attack_line(phase: dict) -> str:
    parts = []
    for kind, s in phase["attackers"].items():
        end = s["end"]
        per_s = end.get("per_s", {})
        if kind == "hoard":
            opened = s["ready"]["counts"].get("streams_opened", 0)
            answers = ", ".join(f"{k} {v}" for k, v in sorted(s["ready"]["answers"].items()))
            held = (phase["proxy_health"]["end"].get("telemetry") or {}).get("streams")
            parts.append(
                f"{opened} streams opened"
                + (f", {held:,} open in the proxy" if held is not None else "")
                + f" (of those read once: {answers or 'none'})"
            )
        elif kind == "heartbeat":
            parts.append(f"{per_s.get('heartbeats', 0):,.0f} heartbeats/s")
        elif kind == "telemetry":
            parts.append(
                f"{per_s.get('telemetry_writes', 0):,.0f} commands/s unread, "
                f"{per_s.get('telemetry_streams', 0):,.0f} streams/s"
            )
    return "; ".join(parts) or "-"


def markdown(report: dict) -> str:
    def pair(d: dict) -> str:
        return f"{_num(d['p50_ms'])} / {_num(d['p99_ms'])}"

    lines = [
        "| phase | hostile load | RSS MB before / peak / end / after | RSS slope, 2nd half "
        "(MB/min) | proxy CPU % | send p50 / p99 ms | send-to-receive p50 / p99 | ack p50 / p99 "
        "| heartbeat p50 / p99 | settings p50 / p99 | good clients' errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["phases"]:
        r = p["rss_mb"]
        g = p["good"]
        errors = p["good_errors"]
        detail = ", ".join(f"{k} {v}" for k, v in p["good_errors_by_kind"].items())
        lines.append(
            f"| {p['phase']} | {_attack_line(p)} | {r['before']} / {r['peak']} / {r['end']} / "
            f"{r['after_cooldown']} | {_num(p['rss_slope_mb_per_min_second_half'])} | "
            f"{p['proxy_cpu_pct']} | {pair(g['send'])} | {pair(g['e2e'])} | {pair(g['ack'])} | "
            f"{pair(g['heartbeat'])} | {pair(g['settings'])} | "
            f"{errors}{f' ({detail})' if detail else ''} |"
        )
    return "\n".join(lines) + "\n"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


async def run(args: argparse.Namespace) -> dict:
    quiet_collector()
    out = Path(args.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    system = System(brokers=args.brokers, modes=(args.mode,), log_dir=logs)
    await system.start()
    good: Good | None = None
    sampler: Sampler | None = None
    try:
        await system.create_topic(TOPIC)
        proxy = system.proxies[args.mode]
        print(f"proxy pid {proxy.pid} at {proxy.address['grpc']}", flush=True)
        good = Good(proxy.address["grpc"], args.producers, args.rate, args.consumers)
        sampler = Sampler(proxy)
        good.start()
        sampler.start()
        await asyncio.sleep(args.warmup)
        phases = []
        for phase in args.phases.split(","):
            phases.append(await run_phase(phase, args, proxy, good, sampler, logs))
            p = phases[-1]
            print(
                f"  rss {p['rss_mb']}, slope {p['rss_slope_mb_per_min_second_half']} MB/min, "
                f"cpu {p['proxy_cpu_pct']}%, errors {p['good_errors']}, "
                + ", ".join(f"{k} p99 {v['p99_ms']}" for k, v in p["good"].items()),
                flush=True,
            )
        _vs_baseline(phases)
        return {
            "settings": {k: v for k, v in vars(args).items() if k not in ("attack", "target")},
            "cores": os.cpu_count(),
            "phases": phases,
        }
    finally:
        if good is not None:
            await good.stop()
        if sampler is not None:
            await sampler.stop()
        await system.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="results/hostile")
    p.add_argument("--seconds", type=float, default=30.0, help="measured time per phase")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--cooldown", type=float, default=5.0, help="after the attacker, per phase")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--mode", default="notify", help="the proxy's receive mode")
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--rate", type=float, default=25.0, help="messages/s per producer")
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--connections", type=int, default=4, help="per attacker")
    p.add_argument("--hoard-streams", type=int, default=2000)
    p.add_argument("--hoard-clients", type=int, default=10, help="client ids of the hoarder")
    p.add_argument("--heartbeat-concurrency", type=int, default=200)
    p.add_argument("--flood-streams", type=int, default=32)
    p.add_argument("--attacker-nice", type=int, default=10)
    # Internal: run one attacker (the harness starts these).
    p.add_argument("--attack", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.attack:
        if args.attacker_nice:
            os.nice(args.attacker_nice)  # here, not in a preexec_fn: the harness runs gRPC threads
        asyncio.run(_attack(args))
        return 0
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        p.error(f"unknown phases {sorted(unknown)}; choose from {','.join(PHASES)}")
    report = asyncio.run(run(args))
    out = Path(args.out)
    (out / "hostile.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (out / "hostile.md").write_text(table)
    print(table)
    worst = [
        p["phase"]
        for p in report["phases"]
        if p["good_errors"] or p["rss_growing"]
        or any((v or 0) > 2 for v in p.get("p99_vs_baseline", {}).values())
    ]  # fmt: skip
    if worst:
        print(f"phases past 2x the baseline p99, with errors or growing RSS: {worst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
