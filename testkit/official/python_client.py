"""Drive the official RocketMQ 5 Python client (rocketmq-python-client 5.1.2) as a test peer.

Run it with ``.venv-interop/bin/python`` (``make interop-deps``), never with the project's own
interpreter: the client bundles its own generated ``apache.rocketmq.v2`` descriptors and its own
protobuf. Same command line as ``node/client.mjs``::

    produce --endpoint HOST:PORT --topic T --count N [--tag X] [--keys K] [--body-prefix P]
            [--message-groups G] [--priority P] [--interval-ms I]
        -> {"ids": [...], "errors": [...]}   message i has the body "<P>-<i>"; with G,
                                     FIFO messages, message i in group "g<i mod G>"; with
                                     --priority, priority messages of priority P; with
                                     I, one send each I ms, a failed one reported and
                                     sent again (Python only)
    consume --endpoint HOST:PORT --group G --topic T --await-seconds S --expect N
            [--max-rounds R] [--invisible-seconds I] [--ack] [--change-invisible-seconds C]
            [--no-ack-first] [--start-only] [--batch B]
        -> {"messages": [{"id", "body", "tag", "keys", "topic", "attempt", "group",
                          "priority", "receive", "handle", "received_at", "ack_at"}],
            "receives": <calls>, "empty_receives": <count>, "errors": [...]}
            (received_at: epoch seconds the receive returned; ack_at: when the ack was sent)
    push --endpoint HOST:PORT --group G --topic T --expect N [--fail-first]
         [--consume-seconds S]
        -> {"fifo": <settings said FIFO>, "messages": [{"id", "body", "group", "attempt",
            "started_at", "ended_at", "result"}], "errors": [...]}
        A PushConsumer whose listener records every call; --fail-first answers FAILURE the
        first time an id arrives; stops once N distinct ids were consumed with SUCCESS.
        --start-only -> {"started": true, "endpoints": [...], "settings": true, "heartbeat": "OK"}
    lite --endpoint HOST:PORT --group G --topic PARENT --lite-topics a,b [--other c] [--push]
         [--over-quota]
        -> {"quota", "max_size", "messages": [{"id", "body", "lite_topic"}],
            "over_quota": {"code", "type"} | null, "errors": [...]}
        A lite consumer (RocketMQ 5.5; LiteSimpleConsumer, or LitePushConsumer with --push) of
        the lite group G bound to PARENT: subscribes a, b, sends one message to each lite
        topic (and to c), consumes until a and b each delivered one; --over-quota then
        subscribes one lite topic past the settings' quota and reports the client's error.
    features --endpoint HOST:PORT --topic T --group G --delay-seconds D
        -> {"committed", "rolled_back", "orphan", "timed", "recalled": ids,
            "recall_answer": what RecallMessage returned, "deliver_ms": the timed message's
            delivery time (epoch ms), "checked": ids the transaction checker was asked about,
            "received": [{"id", "at_ms"}], "errors": [...]}
        Sends a committed, a rolled-back and an orphaned (never ended) transactional message,
        whose checker commits what it is asked about; a message timed D seconds ahead, and
        another one recalled at once; then receives with a SimpleConsumer (acking) until the
        committed, the orphan and the timed one came and two more seconds passed.
    orphans --endpoint HOST:PORT --topic T --producers N --count K [--warm-up-seconds W]
        -> {"sent": [{"id", "producer"}], "checks": [{"id", "producer", "at_ms"}],
            "errors": [...]}
        N transactional Producers (each its own client), started W seconds before they send,
        each send K transactional messages and end none; every checker commits what it is
        asked about. Returns once every message was checked at least once and two more
        seconds passed (checks of the same message after it was committed show there
        too), or at the deadline.

    soak --endpoints "H:P;H:P" --role ROLE --topic T --control-dir DIR [--group G]
         [--prefix PFX] [--rate R] [--message-groups N] [--consume-ms MS]
         [--invisible-seconds I] [--await-seconds A] [--batch B]
        -> one JSON event a line, as it happens, until the harness creates DIR/stop-producing
           (producers) or DIR/stop (everyone): ready, sent, send_error, tx_end, checked,
           recv, ack, ack_error, recv_error, consumed, corrupt, done. The role is a
           producer (produce, produce-fifo, produce-tx), a SimpleConsumer (simple) or a
           PushConsumer (push) of one official client, kept alive through every fault of
           the official-client soak (bench/soak_official.py, which documents the events);
           message seq's body is "<PFX>-<seq>". Errors after start-up are events, never
           an exit.

One JSON line on stdout and exit 0 (soak: a line per event); on failure a message on stderr
and a non-zero exit (1 for an error, 2 for bad usage, 3 when the whole run overran
--deadline-seconds). Errors of single operations inside the receive loop (a receive, an ack,
a change of invisible time, a corrupted body) are reported in "errors" instead, so the
caller sees what did arrive.

The client logs to ~/logs/rocketmq_python/rocketmq_client.log: set HOME to move it.

Security (tests/interop/test_security_clients.py): RMQ_INTEROP_ACCESS_KEY and
RMQ_INTEROP_SECRET_KEY give the client credentials, RMQ_INTEROP_TLS=1 turns TLS on; the
client trusts the CA named by gRPC's own GRPC_DEFAULT_SSL_ROOTS_FILE_PATH.

What this client (5.1.2) requires of the server, read from its source:
- Endpoints: ``ClientConfiguration("127.0.0.1:<port>")`` gives scheme IPv4; every queue in a
  QueryRoute answer must carry ``broker.endpoints`` with a scheme (IPv4 for an IP address; an
  UNSPECIFIED scheme yields an empty gRPC target), broker id 0 (master), a READ/READ_WRITE
  permission for consumers, WRITE/READ_WRITE plus ``accept_message_types`` containing NORMAL for
  producers (the producer refuses to send otherwise).
- Startup does NOT fail when QueryRoute fails (it only logs), and Producer / SimpleConsumer do
  not wait for the Telemetry settings answer: this script checks both itself.
- Every response's ``status.code`` must be non-zero ("response is illegal" otherwise).
  MESSAGE_NOT_FOUND on ReceiveMessage = empty list; ILLEGAL_* / BAD_REQUEST raise.
- Telemetry: the answer is used only when ``status.code == OK`` and it carries ``settings``.
  For a producer ``settings.publishing.max_body_size`` replaces the 4 MiB default, so 0 makes
  every send fail; ``validate_message_type`` is taken from it as well.
- Deadlines: QueryRoute / SendMessage / Ack / ChangeInvisibleDuration / Heartbeat /
  NotifyClientTermination use request_timeout (3 s); ReceiveMessage uses await + 3 s, and
  ``long_polling_timeout`` and ``invisible_duration`` are sent as whole seconds.
- SendMessage: exactly one entry (asserted); the receipt's id is ``entries[0].message_id``.
- Received messages: ``system_properties.body_digest`` is checked: MD5/SHA1 as upper-case hex,
  CRC32 as 8 upper-case hex digits (the Node client wants CRC32 in decimal, so a server that
  serves both must use MD5); a mismatch marks the message corrupted, an unset digest type is
  only logged (the Node client cannot decode a message without one).
  ``body_encoding`` must be IDENTITY or GZIP, else decoding the whole batch raises.
- ChangeInvisibleDuration: the response's ``receipt_handle`` replaces the message's handle
  before the status is checked; the next ack sends it.
- Metadata: x-mq-client-id, x-mq-language=PYTHON, x-mq-protocol=GRPC_V2, x-mq-date-time,
  x-mq-request-id, x-mq-namespace, and always an ``authorization`` header (empty keys).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

# Run as a script from this directory: the helpers every driver of the official Python
# client shares (official_python.py) are beside it.
from official_python import (
    REQUEST_TIMEOUT_SECONDS,
    arm_watchdog,
    client_configuration,
    route_endpoints,
    simple_consumer,
    tls_enabled,
    wait_for_settings,
)

MAX_MESSAGES_PER_RECEIVE = 16
SOAK_ROLES = ("produce", "produce-fifo", "produce-tx", "simple", "push")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python_client.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    produce = sub.add_parser("produce", help="send --count messages, print their ids")
    produce.add_argument("--endpoint", required=True, help="proxy gRPC address HOST:PORT")
    produce.add_argument("--topic", required=True)
    produce.add_argument("--count", type=int, required=True)
    produce.add_argument("--tag")
    produce.add_argument("--keys", help="one message key")
    produce.add_argument("--body-prefix", default="msg", help='message i gets body "<P>-<i>"')
    produce.add_argument("--message-groups", type=int, help="FIFO: message i in group g<i%%G>")
    produce.add_argument("--priority", type=int, help="priority messages of this priority")
    produce.add_argument(
        "--interval-ms",
        type=int,
        help="pace the sends; a failed send is then reported in errors and sent again (up to "
        "3 times), as an application does while its proxies restart",
    )
    produce.add_argument("--deadline-seconds", type=float)

    consume = sub.add_parser("consume", help="receive with a SimpleConsumer in a bounded loop")
    consume.add_argument("--endpoint", required=True, help="proxy gRPC address HOST:PORT")
    consume.add_argument("--group", required=True)
    consume.add_argument("--topic", required=True)
    consume.add_argument("--filter", default="*", help="tag filter expression (default *)")
    consume.add_argument("--await-seconds", type=int, help="long-polling time, whole seconds")
    consume.add_argument("--expect", type=int, help="stop once this many messages arrived")
    consume.add_argument(
        "--max-rounds", type=int, default=5, help="receive calls at most (default 5)"
    )
    consume.add_argument("--invisible-seconds", type=int, default=30)
    consume.add_argument(
        "--batch", type=int, default=MAX_MESSAGES_PER_RECEIVE, help="messages per receive"
    )
    consume.add_argument("--ack", action="store_true", help="ack every message received")
    consume.add_argument(
        "--change-invisible-seconds",
        type=int,
        help="change each message's invisible time to this first (the ack uses the new handle)",
    )
    consume.add_argument(
        "--no-ack-first",
        action="store_true",
        help="with --ack: leave a message unacked the first time its id arrives, ack it when "
        "it is delivered again",
    )
    consume.add_argument(
        "--start-only",
        action="store_true",
        help="start (QueryRoute, Telemetry settings), send one Heartbeat, shut down",
    )
    consume.add_argument("--deadline-seconds", type=float)

    push = sub.add_parser("push", help="consume with a PushConsumer until --expect succeeded")
    push.add_argument("--endpoint", required=True, help="proxy gRPC address HOST:PORT")
    push.add_argument("--group", required=True)
    push.add_argument("--topic", required=True)
    push.add_argument("--expect", type=int, required=True)
    push.add_argument("--fail-first", action="store_true", help="FAILURE on an id's first call")
    push.add_argument("--consume-seconds", type=float, default=0.0, help="listener sleeps this")
    push.add_argument("--deadline-seconds", type=float, default=120.0)

    lite = sub.add_parser("lite", help="a lite consumer (RocketMQ 5.5) of its lite topics")
    lite.add_argument("--endpoint", required=True, help="proxy gRPC address HOST:PORT")
    lite.add_argument("--group", required=True, help="a lite group bound to --topic")
    lite.add_argument("--topic", required=True, help="the LITE parent topic")
    lite.add_argument("--lite-topics", required=True, help="comma-separated lite topics")
    lite.add_argument("--other", help="also send one message to this unsubscribed lite topic")
    lite.add_argument("--push", action="store_true", help="a LitePushConsumer (else simple)")
    lite.add_argument("--over-quota", action="store_true", help="subscribe one lite topic more")
    lite.add_argument("--deadline-seconds", type=float, default=90.0)

    features = sub.add_parser("features", help="transactions, a timed and a recalled message")
    features.add_argument("--endpoint", required=True, help="proxy gRPC address HOST:PORT")
    features.add_argument("--topic", required=True)
    features.add_argument("--group", required=True)
    features.add_argument("--delay-seconds", type=int, default=4)
    features.add_argument("--deadline-seconds", type=float, default=60.0)
    orphans = sub.add_parser("orphans", help="transactional producers leaving every message open")
    orphans.add_argument("--endpoint", required=True, help="proxy gRPC address HOST:PORT")
    orphans.add_argument("--topic", required=True)
    orphans.add_argument("--producers", type=int, required=True)
    orphans.add_argument("--count", type=int, required=True, help="open messages per producer")
    orphans.add_argument("--warm-up-seconds", type=float, default=0.0, help="wait before sending")
    orphans.add_argument("--deadline-seconds", type=float, default=90.0)
    soak = sub.add_parser("soak", help="one client role, events on stdout until told to stop")
    soak.add_argument("--endpoints", required=True, help='every proxy: "H:P;H:P"')
    soak.add_argument("--role", required=True, choices=SOAK_ROLES)
    soak.add_argument("--topic", required=True)
    soak.add_argument("--control-dir", required=True, help="stop-producing / stop files here")
    soak.add_argument("--group", help="the consumer group (simple, push)")
    soak.add_argument("--prefix", default="m", help='message seq gets body "<PFX>-<seq>"')
    soak.add_argument("--rate", type=float, default=10.0, help="messages a second")
    soak.add_argument("--message-groups", type=int, default=4, help="produce-fifo: groups")
    soak.add_argument("--consume-ms", type=int, default=0, help="push: the listener's time")
    soak.add_argument("--invisible-seconds", type=int, default=15)
    soak.add_argument("--await-seconds", type=int, default=5)
    soak.add_argument("--batch", type=int, default=16)
    soak.add_argument("--deadline-seconds", type=float, default=6 * 3600.0)
    args = parser.parse_args(argv)
    if args.command == "consume" and not args.start_only:
        if args.await_seconds is None or args.expect is None:
            parser.error("consume needs --await-seconds and --expect (or --start-only)")
        if args.no_ack_first and not args.ack:
            parser.error("--no-ack-first only makes sense with --ack")
    if args.deadline_seconds is None:
        args.deadline_seconds = default_deadline(args)
    return args


def default_deadline(args: argparse.Namespace) -> float:
    """Start-up and shut-down allowance plus, for consume, every round at its gRPC deadline."""
    if args.command == "produce":
        paced = args.count * (args.interval_ms or 0) / 1000
        return 20.0 + paced + args.count * 3 * REQUEST_TIMEOUT_SECONDS
    if args.start_only:
        return 30.0
    per_round = (args.await_seconds or 0) + REQUEST_TIMEOUT_SECONDS + 1
    per_message = 2 * REQUEST_TIMEOUT_SECONDS  # change + ack, in the worst case
    return 20.0 + args.max_rounds * (per_round + MAX_MESSAGES_PER_RECEIVE * per_message)


def produce(args: argparse.Namespace) -> dict:
    from rocketmq import Message, Producer

    producer = Producer(
        client_configuration(args.endpoint), topics=(args.topic,), tls_enable=tls_enabled()
    )
    producer.startup()
    try:
        route_endpoints(producer, args.topic)
        ids: list[str] = []
        errors: list[str] = []
        for i in range(args.count):
            msg = Message()
            msg.topic = args.topic
            msg.body = f"{args.body_prefix}-{i}".encode()
            if args.tag:
                msg.tag = args.tag
            if args.keys:
                msg.keys = args.keys
            if args.message_groups:
                msg.message_group = f"g{i % args.message_groups}"
            if args.priority is not None:
                msg.priority = args.priority
            if args.interval_ms is None:
                ids.append(producer.send(msg).message_id)
                continue
            time.sleep(args.interval_ms / 1000)
            for attempt in range(3):
                try:
                    ids.append(producer.send(msg).message_id)
                    break
                except Exception as exc:  # reported, then sent again
                    errors.append(describe(exc))
                    if attempt == 2:
                        raise
    finally:
        producer.shutdown()
    return {"ids": ids, "errors": errors}


def start_only(consumer, args: argparse.Namespace) -> dict:
    from rocketmq.grpc_protocol import Code

    endpoints = route_endpoints(consumer, args.topic)
    wait_for_settings(consumer)
    for rpc_endpoints in consumer.route_manager.get_all_endpoints().values():
        future = consumer.rpc_client.heartbeat_async(
            rpc_endpoints,
            consumer._heartbeat_req(),
            metadata=consumer.sign(),
            timeout=REQUEST_TIMEOUT_SECONDS,
        )
        res = future.result(timeout=REQUEST_TIMEOUT_SECONDS + 2)
        if res.status.code != Code.OK:
            raise RuntimeError(
                f"Heartbeat to {rpc_endpoints}: code {res.status.code} {res.status.message!r}"
            )
    return {"started": True, "endpoints": endpoints, "settings": True, "heartbeat": "OK"}


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def receive_loop(consumer, args: argparse.Namespace) -> dict:
    messages: list[dict] = []
    errors: list[str] = []
    seen: set[str] = set()
    receives = empty = 0
    while receives < args.max_rounds and (args.expect == 0 or len(messages) < args.expect):
        receives += 1
        try:
            batch = consumer.receive(args.batch, args.invisible_seconds)
        except Exception as exc:
            errors.append(f"receive #{receives}: {describe(exc)}")
            continue
        if not batch:
            empty += 1
        for msg in batch:
            messages.append(
                {
                    "id": msg.message_id,
                    "body": msg.body.decode("utf-8", "replace") if msg.body else "",
                    "tag": msg.tag,
                    "keys": sorted(msg.keys),
                    "topic": msg.topic,
                    "attempt": msg.delivery_attempt,
                    "group": msg.message_group,
                    "priority": msg.priority,
                    "receive": receives,
                    # The broker, queue and offset of the copy received (issue 23's FIFO
                    # duplicate: one message given twice, or two stored copies?).
                    "handle": msg.receipt_handle,
                    "received_at": time.time(),
                    "ack_at": None,
                }
            )
            if msg.corrupted:
                errors.append(f"message {msg.message_id}: body digest mismatch (corrupted)")
            first_time = msg.message_id not in seen
            seen.add(msg.message_id)
            try:
                if args.change_invisible_seconds is not None:
                    consumer.change_invisible_duration(msg, args.change_invisible_seconds)
                if args.ack and not (args.no_ack_first and first_time):
                    messages[-1]["ack_at"] = time.time()
                    consumer.ack(msg)
            except Exception as exc:
                errors.append(f"message {msg.message_id}: {describe(exc)}")
    return {"messages": messages, "receives": receives, "empty_receives": empty, "errors": errors}


def consume(args: argparse.Namespace) -> dict:
    consumer = simple_consumer(
        args.endpoint, args.group, args.topic, args.filter, args.await_seconds or 5
    )
    try:
        if args.start_only:
            return start_only(consumer, args)
        route_endpoints(consumer, args.topic)
        return receive_loop(consumer, args)
    finally:
        consumer.shutdown()


def push(args: argparse.Namespace) -> dict:
    """A PushConsumer: the listener records each call; done once --expect ids succeeded
    (then a moment for the last acks to leave)."""
    from rocketmq import (
        ConsumeResult,
        FilterExpression,
        MessageListener,
        PushConsumer,
    )

    calls: list[dict] = []
    succeeded: set[str] = set()
    seen: set[str] = set()
    lock = threading.Lock()
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, message) -> ConsumeResult:
            started = time.time()
            # Until the wall clock the record uses has passed (sleep keeps another clock).
            until = started + args.consume_seconds
            while (left := until - time.time()) > 0:
                time.sleep(left + 0.001)
            with lock:
                first = message.message_id not in seen
                seen.add(message.message_id)
                fail = args.fail_first and first
                result = ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS
                calls.append(
                    {
                        "id": message.message_id,
                        "body": message.body.decode("utf-8", "replace") if message.body else "",
                        "group": message.message_group,
                        "attempt": message.delivery_attempt,
                        "started_at": started,
                        "ended_at": time.time(),
                        "result": result.name,
                    }
                )
                if not fail:
                    succeeded.add(message.message_id)
                    if len(succeeded) >= args.expect:
                        done.set()
            return result

    config = client_configuration(args.endpoint)  # with the environment's credentials
    consumer = PushConsumer(config, args.group, Listener(), {args.topic: FilterExpression("*")})
    consumer.startup()
    try:
        route_endpoints(consumer, args.topic)
        wait_for_settings(consumer)
        if not done.wait(max(args.deadline_seconds - 15, 1)):
            raise RuntimeError(
                f"{len(succeeded)} of {args.expect} messages consumed: {calls[-20:]}"
            )
        time.sleep(2)  # the last acks leave the consumption threads
        with lock:
            return {"fifo": consumer.fifo, "messages": list(calls), "errors": []}
    finally:
        consumer.shutdown()


def lite(args: argparse.Namespace) -> dict:
    """A LiteSimpleConsumer (or --push: LitePushConsumer) bound to the parent --topic:
    subscribes each of --lite-topics, sends one message to each (and one to --other), and
    consumes (acking, with the lite topic) until one message of each lite topic arrived;
    then, with --over-quota, subscribes one lite topic more than the settings' quota
    allows. -> {"quota", "max_size", "messages": [{"id", "body", "lite_topic"}],
    "over_quota": {"code", "type"} or null, "errors": [...]}"""
    from rocketmq import (
        ConsumeResult,
        LitePushConsumer,
        LiteSimpleConsumer,
        Message,
        MessageListener,
        Producer,
    )

    topics = [t for t in args.lite_topics.split(",") if t]
    got: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def record(message) -> None:
        with lock:
            got.append(
                {
                    "id": message.message_id,
                    "body": message.body.decode("utf-8", "replace") if message.body else "",
                    "lite_topic": message.lite_topic,
                }
            )
            if {m["lite_topic"] for m in got} >= set(topics):
                done.set()

    class Listener(MessageListener):
        def consume(self, message) -> ConsumeResult:
            record(message)
            return ConsumeResult.SUCCESS

    config = client_configuration(args.endpoint)
    if args.push:
        consumer = LitePushConsumer(config, args.group, args.topic, Listener())
        manager = consumer._LitePushConsumer__subscription_manager
    else:
        consumer = LiteSimpleConsumer(args.topic, config, args.group, await_duration=5)
        manager = consumer._LiteSimpleConsumer__subscription_manager
    consumer.startup()
    producer = Producer(config, topics=(args.topic,))
    producer.startup()
    try:
        # The settings (quota, longest name) come after start-up; 0 refuses every name.
        deadline = time.monotonic() + 15
        while manager.lite_subscription_quota == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        out: dict = {
            "quota": manager.lite_subscription_quota,
            "max_size": manager.max_lite_topic_size,
        }
        for topic in topics:
            consumer.subscribe_lite(topic)
        # 5.1.2's subscribe_lite names the characters of the lite topic (it extends the
        # request's set with the string); the full set reaches the brokers with the periodic
        # COMPLETE_ADD, which this sends now rather than in 30 s.
        consumer.subscribe_lite_all()
        for topic in [*topics, *([args.other] if args.other else [])]:
            msg = Message()
            msg.topic = args.topic
            msg.body = f"{topic}-body".encode()
            msg.lite_topic = topic
            producer.send(msg)
        stop = time.monotonic() + max(args.deadline_seconds - 25, 5)
        while not done.is_set() and time.monotonic() < stop:
            if args.push:
                done.wait(0.2)
                continue
            try:
                for message in consumer.receive(16, 15):
                    consumer.ack(message)
                    record(message)
            except Exception as exc:
                errors.append(describe(exc))
        if not done.is_set():
            raise RuntimeError(f"lite topics {topics}: got only {got}; errors {errors[-5:]}")
        out["over_quota"] = None
        if args.over_quota:
            try:
                for i in range(out["quota"] - len(topics) + 1):
                    consumer.subscribe_lite(f"extra-{i}")
            except Exception as exc:
                out["over_quota"] = {"code": getattr(exc, "code", None), "type": type(exc).__name__}
        if args.push:
            time.sleep(2)  # the last acks leave the consumption threads
        with lock:
            out["messages"] = list(got)
        out["errors"] = errors
        return out
    finally:
        producer.shutdown()
        consumer.shutdown()


def features(args: argparse.Namespace) -> dict:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    checked: list[str] = []
    lock = threading.Lock()

    class Checker(TransactionChecker):
        def check(self, message: Message) -> TransactionResolution:
            with lock:
                checked.append(message.message_id)
            return TransactionResolution.COMMIT

    def message(body: str) -> Message:
        msg = Message()
        msg.topic = args.topic
        msg.body = body.encode()
        return msg

    out: dict = {"errors": []}
    consumer = simple_consumer(args.endpoint, args.group, args.topic, "*", 5)
    producer = Producer(
        client_configuration(args.endpoint), topics=(args.topic,), checker=Checker()
    )
    producer.startup()
    try:
        wait_for_settings(consumer)
        route_endpoints(producer, args.topic)
        for name, end in (("committed", "commit"), ("rolled_back", "rollback"), ("orphan", None)):
            tx = producer.begin_transaction()
            receipt = producer.send(message(name), tx)
            out[name] = receipt.message_id
            if end is not None:
                getattr(tx, end)()
        # The client takes whole seconds (it sets Timestamp.seconds).
        deliver_s = int(time.time()) + args.delay_seconds
        deliver_ms = deliver_s * 1000
        timed = message("timed")
        timed.delivery_timestamp = deliver_s
        out["timed"] = producer.send(timed).message_id
        out["deliver_ms"] = deliver_ms
        recalled = message("recalled")
        recalled.delivery_timestamp = deliver_s
        receipt = producer.send(recalled)
        out["recalled"] = receipt.message_id
        out["recall_answer"] = producer.recall_message(args.topic, receipt.recall_handle)
        wanted = {out["committed"], out["orphan"], out["timed"]}
        received: list[dict] = []
        deadline = time.monotonic() + args.deadline_seconds - 5
        done_at = None
        while time.monotonic() < deadline and (done_at is None or time.monotonic() < done_at):
            try:
                batch = consumer.receive(16, 20)
            except Exception as exc:  # one failed receive is reported, not fatal
                out["errors"].append(f"receive: {exc}")
                continue
            for msg in batch:
                received.append({"id": msg.message_id, "at_ms": int(time.time() * 1000)})
                consumer.ack(msg)
            if done_at is None and wanted <= {r["id"] for r in received}:
                done_at = time.monotonic() + 2.0
        out["received"] = received
        with lock:
            out["checked"] = list(checked)
    finally:
        producer.shutdown()
        consumer.shutdown()
    return out


def orphans(args: argparse.Namespace) -> dict:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    lock = threading.Lock()
    checks: list[dict] = []

    class Checker(TransactionChecker):
        def __init__(self, index: int) -> None:
            self.index = index

        def check(self, message: Message) -> TransactionResolution:
            at_ms = int(time.time() * 1000)
            with lock:
                checks.append({"id": message.message_id, "producer": self.index, "at_ms": at_ms})
            return TransactionResolution.COMMIT

    out: dict = {"sent": [], "errors": []}
    producers = []
    try:
        for index in range(args.producers):
            producer = Producer(
                client_configuration(args.endpoint), topics=(args.topic,), checker=Checker(index)
            )
            producer.startup()
            producers.append(producer)
            route_endpoints(producer, args.topic)
        time.sleep(args.warm_up_seconds)
        for index, producer in enumerate(producers):
            for i in range(args.count):
                msg = Message()
                msg.topic = args.topic
                msg.body = f"orphan-{index}-{i}".encode()
                receipt = producer.send(msg, producer.begin_transaction())
                out["sent"].append({"id": receipt.message_id, "producer": index})
        wanted = {m["id"] for m in out["sent"]}
        deadline = time.monotonic() + args.deadline_seconds - 10
        done_at = None
        while time.monotonic() < deadline and (done_at is None or time.monotonic() < done_at):
            with lock:
                seen = {c["id"] for c in checks}
            if done_at is None and wanted <= seen:
                done_at = time.monotonic() + 2.0
            time.sleep(0.1)
        with lock:
            out["checks"] = list(checks)
    finally:
        for producer in producers:
            producer.shutdown()
    return out


class Events:
    """The soak's event lines on stdout, one JSON object each, written whole under a lock
    (the push consumer's listener threads and the checker write too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, ev: str, **fields) -> None:
        line = json.dumps({"ev": ev, "t": int(time.time() * 1000), **fields})
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def error_kind(exc: BaseException) -> str:
    """A short, stable name of a failure: the class, and the RocketMQ code (ClientException)
    or gRPC status (RpcError) it carries."""
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.RpcError.code()
        try:
            return f"{type(exc).__name__}:{code().name}"
        except Exception:
            return type(exc).__name__
    return f"{type(exc).__name__}:{code}" if code is not None else type(exc).__name__


def soak_seq(body: str) -> int:
    return int(body.rsplit("-", 1)[1])


def soak_view(message) -> dict:
    """What a received message's record carries: its id, attempt, group and receipt handle
    (this client drops the queue and offset, which the harness reads from the handle)."""
    return {
        "id": message.body.decode("utf-8", "replace") if message.body else "",
        "msg_id": message.message_id,
        "attempt": message.delivery_attempt,
        "group": message.message_group,
        "queue": None,
        "offset": None,
        "handle": message.receipt_handle,
    }


def soak_wait(control: str, name: str, seconds: float) -> bool:
    """Sleep up to ``seconds``, polling every 200 ms for the control file; True once it is there."""
    until = time.monotonic() + seconds
    while True:
        if os.path.exists(os.path.join(control, name)) or os.path.exists(
            os.path.join(control, "stop")
        ):
            return True
        left = until - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.2, left))


