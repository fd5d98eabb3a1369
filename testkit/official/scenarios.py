"""What the interop tests prove, written once for every official client.

``test_official_clients.py`` runs each with the Python, Node and Java clients at once
(``for_each_client``). Each takes ``run`` (the ``run_client`` fixture: language, arguments,
timeout), a running proxy and a topic of its own, and uses a consumer group of its own.
"""

from __future__ import annotations

import itertools
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from testkit.official.harness import ProxyProcess, sleep_until

AWAIT_SECONDS = 5  # the proxy's minimum long-polling time: never ILLEGAL_POLLING_TIME
INVISIBLE_SECONDS = 10  # the minimum legal invisible duration
CHANGED_INVISIBLE_SECONDS = 12
MARGIN_SECONDS = 2

# Bounds for one driver run; each is well above the happy path (about 1 s per call, plus a
# long poll per empty receive) and the sum per test stays under the test's own timeout.
PRODUCE_TIMEOUT = 40
CONSUME_TIMEOUT = 60
EMPTY_CHECK_TIMEOUT = 30
START_ONLY_TIMEOUT = 40

Run = Callable[..., dict]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def produce(run: Run, lang: str, proxy: ProxyProcess, topic: str, count: int, *extra) -> tuple:
    """Send ``count`` messages; returns (ids, body prefix)."""
    prefix = unique("body")
    out = run(
        lang,
        "produce",
        "--endpoint",
        proxy.grpc,
        "--topic",
        topic,
        "--count",
        count,
        "--body-prefix",
        prefix,
        *extra,
        timeout=PRODUCE_TIMEOUT,
    )
    ids = out["ids"]
    assert len(ids) == count, out
    assert len(set(ids)) == count, f"duplicate message ids: {ids}"
    assert all(isinstance(i, str) and i for i in ids), ids
    return ids, prefix


def consume(run: Run, lang: str, proxy: ProxyProcess, topic: str, group: str, *extra, **kw):
    return run(
        lang,
        "consume",
        "--endpoint",
        proxy.grpc,
        "--group",
        group,
        "--topic",
        topic,
        "--await-seconds",
        AWAIT_SECONDS,
        "--invisible-seconds",
        INVISIBLE_SECONDS,
        *extra,
        timeout=kw.get("timeout", CONSUME_TIMEOUT),
    )


def assert_nothing_left(run: Run, lang: str, proxy: ProxyProcess, topic: str, group: str):
    """One more long poll on ``group``: it must come back empty."""
    once = ("--expect", 0, "--max-rounds", 1)
    out = consume(run, lang, proxy, topic, group, *once, timeout=EMPTY_CHECK_TIMEOUT)
    assert out["errors"] == [], out
    assert out["messages"] == [], f"redelivered after ack: {out['messages']}"
    assert out["receives"] == 1, out
    assert out["empty_receives"] == 1, out


def assert_delivered_once(out: dict, ids: list[str], prefix: str, topic: str, **expected) -> None:
    """Every produced message arrived exactly once, first attempt, as it was sent."""
    assert out["errors"] == [], out["errors"]
    got = [m["id"] for m in out["messages"]]
    assert sorted(got) == sorted(ids), f"sent {ids}, received {got}"
    for msg in out["messages"]:
        assert msg["body"] == f"{prefix}-{ids.index(msg['id'])}", msg
        assert msg["topic"] == topic, msg
        assert msg["attempt"] == 1, msg
        for key, value in expected.items():
            assert msg[key] == value, msg


def start_only(run: Run, lang: str, proxy: ProxyProcess, topic: str) -> None:
    """QueryRoute, Telemetry (settings answered), Heartbeat, NotifyClientTermination."""
    out = run(
        lang,
        "consume",
        "--endpoint",
        proxy.grpc,
        "--group",
        unique(f"interop-{lang}-start"),
        "--topic",
        topic,
        "--start-only",
        timeout=START_ONLY_TIMEOUT,
    )
    assert out["started"] is True, out
    assert out["settings"] is True, out
    assert out["heartbeat"] == "OK", out
    # The route must send the client back to the proxy itself, not to a broker.
    assert out["endpoints"] == [proxy.grpc], out


