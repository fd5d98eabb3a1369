"""The official RocketMQ 5 Python client (rocketmq-python-client 5.1.2) as a benchmark
consumer (``bench/calibrate_client.py``, ``bench/peer.py``): one SimpleConsumer that
receives, acks each message (one AckMessage per message, as that client does) and receives
again, until told to stop.

Run it with ``.venv-interop/bin/python`` (``make interop-deps``), never with the project's own
interpreter: the client bundles its own ``apache.rocketmq.v2`` descriptors and protobuf. Of
the project it imports only its neighbour ``official_python.py``;
``testkit/official/python_client.py`` documents what the client requires of the server. Set HOME
to move the client's log (~/logs/rocketmq_python).

    official_consumer.py --endpoint HOST:PORT --group G --topic T --await-seconds S
        [--batch 16] [--invisible-seconds 30] [--deadline-seconds D]
        [--lite-topics N --lite-prefix P]

With ``--lite-topics N`` it is a LiteSimpleConsumer (RocketMQ 5.5) bound to the parent topic
T, subscribed to the lite topics P-0 ... P-(N-1) one SyncLiteSubscription at a time, as an
application that adds them one by one does; "ready" comes after the last one. With
``--push`` too it is a LitePushConsumer instead (the Apache proxy 5.5.0 serves no
LiteSimpleConsumer): its listener emits each message and acks it; there are no "empty"
events, and "done" counts messages only.

Stops after the receive in progress when stdin reaches end of file (or reads "stop"), then
shuts the consumer down. One JSON object per line on stdout, flushed at once:

    {"event": "ready", "t": <time.time()>, "endpoints": [...], "subscribe_s": s}
                                                                 started, route and settings in
    {"event": "message", "t": ..., "id": ..., "body": ..., "attempt": ...}  t = receive returned
    {"event": "empty", "t": ...}                                 a receive without messages
    {"event": "error", "t": ..., "error": "..."}                 a receive or an ack failed
    {"event": "done", "receives": n, "empty": n, "acks": n, "errors": n}

Exit 0; 1 when start-up fails; 3 when the whole run overran --deadline-seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback

# Run as a script from this directory: its helpers are beside it.
from official_python import (
    arm_watchdog,
    client_configuration,
    route_endpoints,
    simple_consumer,
    tls_enabled,
    wait_for_settings,
)


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def watch_stdin(stop: threading.Event) -> None:
    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=read, name="stdin-watch", daemon=True).start()


def start(consumer, args: argparse.Namespace) -> None:
    """Route and settings in, the lite topics subscribed (if any); then "ready"."""
    endpoints = route_endpoints(consumer, args.topic)
    wait_for_settings(consumer)
    started = time.time()
    for i in range(args.lite_topics):
        consumer.subscribe_lite(f"{args.lite_prefix}-{i}")
    if args.lite_topics:
        # The 5.1.2 client sends subscribe_lite("abc") as the lite topics a, b, c (it
        # extends the request's set with the string); its own full sync every 30 s puts
        # the right set on the brokers. Sync it now, or the first 30 s measure that bug.
        consumer.subscribe_lite_all()
    emit("ready", t=time.time(), endpoints=endpoints, subscribe_s=time.time() - started)


def lite_consumer(args: argparse.Namespace):
    """A started LiteSimpleConsumer bound to ``args.topic``; the caller shuts it down."""
    from rocketmq import LiteSimpleConsumer

    consumer = LiteSimpleConsumer(
        args.topic,
        client_configuration(args.endpoint),
        args.group,
        await_duration=args.await_seconds,
        tls_enable=tls_enabled(),
    )
    consumer.startup()
    return consumer


def lite_push(args: argparse.Namespace) -> int:
    """A LitePushConsumer subscribed to the lite topics, until told to stop."""
    from rocketmq import ConsumeResult, LitePushConsumer, MessageListener

    stop = threading.Event()
    count = [0]

    class Listener(MessageListener):
        def consume(self, message) -> ConsumeResult:
            count[0] += 1
            emit(
                "message",
                t=time.time(),
                id=message.message_id,
                lite_topic=message.lite_topic,
                attempt=message.delivery_attempt,
            )
            return ConsumeResult.SUCCESS

    consumer = LitePushConsumer(
        client_configuration(args.endpoint),
        args.group,
        args.topic,
        Listener(),
        tls_enable=tls_enabled(),
    )
    consumer.startup()
    try:
        start(consumer, args)
        watch_stdin(stop)
        stop.wait()
    finally:
        consumer.shutdown()
    emit("done", receives=0, empty=0, acks=count[0], errors=0)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.lite_topics and args.push:
        return lite_push(args)
    if args.lite_topics:
        consumer = lite_consumer(args)
    else:
        consumer = simple_consumer(args.endpoint, args.group, args.topic, "*", args.await_seconds)
    stop = threading.Event()
    receives = empty = acks = errors = 0
    try:
        start(consumer, args)
        watch_stdin(stop)
        while not stop.is_set():
            receives += 1
            try:
                batch = consumer.receive(args.batch, args.invisible_seconds)
            except Exception as exc:
                errors += 1
                emit("error", t=time.time(), error=f"receive: {type(exc).__name__}: {exc}")
                stop.wait(0.5)
                continue
            now = time.time()
            if not batch:
                empty += 1
                emit("empty", t=now)
            for msg in batch:
                emit(
                    "message",
                    t=now,
                    id=msg.message_id,
                    lite_topic=getattr(msg, "lite_topic", None),
                    body=msg.body.decode("utf-8", "replace") if msg.body else "",
                    attempt=msg.delivery_attempt,
                )
            for msg in batch:
                try:
                    consumer.ack(msg)
                    acks += 1
                except Exception as exc:
                    errors += 1
                    emit("error", t=time.time(), error=f"ack: {type(exc).__name__}: {exc}")
    finally:
        consumer.shutdown()
    emit("done", receives=receives, empty=empty, acks=acks, errors=errors)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="official_consumer.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--endpoint", required=True, help="proxy gRPC address HOST:PORT")
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--await-seconds", type=int, required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--invisible-seconds", type=int, default=30)
    parser.add_argument("--deadline-seconds", type=float, default=900.0)
    parser.add_argument("--lite-topics", type=int, default=0, help="a LiteSimpleConsumer of N")
    parser.add_argument("--lite-prefix", default="lite")
    parser.add_argument("--push", action="store_true", help="with --lite-topics: push")
    args = parser.parse_args(argv)
    arm_watchdog(args.deadline_seconds)
    try:
        return run(args)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        sys.stderr.write(f"official_consumer failed: {type(exc).__name__}: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
