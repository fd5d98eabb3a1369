"""Does pop-with-notify help a push consumer? Measured on in-process broker stubs.

A push consumer keeps one long poll per assigned queue, and the proxy assigns one queue per
broker: it already waits on every broker. Each poll can be served on its named broker only
(``receive.push_named_broker_only``, the default) or as any notify poll: first pop on the
named broker, then probes on *every* broker. This plays C push consumers (C x B polls with
``auto_renew``) against B stub brokers while messages arrive one at a time on random
brokers, and reports per delivered message the broker requests (pops + probes) and the
delivery latency (send to answer).

    PYTHONPATH=. .venv/bin/python -m bench.bench_push [--consumers 4] [--messages 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from broker_stub import BrokerConfig, StubCluster
from proxy.app import ProxyApp
from proxy.config import ProxyConfig, ReceiveConfig, ReceiveMode
from proxy.remoting.broker_client import BrokerClient
from testkit.lean_client import LeanClient, receive_request

TOPIC, GROUP = "PushBench", "PushBenchGroup"


async def run(named_only: bool, consumers: int, messages: int, brokers: int) -> dict:
    async with StubCluster(brokers, template=BrokerConfig(topics=[TOPIC])) as cluster:
        config = ProxyConfig(
            grpc_port=0,
            http_port=0,
            namesrv_addrs=[cluster.namesrv_address],
            receive=ReceiveConfig(mode=ReceiveMode.NOTIFY, push_named_broker_only=named_only),
        )
        app = ProxyApp(config)
        await app.start()
        sent_at: dict[bytes, float] = {}
        latencies: list[float] = []
        done = asyncio.Event()
        clients = [LeanClient(f"127.0.0.1:{app.grpc_port}", f"push-{i}") for i in range(consumers)]
        names = [b.name for b in cluster.brokers]

        async def poll_forever(client: LeanClient, broker: str) -> None:
            while not done.is_set():
                request = receive_request(GROUP, TOPIC, await_ms=5000, invisible_ms=None,
                                          broker=broker)  # fmt: skip
                request.auto_renew = True
                got = []
                async for response in client.stub.ReceiveMessage(
                    request, metadata=client.metadata, timeout=8
                ):
                    if response.WhichOneof("content") == "message":
                        got.append(response.message)
                now = time.monotonic()
                for m in got:
                    latencies.append(now - sent_at[m.body])
                if got:
                    await client.ack(GROUP, TOPIC, got)
                if len(latencies) >= messages:
                    done.set()

        polls = [asyncio.ensure_future(poll_forever(c, b)) for c in clients for b in names]
        producers = [BrokerClient(b.name, b.address) for b in cluster.brokers]
        await asyncio.sleep(1.0)
        requests_before = app.engine.hub.probes_sent
        pops_before = _pops(app)
        for i in range(messages):
            body = f"m{i}".encode()
            sent_at[body] = time.monotonic()
            await random.choice(producers).send(TOPIC, body)
            await asyncio.sleep(random.expovariate(20))  # about 20 messages a second
        await asyncio.wait_for(done.wait(), 30)
        probes = app.engine.hub.probes_sent - requests_before
        pops = _pops(app) - pops_before
        for task in polls:
            task.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        for c in clients:
            await c.close()
        for p in producers:
            await p.close()
        await app.stop()
    n = len(latencies)
    return {
        "named_only": named_only,
        "delivered": n,
        "pops_per_msg": round(pops / n, 2),
        "probes_per_msg": round(probes / n, 2),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(sorted(latencies)[int(n * 0.99) - 1] * 1000, 1),
    }


_POPS = [0]
_original_pop = BrokerClient.pop


async def _counted_pop(self, *args, **kwargs):  # every pop the proxy makes
    _POPS[0] += 1
    return await _original_pop(self, *args, **kwargs)


BrokerClient.pop = _counted_pop  # type: ignore[method-assign]


def _pops(app: ProxyApp) -> int:
    return _POPS[0]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--brokers", type=int, default=3)
    args = parser.parse_args()
    for named_only in (True, False):
        print(await run(named_only, args.consumers, args.messages, args.brokers))


if __name__ == "__main__":
    asyncio.run(main())