def soak_produce(args: argparse.Namespace, emit: Events) -> None:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    class Checker(TransactionChecker):
        # An orphan (seq % 4 == 1) was meant to commit; a lost rollback (seq % 4 == 0) to roll back.
        def check(self, message: Message) -> TransactionResolution:
            body = message.body.decode("utf-8", "replace")
            rollback = soak_seq(body) % 4 == 0
            emit("checked", id=body, answer="ROLLBACK" if rollback else "COMMIT")
            return TransactionResolution.ROLLBACK if rollback else TransactionResolution.COMMIT

    tx = args.role == "produce-tx"
    producer = Producer(
        client_configuration(args.endpoints),
        topics=(args.topic,),
        checker=Checker() if tx else None,
        tls_enable=tls_enabled(),
    )
    producer.startup()
    emit("ready", role=args.role, lang="python")
    period = 1.0 / args.rate
    next_at = time.monotonic()
    seq = 0
    try:
        while not soak_wait(args.control_dir, "stop-producing", next_at - time.monotonic()):
            next_at = max(next_at + period, time.monotonic())  # never a burst to catch up
            body = f"{args.prefix}-{seq}"
            seq += 1
            msg = Message()
            msg.topic = args.topic
            msg.body = body.encode()
            if args.role == "produce-fifo":
                msg.message_group = f"g{soak_seq(body) % args.message_groups}"
            transaction = producer.begin_transaction() if tx else None
            try:
                receipt = producer.send(msg, transaction)
            except Exception as exc:
                emit("send_error", id=body, kind=error_kind(exc), detail=describe(exc)[:300])
                continue
            emit("sent", id=body, msg_id=receipt.message_id)
            if transaction is not None:
                outcome = {0: "rollback", 1: "none"}.get(soak_seq(body) % 4, "commit")
                try:
                    if outcome != "none":
                        getattr(transaction, outcome)()
                except Exception as exc:
                    emit("tx_end", id=body, outcome=outcome, ok=False, kind=error_kind(exc))
                else:
                    emit("tx_end", id=body, outcome=outcome, ok=True)
        # An orphan's check reaches this producer only while it runs: stay until told to stop.
        if tx:
            soak_wait(args.control_dir, "stop", float("inf"))
    finally:
        producer.shutdown()