def produce_receive_ack(run: Run, lang: str, proxy: ProxyProcess, topic: str) -> None:
    """10 messages with a tag and a key: all received with their ids, bodies and tags, acked;
    once they would have become visible again, the group gets nothing."""
    key = unique("key")
    ids, prefix = produce(run, lang, proxy, topic, 10, "--tag", "TagA", "--keys", key)
    group = unique(f"interop-{lang}-ack")
    out = consume(run, lang, proxy, topic, group, "--expect", 10, "--max-rounds", 6, "--ack")
    received_by = time.monotonic()
    assert_delivered_once(out, ids, prefix, topic, tag="TagA", keys=[key])
    assert out["receives"] <= 6, out
    # Had an ack been lost, its message would be visible again INVISIBLE_SECONDS after it was
    # received (which was before `received_by`).
    sleep_until(received_by + INVISIBLE_SECONDS + MARGIN_SECONDS)
    assert_nothing_left(run, lang, proxy, topic, group)


def change_invisible_then_ack(run: Run, lang: str, proxy: ProxyProcess, topic: str) -> None:
    """ChangeInvisibleDuration, then ack with the handle it returned. An ack with the old
    handle would leave the new checkpoint to revive the message after the new duration."""
    ids, prefix = produce(run, lang, proxy, topic, 3, "--tag", "TagC")
    group = unique(f"interop-{lang}-change")
    out = consume(
        run,
        lang,
        proxy,
        topic,
        group,
        "--expect",
        3,
        "--max-rounds",
        6,
        "--change-invisible-seconds",
        CHANGED_INVISIBLE_SECONDS,
        "--ack",
    )
    received_by = time.monotonic()
    assert_delivered_once(out, ids, prefix, topic, tag="TagC")
    sleep_until(received_by + CHANGED_INVISIBLE_SECONDS + MARGIN_SECONDS)
    assert_nothing_left(run, lang, proxy, topic, group)


def redelivery_without_ack(run: Run, lang: str, proxy: ProxyProcess, topic: str) -> None:
    """Unacked messages come back after their invisible time with attempt 2 (acked then)."""
    ids, prefix = produce(run, lang, proxy, topic, 2)
    group = unique(f"interop-{lang}-redeliver")
    # Rounds: the first delivery, then long polls until the revive INVISIBLE_SECONDS later.
    out = consume(
        run, lang, proxy, topic, group, "--expect", 4, "--max-rounds", 8, "--ack", "--no-ack-first"
    )
    received_by = time.monotonic()
    assert out["errors"] == [], out["errors"]
    by_id: dict[str, list[int]] = {}
    for msg in out["messages"]:
        assert msg["body"] == f"{prefix}-{ids.index(msg['id'])}", msg
        by_id.setdefault(msg["id"], []).append(msg["attempt"])
    assert by_id == {i: [1, 2] for i in ids}, f"attempts per id: {by_id}"
    sleep_until(received_by + INVISIBLE_SECONDS + MARGIN_SECONDS)
    assert_nothing_left(run, lang, proxy, topic, group)


def for_each_client(
    langs: tuple[str, ...],
    scenarios: Callable[..., None] | tuple[Callable[..., None], ...],
    run: Run,
    proxy: ProxyProcess,
    *,
    topic: Callable[[str], str],
    at_once: int | None = None,
    **kwargs: object,
) -> None:
    """Run every scenario with every client, all at the same time (or ``at_once`` at a
    time, for scenarios that each start several client processes), each pair on a fresh
    topic (``topic(prefix)`` creates it). The scenarios mostly wait (long polls, invisible
    times), so running them side by side keeps the matrix short; every failure is
    reported under its client's and scenario's name. ``kwargs`` go to every scenario."""
    if callable(scenarios):
        scenarios = (scenarios,)
    cases = {
        f"{lang}/{fn.__name__}": (fn, lang, topic(f"interop-{lang}"))
        for fn in scenarios
        for lang in langs
    }
    took: dict[str, float] = {}

    def one(name: str) -> None:
        fn, lang, case_topic = cases[name]
        started = time.monotonic()
        try:
            fn(run, lang, proxy, case_topic, **kwargs)
        finally:
            took[name] = time.monotonic() - started

    failures = []
    workers = min(len(cases), at_once or len(cases))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="client") as pool:
        futures = {name: pool.submit(one, name) for name in cases}
        for name, future in futures.items():
            exc = future.exception()
            if exc is not None:
                where = "".join(traceback.format_tb(exc.__traceback__)[-2:])
                failures.append(f"=== {name} ({cases[name][2]}) ===\n{exc}\n{where}")
    # Shown with the test's output (pytest -rA, or on failure): which client set the pace.
    print(", ".join(f"{name} {took.get(name, 0):.1f}s" for name in cases))
    if failures:
        raise AssertionError(
            f"{len(failures)} of {len(cases)} clients failed:\n" + "\n".join(failures)
        )


