"""Clients' metric exports at scale: N exporters shaped like the official clients, over a
``--workers 2`` proxy whose connections age out, end with every histogram counting exactly
what the exporters recorded.

Each exporter is one client: its own connection, its own client id, four cumulative
series (send cost, delivery latency, await and process time) that it adds random
observations to each round, then exports whole, as the Java and Python clients do. The
proxy's ``grpc_max_connection_age_s`` is shorter than a round, so each exporter's next
export goes over a new connection, which the kernel may give to the other worker: the
moves that connection aging makes. A ``busy`` answer (RESOURCE_EXHAUSTED) is retried, as
the clients' OTLP exporters retry it. At the end, the supervisor's ``/metrics`` must hold,
per histogram, exactly the recorded bucket counts, and every worker must have taken exports.

    make soak-exporters                       # 3,000 exporters, 4 rounds
    python -m bench.export_soak --exporters 100 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as otlp_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from proxy.loop import run_main
from proxy.observability.metrics import CLIENT_HISTOGRAMS
from testkit.metrics_text import samples, total
from testkit.otlp import client_headers, export, point
from testkit.processes import Process, _spawn, terminate

CONNECTION_AGE_S = 1.0
EXPORT_TIMEOUT_S = 20.0
BUSY_RETRIES = 50
CONCURRENT_EXPORTS = 32
GROUPS = 10
TOPICS = 7


@dataclass
class Series:
    """One cumulative series of an exporter."""

    name: str
    attributes: dict[str, str]
    counts: list[int]
    total: float = 0.0

    def record(self, rng: random.Random) -> None:
        for _ in range(rng.randint(0, 5)):
            bucket = rng.randrange(len(self.counts))
            self.counts[bucket] += 1
            self.total += rng.randint(0, 900) / 8  # exact in binary: sums compare exactly


@dataclass
class Exporter:
    client_id: str
    start_ns: int
    series: list[Series] = field(default_factory=list)
    channel: grpc.aio.Channel | None = None

    @classmethod
    def make(cls, i: int) -> Exporter:
        client_id = f"soak-exporter-{i}"
        group, topic = f"G{i % GROUPS}", f"T{i % TOPICS}"
        me = cls(client_id, time.time_ns())
        consumer = {"consumer_group": group, "topic": topic, "client_id": client_id}
        for name, extra in (
            ("rocketmq_send_cost_time", {"topic": topic, "client_id": client_id,
                                         "invocation_status": "success"}),
            ("rocketmq_delivery_latency", consumer),
            ("rocketmq_await_time", consumer),
            ("rocketmq_process_time", {**consumer, "invocation_status": "success"}),
        ):  # fmt: skip
            buckets = len(CLIENT_HISTOGRAMS[name][1]) + 1
            me.series.append(Series(name, extra, [0] * buckets))
        return me

    def export(self) -> ExportMetricsServiceRequest:
        age_s = (time.time_ns() - self.start_ns) / 1e9
        return export(*(
            (s.name, point(s.counts, s.total, name=s.name, start_ns=self.start_ns,
                           age_s=age_s, **s.attributes))
            for s in self.series
        ))  # fmt: skip


async def _export(exporter: Exporter, grpc_address: str, stats: Counter[str]) -> None:
    if exporter.channel is None:
        exporter.channel = grpc.aio.insecure_channel(
            grpc_address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
    stub = otlp_grpc.MetricsServiceStub(exporter.channel)
    metadata = client_headers(client_id=exporter.client_id)
    request = exporter.export()
    for attempt in range(BUSY_RETRIES):
        try:
            await stub.Export(request, metadata=metadata, timeout=EXPORT_TIMEOUT_S)
            stats["exports"] += 1
            return
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                raise
            stats[exc.code().name] += 1
            await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
    raise RuntimeError(f"{exporter.client_id}: busy {BUSY_RETRIES} times in a row")


def _histograms(text: str) -> dict[str, list[float]]:
    """Per client histogram: its bucket counts (not cumulative) summed over label sets,
    then its sum, from a /metrics text."""
    out: dict[str, list[float]] = {}
    for name, (_, bounds) in CLIENT_HISTOGRAMS.items():
        les = [*bounds, float("inf")]
        cumulative = [0.0] * len(les)
        for labels, value in samples(text, f"{name}_bucket"):
            cumulative[les.index(float(labels["le"]))] += value
        counts = [b - a for a, b in zip([0.0, *cumulative], cumulative, strict=False)]
        out[name] = [*counts, total(text, f"{name}_sum")]
    return out


def _recorded(exporters: list[Exporter]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for e in exporters:
        for s in e.series:
            row = out.setdefault(s.name, [0.0] * (len(s.counts) + 1))
            for i, n in enumerate([*s.counts, s.total]):
                row[i] += n
    return out


@dataclass
class Report:
    exporters: int
    rounds: int
    seconds: float
    exports: int
    retried: dict[str, int]  # busy (RESOURCE_EXHAUSTED) or UNAVAILABLE answers retried
    exports_per_worker: list[float]
    recorded: dict[str, list[float]]  # per histogram: bucket counts, then the sum
    on_metrics: dict[str, list[float]]  # the same, from the supervisor's /metrics

    @property
    def exact(self) -> bool:
        return self.on_metrics == self.recorded


async def run(exporters: int, rounds: int, seed: int = 1) -> Report:
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="export-soak-"))
    config = workdir / "proxy.toml"
    config.write_text(
        f"grpc_max_connection_age_s = {CONNECTION_AGE_S}\n"
        '[client_metrics]\nmode = "proxy"\n'
        f"max_client_series = {max(20_000, exporters * 5)}\n"
    )
    proxy: Process = await _spawn(
        "proxy", "proxy.cli", "main", "--workers", "2", "--embedded-brokers", "1",
        "--grpc-port", "0", "--http-port", "0", "--log-level", "warning",
        "--config", str(config),
    )  # fmt: skip
    stats: Counter[str] = Counter()
    pool = [Exporter.make(i) for i in range(exporters)]
    gate = asyncio.Semaphore(CONCURRENT_EXPORTS)
    started = time.monotonic()
    try:
        grpc_address, http = proxy.address["grpc"], proxy.address["http"]

        async def one(e: Exporter) -> None:
            async with gate:
                await _export(e, grpc_address, stats)

        for _ in range(rounds):
            round_start = time.monotonic()
            for e in pool:
                for s in e.series:
                    s.record(rng)
            async with asyncio.TaskGroup() as tg:
                for e in pool:
                    tg.create_task(one(e))
            # Every connection outlives its age before the next round: each export of the
            # next round opens a new one, on either worker.
            await asyncio.sleep(max(0.0, CONNECTION_AGE_S * 2 - (time.monotonic() - round_start)))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            async with session.get(f"http://{http}/metrics") as r:
                group_text = await r.text()
            async with session.get(f"http://{http}/v1/status") as r:
                status = await r.json()
            per_worker = []
            for worker in status["workers"]:
                async with session.get(f"http://{worker['http']}/metrics") as r:
                    per_worker.append(_exports_ok(await r.text()))
    finally:
        for e in pool:
            if e.channel is not None:
                await e.channel.close(None)
        assert isinstance(proxy.proc, asyncio.subprocess.Process)  # ours, from _spawn
        await terminate(proxy.proc, 30)
        shutil.rmtree(workdir, ignore_errors=True)
    exports = stats.pop("exports", 0)
    return Report(
        exporters, rounds, round(time.monotonic() - started, 1), exports, dict(stats),
        per_worker, _recorded(pool), _histograms(group_text),
    )  # fmt: skip


def _exports_ok(text: str) -> float:
    return total(text, "rocketmq_proxy_client_metrics_exports_total", result="ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exporters", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the report here as JSON too")
    args = parser.parse_args()

    async def go() -> int:
        report = await run(args.exporters, args.rounds, args.seed)
        text = json.dumps({**asdict(report), "exact": report.exact}, indent=1)
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        return 0 if report.exact and all(report.exports_per_worker) else 1

    sys.exit(run_main(go()))


if __name__ == "__main__":
    main()