def soak_simple(args: argparse.Namespace, emit: Events) -> None:
    consumer = simple_consumer(args.endpoints, args.group, args.topic, "*", args.await_seconds)
    emit("ready", role=args.role, lang="python")
    try:
        while not soak_wait(args.control_dir, "stop", 0):
            try:
                batch = consumer.receive(args.batch, args.invisible_seconds)
            except Exception as exc:
                emit("recv_error", kind=error_kind(exc), detail=describe(exc)[:300])
                soak_wait(args.control_dir, "stop", 1.0)  # a down fleet is not spun on
                continue
            for msg in batch:
                view = soak_view(msg)
                emit("recv", **view)
                if msg.corrupted:
                    emit("corrupt", id=view["id"])
                try:
                    consumer.ack(msg)
                except Exception as exc:
                    emit("ack_error", id=view["id"], kind=error_kind(exc),
                         detail=describe(exc)[:300])  # fmt: skip
                else:
                    emit("ack", id=view["id"])
    finally:
        consumer.shutdown()


def soak_push(args: argparse.Namespace, emit: Events) -> None:
    from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

    class Listener(MessageListener):
        def consume(self, message) -> ConsumeResult:
            view = soak_view(message)
            emit("recv", **view)
            if message.corrupted:
                emit("corrupt", id=view["id"])
            time.sleep(args.consume_ms / 1000)
            emit("consumed", id=view["id"])
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        client_configuration(args.endpoints),
        args.group,
        Listener(),
        {args.topic: FilterExpression("*")},
    )
    consumer.startup()
    emit("ready", role=args.role, lang="python")
    try:
        soak_wait(args.control_dir, "stop", float("inf"))
    finally:
        consumer.shutdown()


def soak(args: argparse.Namespace) -> None:
    """One role of the official-client soak; prints its events, then ``done``."""
    emit = Events()
    if args.role.startswith("produce"):
        soak_produce(args, emit)
    elif args.role == "simple":
        soak_simple(args, emit)
    else:
        soak_push(args, emit)
    emit("done")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    arm_watchdog(args.deadline_seconds)
    started = time.monotonic()
    try:
        command = {
            "produce": produce,
            "consume": consume,
            "push": push,
            "lite": lite,
            "features": features,
            "orphans": orphans,
            "soak": soak,
        }[args.command]
        result = command(args)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        sys.stderr.write(
            f"python_client {args.command} failed after {time.monotonic() - started:.1f}s: "
            f"{describe(exc)}\n"
        )
        sys.stderr.flush()
        return 1
    if result is not None:  # soak printed its events as they came
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