#: Who produces for whom in ``cross_client``: every client consumes another's messages.
PRODUCER_FOR = {"python": "java", "node": "python", "java": "node"}


def cross_client(run: Run, lang: str, proxy: ProxyProcess, topic: str) -> None:
    """``lang`` receives and acks what another official client sent (PRODUCER_FOR): ids,
    bodies, tag and key survive the trip from one client's encoding to another's."""
    producer = PRODUCER_FOR[lang]
    key = unique("key")
    ids, prefix = produce(run, producer, proxy, topic, 5, "--tag", "TagX", "--keys", key)
    group = unique(f"interop-{producer}-to-{lang}")
    out = consume(run, lang, proxy, topic, group, "--expect", 5, "--max-rounds", 6, "--ack")
    assert_delivered_once(out, ids, prefix, topic, tag="TagX", keys=[key])


# -- push consumers and FIFO ------------------------------------------------------------

#: A listener that outlasts the proxy's renewal slice (``_harness.RENEW_SLICE_MS``, 10 s) by
#: more than a real broker's revive delay: without renewal its message would come back.
LONG_CONSUME_SECONDS = 16
PUSH_TIMEOUT = 90


def push(run: Run, lang: str, proxy: ProxyProcess, topic: str, group: str, expect: int, *extra):
    return run(
        lang, "push", "--endpoint", proxy.grpc, "--group", group, "--topic", topic,
        "--expect", expect, *extra, timeout=PUSH_TIMEOUT,
    )  # fmt: skip


def push_nack_then_ack(run: Run, lang: str, proxy: ProxyProcess, topic: str, target) -> None:
    """A PushConsumer (standard group): every message fails once (a nack: the client
    changes its invisible time to the back-off of attempt 1; the Node client 1.0.8 ignores
    the customized back-off of the settings and changes it to 0), comes back as attempt 2
    and is acked."""
    ids, prefix = produce(run, lang, proxy, topic, 8)
    group = target.new_group(f"interop-{lang}-push")
    out = push(run, lang, proxy, topic, group, 8, "--fail-first")
    assert out["fifo"] is False, out
    calls: dict[str, list[tuple[int, str]]] = {}
    for call in out["messages"]:
        assert call["body"] == f"{prefix}-{ids.index(call['id'])}", call
        calls.setdefault(call["id"], []).append((call["attempt"], call["result"]))
    assert calls == {i: [(1, "FAILURE"), (2, "SUCCESS")] for i in ids}, calls


def push_outlasts_the_slice(run: Run, lang: str, proxy: ProxyProcess, topic: str, target):
    """A PushConsumer whose listener takes longer than the proxy's invisible-time slice:
    the proxy renews, so each message is consumed once, at attempt 1."""
    ids, _ = produce(run, lang, proxy, topic, 4)
    group = target.new_group(f"interop-{lang}-renew")
    out = push(
        run, lang, proxy, topic, group, 4, "--consume-seconds", LONG_CONSUME_SECONDS
    )  # fmt: skip
    got = [(c["id"], c["attempt"], c["result"]) for c in out["messages"]]
    assert sorted(got) == sorted((i, 1, "SUCCESS") for i in ids), got
    assert all(c["ended_at"] - c["started_at"] >= LONG_CONSUME_SECONDS for c in out["messages"])


