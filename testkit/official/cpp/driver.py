"""Drive the native C++ client of RocketMQ (librocketmq 2.x through PyPI ``rocketmq``
0.4.4) as a test peer of a proxy's remoting port. Runs in .venv-cpp (`make interop-deps`).

Every client is built as an application builds it: a name server address (here the proxy's
remoting address) and a group, nothing else changed. Output is JSON lines, as the Java
remoting driver's: {"ready": true} once the client has started, then one result line, then
exit 0. Every command takes --access-key AK --secret-key SK: the client signs each request
(its ClientRPCHook, the 4.x ACL signature).

  produce --namesrv H:P --group PG --topic T --count N [--kind normal|orderly]
          [--order-keys K] [--body-prefix P] [--interval-ms W]
      message i has the body "<P>-<i>" (P default "m"), one every W ms (default at once).
      orderly: key "k<i mod K>" (K default
      4), sent with the binding's hashing queue selector on i mod K. A send that fails is
      tried again, 3 times in all (see ATTEMPTS).
      -> {"sent": [{"body", "id", "status", "attempts" | "error"}], "errors": [...]}
  push --namesrv H:P --group G --topic T --expect N [--orderly] [--seconds S]
      a push consumer (concurrent, or orderly) of every tag of T; stops once N distinct
      bodies were consumed, or after S seconds (default 60).
      -> {"messages": [{"body", "key", "queue", "offset", "reconsume", "at_ms"}],
          "errors": [...]}

The binding's pull consumer is left out: it keeps its offsets by topic and queue id alone,
so it reads the same queue id of two brokers as one queue.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer


def emit(line: dict) -> None:
    print(json.dumps(line), flush=True)


# A send is tried this often, as an application of this client tries it: librocketmq fails
# a send at once, before anything is sent, when another of its threads is opening the
# connection to that broker (the try-lock on its transport table), as at its start.
ATTEMPTS = 3
RETRY_PAUSE_S = 0.2

# The binding's third credential: the channel the client names in each request (OnsChannel).
CHANNEL = "LOCAL"


def configured(client, args: argparse.Namespace):
    """``client`` (a producer or consumer) with the name server and any credentials."""
    client.set_namesrv_addr(args.namesrv)
    if args.access_key:
        client.set_session_credentials(args.access_key, args.secret_key, CHANNEL)
    return client


def produce(args: argparse.Namespace) -> dict:
    producer = configured(Producer(args.group), args)
    producer.start()
    emit({"ready": True})
    sent: list[dict[str, object]] = []
    errors: list[str] = []
    for i in range(args.count):
        body = f"{args.body_prefix}-{i}"
        message = Message(args.topic)
        message.set_body(body)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                if args.kind == "orderly":
                    message.set_keys(f"k{i % args.order_keys}")
                    result = producer.send_orderly(message, i % args.order_keys)
                else:
                    result = producer.send_sync(message)
            except Exception as exc:  # the client's own exception types; each is a result
                if attempt < ATTEMPTS:
                    time.sleep(RETRY_PAUSE_S)
                    continue
                sent.append({"body": body, "error": f"{type(exc).__name__}: {exc}"})
                errors.append(f"{body}: {type(exc).__name__}: {exc}")
            else:
                sent.append({"body": body, "id": result.msg_id, "status": result.status.name,
                             "attempts": attempt})  # fmt: skip
            break
        if args.interval_ms:
            time.sleep(args.interval_ms / 1000)
    producer.shutdown()
    return {"sent": sent, "errors": errors}


class Consumed:
    """The messages consumed, and a wait for N distinct bodies."""

    def __init__(self, expect: int) -> None:
        self.messages: list[dict] = []
        self._bodies: set[str] = set()
        self._expect = expect
        self._lock = threading.Lock()
        self.enough = threading.Event()

    def add(self, message) -> None:
        body = message.body.decode()
        with self._lock:
            self.messages.append(
                {
                    "body": body,
                    "key": message.keys.decode() if message.keys else "",
                    "queue": message.queue_id,
                    "offset": message.queue_offset,
                    "reconsume": message.reconsume_times,
                    "at_ms": int(time.time() * 1000),
                }
            )
            self._bodies.add(body)
            if len(self._bodies) >= self._expect:
                self.enough.set()


def push(args: argparse.Namespace) -> dict:
    consumed = Consumed(args.expect)
    consumer = configured(PushConsumer(args.group, orderly=args.orderly), args)
    consumer.subscribe(args.topic, consumed.add)
    consumer.start()
    emit({"ready": True})
    consumed.enough.wait(args.seconds)
    consumer.shutdown()
    return {"messages": consumed.messages, "errors": []}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("produce", "push"))
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--kind", choices=("normal", "orderly"), default="normal")
    parser.add_argument("--order-keys", type=int, default=4)
    parser.add_argument("--body-prefix", default="m")
    parser.add_argument("--interval-ms", type=int, default=0)
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--orderly", action="store_true")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--access-key")
    parser.add_argument("--secret-key")
    args = parser.parse_args()
    result = {"produce": produce, "push": push}[args.command](args)
    emit(result)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
