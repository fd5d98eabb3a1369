"""Start-up and shutdown of ProxyApp cannot leak: a start that fails at any step stops
what it had started, in reverse order, and leaves no task, thread or open file (socket)
behind; a failed start's ``stop`` is a no-op; a full start and stop leaves nothing either.

The process's own counts are the evidence: asyncio tasks, threads (the event log's writer)
and file descriptors (/proc/self/fd: every listening and connected socket). grpcio keeps a
few process-wide descriptors after its first server, so one full start and stop runs first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import socket
import threading

import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.api.v2 import definition_pb2 as pb
from proxy.app import ProxyApp
from proxy.config import ProxyConfig
from testkit.waits import wait_until


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def own_threads() -> int:
    """Threads other than the event loop's default executor's (``asyncio.to_thread``): that
    pool is the loop's, grows by one whenever a call finds no worker idle yet, and is
    reused, so its size says nothing about a leak."""
    return sum(1 for t in threading.enumerate() if not t.name.startswith("asyncio_"))


def others(tasks: set[asyncio.Task]) -> set[asyncio.Task]:
    return {t for t in tasks if not t.done()} - {asyncio.current_task()}


@pytest.fixture
async def cluster():
    async with StubCluster(2, template=BrokerConfig(topics=["T"])) as running:
        yield running


def config_for(cluster: StubCluster, tmp_path) -> ProxyConfig:
    return ProxyConfig(
        grpc_host="127.0.0.1",
        grpc_port=0,
        http_host="127.0.0.1",
        http_port=0,
        namesrv_addrs=[cluster.namesrv_address],
        event_log_dir=str(tmp_path / "events"),
        proxy_id="start-stop",
    )


async def settled(tasks: set[asyncio.Task], threads: int, fds: int) -> None:
    """Until the process holds no more tasks, threads and descriptors than before."""
    await wait_until(lambda: not (others(asyncio.all_tasks()) - tasks), timeout=5)
    await wait_until(lambda: own_threads() <= threads, timeout=5)
    await wait_until(lambda: open_fds() <= fds, timeout=5)


async def test_a_start_that_fails_at_any_step_stops_what_started(cluster, tmp_path, monkeypatch):
    config = config_for(cluster, tmp_path)
    warm = ProxyApp(config)
    await warm.start()
    await warm.stop()
    tasks, threads, fds = others(asyncio.all_tasks()), own_threads(), open_fds()

    names = [step.name for step in ProxyApp(config)._steps()]
    for failing in range(len(names)):
        app = ProxyApp(config)
        journal: list[str] = []
        steps = app._steps()

        def traced(step, index=failing, journal=journal, steps=steps):
            async def start() -> None:
                if steps.index(step) == index:
                    raise RuntimeError(f"{step.name} failed")
                await step.start()
                journal.append(f"start {step.name}")

            async def stop() -> None:
                await step.stop()
                journal.append(f"stop {step.name}")

            return dataclasses.replace(step, start=start, stop=stop)

        wrapped = [traced(step) for step in steps]
        monkeypatch.setattr(app, "_steps", lambda wrapped=wrapped: wrapped)

        with pytest.raises(RuntimeError, match=f"{names[failing]} failed"):
            await app.start()

        started = names[:failing]
        assert journal == [f"start {n}" for n in started] + [f"stop {n}" for n in reversed(started)]
        assert not app.ready
        await app.stop()  # after a failed start: nothing more to do, no error
        assert journal[-1:] == ([f"stop {names[0]}"] if started else [])
        await settled(tasks, threads, fds)


async def test_a_port_in_use_fails_the_start_and_frees_the_ops_port(cluster, tmp_path):
    """A real failure halfway: the gRPC port is taken. The ops server, started before the
    gRPC server, is stopped again and its port free. (grpcio opens two descriptors of its
    own the first time a bind fails, once per process: the first attempt is not counted.)"""
    config = config_for(cluster, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        on_taken = dataclasses.replace(config, grpc_port=taken.getsockname()[1])
        with pytest.raises(RuntimeError):
            await ProxyApp(on_taken).start()
        tasks, threads, fds = others(asyncio.all_tasks()), own_threads(), open_fds()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ops_port = probe.getsockname()[1]

        with pytest.raises(RuntimeError):
            await ProxyApp(dataclasses.replace(on_taken, http_port=ops_port)).start()

        await settled(tasks, threads, fds)
        with socket.socket() as again:
            again.bind(("127.0.0.1", ops_port))  # free: the ops server let it go


async def test_a_full_start_and_stop_leaves_nothing_running(cluster, tmp_path, lean):
    config = config_for(cluster, tmp_path)
    warm = ProxyApp(config)
    await warm.start()
    await warm.stop()
    tasks, threads, fds = others(asyncio.all_tasks()), own_threads(), open_fds()

    app = ProxyApp(config)
    await app.start()
    client = lean(app, "start-stop-client")
    assert (await client.send("T", b"x")).status.code == pb.Code.OK
    await client.close()
    await app.stop()
    await app.stop()  # twice: a no-op

    await settled(tasks, threads, fds)


async def test_stop_drains_polls_and_telemetry_streams_without_an_error(cluster, tmp_path, lean):
    """The drain (a rolling restart's SIGTERM): a parked poll is answered empty, not
    refused; each Telemetry stream (a consumer's, a producer's) gets a
    ReconnectEndpointsCommand and then its end: OK for the Java client, which reopens on
    either end, UNAVAILABLE for the Python one, which logs an OK end as an error. The Node
    client (its ``x-mq-language`` says "HTTP") gets no command, which it would answer with a
    new stream on the connection being drained: only the OK end (``DrainEnd``). The stop
    does not wait out the grace for those streams."""
    import grpc

    from proxy.api.v2 import service_pb2 as api

    # Connections that never age: this is the drain's second part, the server's stop, with
    # the streams still open (the first part would wait for their connections to age).
    config = dataclasses.replace(
        config_for(cluster, tmp_path), shutdown_grace_s=25.0, grpc_max_connection_age_s=0
    )
    app = ProxyApp(config)
    await app.start()
    client = lean(app, "drain-client")
    consumer = pb.Settings(
        client_type=pb.ClientType.SIMPLE_CONSUMER,
        subscription=pb.Subscription(group=pb.Resource(name="G")),
    )
    producer = pb.Settings(
        client_type=pb.ClientType.PRODUCER,
        publishing=pb.Publishing(topics=[pb.Resource(name="T")]),
    )
    streams = {}
    for name, settings, language in (
        ("java-consumer", consumer, "JAVA"),
        ("node-producer", producer, "HTTP"),
        ("python-consumer", consumer, "PYTHON"),
        ("python-producer", producer, "PYTHON"),
    ):
        call = client.stub.Telemetry(metadata=(*client.metadata, ("x-mq-language", language)))
        await call.write(api.TelemetryCommand(settings=settings))
        assert (await call.read()).status.code == pb.Code.OK
        streams[name] = call
    poll = asyncio.ensure_future(client.receive("G", "T", await_ms=20_000, batch=1))
    in_flight = app.engine.in_flight
    await wait_until(lambda: sum(in_flight.values()) == 1, timeout=5)

    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(app.stop(), 15)
    assert loop.time() - started < config.shutdown_grace_s  # not held to the grace by a stream

    answer = await asyncio.wait_for(poll, 5)
    assert answer.status == pb.Code.MESSAGE_NOT_FOUND  # answered, not refused
    for name, call in streams.items():
        if name.startswith("node"):
            assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF, name  # type: ignore[attr-defined]
            assert await call.code() == grpc.StatusCode.OK, name
            continue
        command = await asyncio.wait_for(call.read(), 5)
        assert command.WhichOneof("command") == "reconnect_endpoints_command", name
        assert command.reconnect_endpoints_command.nonce == "drain-client"
        if name.startswith("python"):
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await asyncio.wait_for(call.read(), 5)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, name
        else:
            assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF, name  # type: ignore[attr-defined]
            assert await call.code() == grpc.StatusCode.OK, name


async def behind_a_balancer(cluster: StubCluster, tmp_path, age_s: float):
    """Two proxies whose connections age in ``age_s``, started, and a balancer (not started)
    that follows their /readyz every 0.2 s: it notices a drain long before the age."""
    from testkit.balancer import Balancer

    base = dataclasses.replace(config_for(cluster, tmp_path), grpc_max_connection_age_s=age_s)
    first = ProxyApp(dataclasses.replace(base, proxy_id="first"))
    second = ProxyApp(dataclasses.replace(base, proxy_id="second", event_log_dir=None))
    await first.start()
    await second.start()
    balancer = Balancer([(f"127.0.0.1:{app.grpc_port}", f"127.0.0.1:{app.http_port}")
                         for app in (first, second)])  # fmt: skip
    balancer.PROBE_S = 0.2
    return first, second, balancer


async def test_a_drain_under_load_moves_clients_before_its_server_stops(cluster, tmp_path):
    """Sixteen callers send without a pause through a balancer that follows /readyz, as a
    Kubernetes Service does, while the proxy they reach drains. The connection's age GOAWAY
    (``grpc_max_connection_age_s``) moves them to the other proxy while the first still
    serves, so no call crosses the server's stop: not one error. With connections that
    never age, the same run costs a dozen CANCELLED sends, cancelled by gRPC's core as the
    server stops (docs/reliability.md, "Drain")."""
    import grpc

    from testkit.lean_client import LeanClient

    first, second, balancer = await behind_a_balancer(cluster, tmp_path, age_s=1.0)
    client = LeanClient(await balancer.start(), "drain-load")
    errors: list[str] = []
    sent = 0
    sending = True

    async def sender() -> None:
        nonlocal sent
        while sending:
            try:
                answer = await client.send("T", b"x")
            except grpc.aio.AioRpcError as err:
                errors.append(f"{err.code().name}: {err.details()}")
                continue
            if answer.status.code != pb.Code.OK:
                errors.append(pb.Code.Name(answer.status.code))
            sent += 1

    senders = [asyncio.ensure_future(sender()) for _ in range(16)]
    try:
        await wait_until(lambda: sent >= 200, timeout=10)
        assert "SendMessage" in first.service.open_calls  # the first proxy served sends
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(first.stop(), 20)
        stopped_after = loop.time() - started
        before = sent
        await wait_until(lambda: sent >= before + 200, timeout=10)  # served by the second
    finally:
        sending = False
        await asyncio.gather(*senders)
        await client.close()
        await balancer.close()
        await first.stop()
        await second.stop()
    assert errors == [], errors[:5]
    # The clients left once their connection aged (1-1.1 s, and the margin).
    assert stopped_after < first.service.connections.lifetime_s + 2, stopped_after


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False], ids=["with-stream", "stream-ended"])
async def test_a_drain_waits_for_a_quiet_client_until_its_connection_has_aged(
    cluster, tmp_path, stream
):
    """A client that sends rarely (once a second, as a quiet producer does) stays on its
    connection until that connection's age GOAWAY, whether it keeps a Telemetry stream open
    there, as every official client does, or not (the Python client's stream, once ended,
    comes back only at its next settings sync, minutes later): the drain must not stop the
    server before then, else the client's next call can cross the server's stop and be
    cancelled. (The drain used to end at the first 0.5 s without a call, and later, without
    the kernel's table of open connections, at the first 0.5 s in which no call was open on
    a connection holding no stream: the CANCELLED calls of the seventh official soak and of
    the rolling restarts.) Once the connection has aged, the client's calls reach the other
    proxy, without an error."""
    import grpc

    from proxy.api.v2 import service_pb2 as api
    from testkit.lean_client import LeanClient

    age_s = 3.0
    first, second, balancer = await behind_a_balancer(cluster, tmp_path, age_s)
    client = LeanClient(await balancer.start(), "quiet-producer")
    telemetry = client.stub.Telemetry(metadata=client.metadata)
    errors: list[str] = []
    served: list[str] = []  # by which proxy, from its connections
    try:
        await telemetry.write(
            api.TelemetryCommand(
                settings=pb.Settings(
                    client_type=pb.ClientType.PRODUCER,
                    publishing=pb.Publishing(topics=[pb.Resource(name="T")]),
                )
            )
        )
        assert (await telemetry.read()).status.code == pb.Code.OK
        if not stream:
            await telemetry.done_writing()
            assert await telemetry.read() is grpc.aio.EOF  # type: ignore[attr-defined]
        opened = asyncio.get_running_loop().time()
        assert len(first.service.connections) == 1  # the balancer sent it to the first

        async def quiet_sends(count: int) -> None:
            for _ in range(count):
                try:
                    answer = await client.send("T", b"x")
                    if answer.status.code != pb.Code.OK:
                        errors.append(pb.Code.Name(answer.status.code))
                except grpc.aio.AioRpcError as err:
                    errors.append(f"{err.code().name}: {err.details()}")
                served.append("second" if len(second.service.connections) else "first")
                await asyncio.sleep(1.0)  # one send a second, quiet between, past the age

        sends = asyncio.ensure_future(quiet_sends(int(age_s * 2 + 3)))
        await wait_until(lambda: bool(served), timeout=5, what="the first send")  # before the stop
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(first.stop(), 20)
        stopped = loop.time()
        await asyncio.wait_for(sends, 30)
    finally:
        telemetry.cancel()
        await client.close()
        await balancer.close()
        await first.stop()
        await second.stop()
    assert errors == [], errors
    # Not before the connection's earliest age GOAWAY (gRPC takes 90-110 % of the age).
    assert stopped - opened >= age_s * 0.9, stopped - opened
    assert served[-1] == "second", served


async def test_a_drain_does_not_wait_for_clients_that_have_closed(cluster, tmp_path):
    """Clients that held streams and closed their channels before the stop cost the drain
    nothing: their streams ended with them, and their connections closed, far before they
    would age (60 s here)."""
    from proxy.api.v2 import service_pb2 as api
    from testkit.lean_client import LeanClient

    config = dataclasses.replace(config_for(cluster, tmp_path), grpc_max_connection_age_s=60.0)
    app = ProxyApp(config)
    await app.start()
    try:
        for n in range(4):
            client = LeanClient(f"127.0.0.1:{app.grpc_port}", f"closing-{n}", own_connection=True)
            stream = client.stub.Telemetry(metadata=client.metadata)
            await stream.write(api.TelemetryCommand(settings=pb.Settings(
                client_type=pb.ClientType.PRODUCER,
                publishing=pb.Publishing(topics=[pb.Resource(name="T")]),
            )))  # fmt: skip
            assert (await stream.read()).status.code == pb.Code.OK
            assert (await client.send("T", b"x")).status.code == pb.Code.OK
            await client.close()
            # gRPC closes a closed channel's connection once nothing holds its calls, as
            # when a client's process exits; until then it is open, and may still be used.
            del stream, client
            gc.collect()
        assert len(app.service.connections) == 4
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(app.stop(), 30)
        assert loop.time() - started < 5, loop.time() - started
    finally:
        await app.stop()