def assert_group_order(calls: list[dict], prefix: str, ids: list[str], groups: int) -> None:
    """Per message group: bodies in the order sent, each consumption over before the next
    began (calls: the push driver's records)."""
    by_group: dict[str, list[dict]] = {}
    for call in sorted(calls, key=lambda c: c["started_at"]):
        by_group.setdefault(call["group"], []).append(call)
    assert sorted(by_group) == [f"g{g}" for g in range(groups)], sorted(by_group)
    for name, seq in by_group.items():
        sent = [ids.index(c["id"]) for c in seq]
        assert sent == sorted(sent), f"group {name} consumed out of order: {sent}"
        for before, after in itertools.pairwise(seq):
            assert after["started_at"] >= before["ended_at"], (name, before, after)
    for call in calls:
        assert call["body"] == f"{prefix}-{ids.index(call['id'])}", call


def push_fifo(run: Run, lang: str, proxy: ProxyProcess, topic: str, target) -> None:
    """A FIFO PushConsumer: the settings say FIFO; 3 message groups, each consumed in the
    order sent, one message at a time, each once."""
    ids, prefix = produce(run, lang, proxy, topic, 12, "--message-groups", 3)
    group = target.new_group(f"interop-{lang}-pushfifo", fifo=True)
    out = push(run, lang, proxy, topic, group, 12)
    assert out["fifo"] is True, out
    assert sorted(c["id"] for c in out["messages"]) == sorted(ids), out["messages"]
    assert all(c["attempt"] == 1 and c["result"] == "SUCCESS" for c in out["messages"])
    assert_group_order(out["messages"], prefix, ids, 3)


def fifo_simple_consumers_in_order(run: Run, lang: str, proxy: ProxyProcess, topic: str, target):
    """Three SimpleConsumers of one FIFO group at once, 24 messages in 4 message groups:
    each delivered once, and a message of a group reaches a consumer only in the receive
    that got the one before it, or after that one's ack was sent. At most 2 messages per
    receive and 6 receives per consumer: no consumer can take all 24 alone."""
    ids, prefix = produce(run, lang, proxy, topic, 24, "--message-groups", 4)
    group = target.new_group(f"interop-{lang}-fifo", fifo=True)
    rounds = ("--expect", 0, "--max-rounds", 6, "--batch", 2, "--ack")
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="fifo-consumer") as pool:
        runs = [pool.submit(consume, run, lang, proxy, topic, group, *rounds) for _ in range(3)]
        outs = [r.result() for r in runs]
    got: list[dict] = []
    for n, out in enumerate(outs):
        assert out["errors"] == [], out["errors"]
        got.extend({**m, "consumer": n} for m in out["messages"])
    assert sorted(m["id"] for m in got) == sorted(ids), f"not each once: {got}"
    assert all(m["attempt"] == 1 for m in got), got
    by_group: dict[str, list[dict]] = {}
    for m in got:
        assert m["body"] == f"{prefix}-{ids.index(m['id'])}", m
        by_group.setdefault(m["group"], []).append(m)
    assert len(by_group) == 4, sorted(by_group)
    for name, seq in by_group.items():
        seq.sort(key=lambda m: ids.index(m["id"]))
        for before, after in itertools.pairwise(seq):
            same_receive = (before["consumer"], before["receive"]) == (
                after["consumer"],
                after["receive"],
            )
            assert same_receive or after["received_at"] >= before["ack_at"], (
                f"group {name}: {after} delivered while {before} was in flight"
            )
    assert sum(1 for out in outs if out["messages"]) >= 2


# -- transactions, timed and recalled messages -------------------------------------------

#: The timed message is sent this far ahead; it must arrive no earlier than its time less
#: RocketMQ's 1 s timer precision (EARLY_MS), and at most LATE_MS after it: the timer slot,
#: then a SimpleConsumer long poll answered at once in notify mode.
DELAY_SECONDS = 4
EARLY_MS = 1000
LATE_MS = 4000
FEATURES_TIMEOUT = 90


