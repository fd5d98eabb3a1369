"""Drive the official Python client (5.1.2) through transactions, a timed message and a
recall; run with ``.venv-interop/bin/python``. Kept apart from ``python_client.py``.

    features --endpoint HOST:PORT --topic T --group G --delay-seconds D --deadline-seconds S
        -> {"committed", "rolled_back", "orphan", "timed", "recalled": ids,
            "deliver_ms": the timed message's delivery time, "checked": ids the checker saw,
            "received": [{"id", "at_ms"}], "errors": [...]}

Sends a committed, a rolled-back and an orphaned (never ended) transactional message, whose
checker commits what it is asked about; a message timed ``D`` seconds ahead, and another
one recalled at once; then receives with a SimpleConsumer until the committed, the orphan
and the timed one came and two more seconds passed, or the deadline.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from python_client import client_configuration, route_endpoints, simple_consumer, wait_for_settings


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
        deadline = time.monotonic() + args.deadline_seconds
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


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("features")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--delay-seconds", type=int, default=4)
    p.add_argument("--deadline-seconds", type=float, default=40.0)
    args = parser.parse_args()
    print(json.dumps(features(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
