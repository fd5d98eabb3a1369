"""A TCP balancer in front of a fleet of proxies, following each proxy's readiness as a
Kubernetes Service does (the soaks, and the drain's tests); optionally writing a PROXY
protocol header first, as HAProxy's ``send-proxy`` or a cloud NLB does. ``BalancerThread``
runs several on a thread of their own, for a synchronous test."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from proxy.background import start_background, stop_background
from testkit.waits import wait_for

log = logging.getLogger(__name__)


class Balancer:
    """A TCP balancer in front of the fleet, as in a Kubernetes deployment: the clients dial
    one address that spreads connections over the proxies (the Node client cannot take
    several endpoints anyway: grpc-js resolves "a:1,b:2" as one DNS name and fails). Like a
    Kubernetes Service it sends new connections only to proxies whose readiness probe
    passes (``/readyz`` every PROBE_S, as a pod's readinessProbe with periodSeconds 1): a
    proxy that is draining answers 503, one that is starting is not ready yet. Each
    connection goes to the next ready proxy that accepts it, and closes when that proxy's
    side closes (after a GOAWAY, a connection's age or a drained proxy's, the client
    reconnects, through here, to another one). Before the first probe, every proxy counts as
    ready. A proxy being restarted leaves at once (``terminating``), before its SIGTERM, as
    a Service drops a Terminating pod from its endpoints while the pod's preStop hook
    waits, and comes back with its first passing probe once it has started again
    (``started``)."""

    PROBE_S = 1.0
    # A probe not answered in this long leaves the proxy as it was: on the 2-core machine
    # at a load of 50 a proxy's /readyz can take over a second, and counting that as not
    # ready marked every proxy down at once, so the balancer closed every new connection
    # (UNAVAILABLE for the clients, in a run with the connections' age GOAWAY). The
    # Deployment's readinessProbe has timeoutSeconds 2.
    PROBE_TIMEOUT_S = 2.0

    def __init__(
        self,
        targets: Sequence[tuple[str, str | None]],
        *,
        header: Callable[[tuple[str, int]], bytes] | None = None,
    ) -> None:
        """``targets``: (gRPC address, ops HTTP address) of each proxy; one without an ops
        address is always ready. ``header(client)``: the bytes each connection to a proxy
        opens with (a PROXY protocol header naming ``client``, its host and port)."""
        self.targets = targets
        self.header = header
        self.ready: set[str] | None = None  # gRPC addresses whose last probe passed
        self._terminating: set[str] = set()  # gRPC addresses of proxies being restarted
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None
        self._probes: asyncio.Task[None] | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # both sides of every connection
        self._connections: set[asyncio.Task[object]] = set()  # one handler per connection
        self.port = 0

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._probes = start_background(self._probe_loop(), name="balancer probes", log=log)
        return f"127.0.0.1:{self.port}"

    async def _probe_loop(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.PROBE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                answers = await asyncio.gather(*(self._probe(http, ops) for _, ops in self.targets))
                ready = set(self.ready or ())
                for (grpc, _), answer in zip(self.targets, answers, strict=True):
                    if answer is None and self.ready is not None:
                        continue  # slow to answer: as it was (a loaded machine, not a drain)
                    (ready.add if answer else ready.discard)(grpc)
                self.ready = ready
                await asyncio.sleep(self.PROBE_S)

    def terminating(self, address: str) -> None:
        """The proxy at gRPC ``address`` is about to be stopped: no new connection to it,
        whatever its probes say."""
        self._terminating.add(address)

    def started(self, address: str) -> None:
        """The proxy at ``address`` runs again, and has said so on its ready line: its
        probes decide from here on."""
        self._terminating.discard(address)

    @staticmethod
    async def _probe(http: aiohttp.ClientSession, ops: str | None) -> bool | None:
        """200: ready; another status (a drain's 503) or no connection (a dead proxy):
        not ready; no answer within PROBE_TIMEOUT_S: None, unknown. No ops address: ready."""
        if ops is None:
            return True
        try:
            async with http.get(f"http://{ops}/readyz") as response:
                return response.status == 200
        except TimeoutError:
            return None
        except aiohttp.ClientError:
            return False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        this = asyncio.current_task()
        if this is not None:
            self._connections.add(this)
            this.add_done_callback(self._connections.discard)
        self._writers.add(writer)
        try:
            await self._relay(reader, writer)
        finally:
            writer.close()
            self._writers.discard(writer)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        start = next(self._turn)
        order = [self.targets[(start + i) % len(self.targets)][0] for i in range(len(self.targets))]
        for address in order:
            if address in self._terminating:
                continue
            if self.ready is not None and address not in self.ready:
                continue
            host, port = address.rsplit(":", 1)
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), 2
                )
            except (OSError, TimeoutError):
                continue  # that proxy is down: the next one
            self._writers.add(up_writer)
            if self.header is not None:
                up_writer.write(self.header(writer.get_extra_info("peername")[:2]))
            pipes = [
                asyncio.ensure_future(_pipe(reader, up_writer)),
                asyncio.ensure_future(_pipe(up_reader, writer)),
            ]
            try:
                # Either side ending ends the connection: the client sees its proxy go.
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Closed before anything else is awaited, so a cancelled relay cannot leave
                # the proxy's side open (its server would wait for it when it stops).
                up_writer.close()
                self._writers.discard(up_writer)
                for task in pipes:
                    task.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
            return
        # no proxy ready: the client sees its connection closed

    async def close(self) -> None:
        """Close every connection, both sides, and let each relay end by itself: a relay
        task cancelled before its first step makes asyncio's stream callback log an error."""
        await stop_background(self._probes)
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            relays = list(self._connections)
            if relays:
                _, stuck = await asyncio.wait(relays, timeout=5)
                for task in stuck:
                    task.cancel()
                await asyncio.gather(*stuck, return_exceptions=True)
            await self._server.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


# -- the run ------------------------------------------------------------------------------


class BalancerThread:
    """testkit's TCP balancers (readiness-following, as a Kubernetes Service), one per
    public port of the proxies, on an event loop of its own thread, for this synchronous
    test. Proxy n is each balancer's target n."""

    def __init__(self, ports: list[list[tuple[str, str]]]) -> None:
        """``ports``: for each public port, each proxy's (that port, its ops address)."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.balancers = [Balancer(targets) for targets in ports]
        self._targets = [[target for target, _ in targets] for targets in ports]

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def start(self) -> list[str]:
        """Each balancer's address."""
        self.thread.start()
        return [self.call(b.start()) for b in self.balancers]

    def terminating(self, n: int) -> None:
        for balancer, targets in zip(self.balancers, self._targets, strict=True):
            balancer.terminating(targets[n])

    def started(self, n: int) -> None:
        for balancer, targets in zip(self.balancers, self._targets, strict=True):
            balancer.started(targets[n])

    def is_ready(self, n: int) -> bool:
        return all(
            targets[n] in (balancer.ready or ())
            for balancer, targets in zip(self.balancers, self._targets, strict=True)
        )

    def roll(self, proxies: list[Any], start: Callable[[int], Any], stop_timeout_s: float) -> None:
        """A rolling restart of ``proxies`` (``testkit.official.harness.ProxyProcess``es;
        proxy n is each balancer's target n), in place: each out of the balancers, stopped
        (SIGTERM: its drain) within ``stop_timeout_s``, ``start(n)`` again on its ports,
        and, as a rolling update waits for its new pod to be ready, seen ready before the
        next one."""
        for n, proxy in enumerate(proxies):
            self.terminating(n)
            complaint = proxy.stop(stop_timeout_s)
            assert complaint is None, f"{complaint}\n{proxy.logs()}"
            proxies[n] = start(n)
            self.started(n)
            wait_for(
                functools.partial(self.is_ready, n),
                timeout=10,
                what=f"the balancers to see proxy {n} ready again",
            )

    def stop(self) -> None:
        try:
            for balancer in self.balancers:
                self.call(balancer.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