def transactions_timed_and_recalled(run: Run, lang: str, proxy: ProxyProcess, topic: str, target):
    """A committed, a rolled-back and an orphaned-then-checked transaction, a timed message
    delivered at its time, and a recalled one never (the driver's ``features``).

    The brokers check a half message older than 3 s every second (the stub's default, the
    real test brokers' ``transactionTimeOut`` / ``transactionCheckInterval``), so the orphan
    is checked, through the producer's Telemetry stream, and committed within seconds."""
    group = target.new_group(f"interop-{lang}-tx")
    out = run(
        lang, "features", "--endpoint", proxy.grpc, "--topic", topic, "--group", group,
        "--delay-seconds", DELAY_SECONDS, timeout=FEATURES_TIMEOUT,
    )  # fmt: skip
    got = {r["id"]: r["at_ms"] for r in out["received"]}
    assert out["committed"] in got, out
    assert out["orphan"] in got, f"orphan never committed; checker saw {out['checked']}"
    assert out["orphan"] in out["checked"], out  # it came through a check, not by itself
    assert out["rolled_back"] not in got, out
    assert out["recalled"] not in got, out
    assert out["recall_answer"] == out["recalled"], out
    assert out["timed"] in got, out
    assert out["deliver_ms"] - EARLY_MS <= got[out["timed"]] <= out["deliver_ms"] + LATE_MS, out
    # Transactions are at least once: a real broker may check a transaction again before
    # the answer to its last check is in, and deliver a check-committed message twice.
    assert set(got) == {out["committed"], out["orphan"], out["timed"]}, out["received"]


#: The lite consumers (RocketMQ 5.5) each client has: Python 5.1.2 a LiteSimpleConsumer and a
#: LitePushConsumer, Node 1.0.8 and Java 5.2.0 a LitePushConsumer.
LITE_KINDS = {"python": ("simple", "push"), "node": ("push",), "java": ("push",)}
LITE_QUOTA = 3
#: What each client raises for a subscription past its settings' quota (its own check):
#: Python LITE_SUBSCRIPTION_QUOTA_EXCEEDED, Node a ClientException with code 429, Java a
#: LiteSubscriptionQuotaExceededException (which carries no code).
LITE_OVER_QUOTA = {
    "python": {"code": 42902, "type": "LiteSubscriptionQuotaExceededException"},
    "node": {"code": 429, "type": "ClientException"},
    "java": {"code": None, "type": "LiteSubscriptionQuotaExceededException"},
}


def lite_consumers(run: Run, lang: str, proxy: ProxyProcess, topic: str, target) -> None:
    """Each lite consumer of the client on the LITE parent ``topic``, in a lite group of its
    own with a quota of 3: the settings carry the quota and the longest name (64); it gets
    one message of each of its two lite topics and nothing of a third it did not subscribe;
    a fourth subscription (one past the quota) fails with the client's quota error."""
    for kind in LITE_KINDS[lang]:
        group = target.new_lite_group(f"interop-{lang}-lite-{kind}", topic, quota=LITE_QUOTA)
        names = [unique(f"{kind}-a"), unique(f"{kind}-b")]
        extra = ("--push",) if kind == "push" else ()
        out = run(
            lang,
            "lite",
            "--endpoint",
            proxy.grpc,
            "--group",
            group,
            "--topic",
            topic,
            "--lite-topics",
            ",".join(names),
            "--other",
            unique(f"{kind}-other"),
            "--over-quota",
            *extra,
            timeout=CONSUME_TIMEOUT + 30,
        )
        assert out["quota"] == LITE_QUOTA and out["max_size"] == 64, out
        got = sorted((m["lite_topic"], m["body"]) for m in out["messages"])
        assert got == sorted((n, f"{n}-body") for n in names), out
        assert out["over_quota"] == LITE_OVER_QUOTA[lang], out


# -- priority messages (RocketMQ 5.4+, RIP-80) -------------------------------------------

PRIORITY = 5  # not 0: Node 1.0.8 types a priority-0 message NORMAL, which a PRIORITY topic refuses


def priority_round_trip(run: Run, lang: str, proxy: ProxyProcess, topic: str, target) -> None:
    """Priority messages to a PRIORITY topic (the route must accept them: every client
    checks) arrive once each with their priority."""
    ids, prefix = produce(run, lang, proxy, topic, 3, "--priority", PRIORITY)
    group = target.new_group(f"interop-{lang}-priority")
    out = consume(run, lang, proxy, topic, group, "--expect", 3, "--max-rounds", 6, "--ack")
    assert_delivered_once(out, ids, prefix, topic, priority=PRIORITY)
