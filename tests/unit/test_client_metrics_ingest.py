"""Clients' cumulative exports added up once: whatever worker of a group takes each export,
in whatever order, through worker restarts, retries and limits; other bounds put in the
proxy's buckets; stale state forgotten with its client; the tables bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.observability import client_totals as ct
from proxy.observability.client_metrics import ClientMetricsIngest
from proxy.observability.client_totals import ClientHistograms, ClientTotals, Limits
from proxy.observability.metrics import ProxyMetrics
from testkit.otlp import export, point

HEADERS = {"x-mq-language": "JAVA", "x-mq-client-version": "5.2.0"}
NAME = "rocketmq_delivery_latency"
LABELS = {"topic": "T", "client_language": "JAVA", "client_version": "5.2.0",
          "invocation_status": ""}  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Worker:
    """One process of a group: its own metrics and its own connection to the totals."""

    def __init__(self, directory: str | None, clock: Clock, **limits: int) -> None:
        kept = {"max_label_sets": 100, "max_client_series": 100, "max_series_per_client": 50}
        self.totals = ClientTotals(directory, Limits(**{**kept, **limits}), clock)
        self.metrics = ProxyMetrics(version="test")
        self.metrics.registry.register(ClientHistograms(self.totals.histograms))
        self.ingest = ClientMetricsIngest(self.metrics, self.totals)

    def send(self, counts, *, client="c1", start_ns=10**12, age_s=60.0, group="G"):
        p = point(counts, float(sum(counts)), start_ns=start_ns, age_s=age_s,
                  consumer_group=group, topic="T", client_id=client)  # fmt: skip
        return self.ingest.ingest(export((NAME, p)), HEADERS)

    def count(self, group: str = "G") -> float:
        value = self.metrics.registry.get_sample_value(NAME + "_count", {"group": group, **LABELS})
        return value or 0.0

    def dropped(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "rocketmq_proxy_client_metrics_dropped_total", {"reason": reason}
        )
        return value or 0.0


def one(n: int) -> list[int]:
    return [n, 0, 0, 0, 0, 0, 0, 0]


def test_a_restarted_series_counts_whole_and_a_repeat_counts_nothing():
    w = Worker(None, Clock())
    w.send(one(1))
    w.send(one(1), age_s=120)  # nothing new
    w.send(one(1), age_s=120)  # the same export again (a retry)
    assert w.count() == 1
    w.send(one(2), start_ns=2 * 10**12)  # the series restarted
    assert w.count() == 3


def test_an_export_older_than_one_added_adds_nothing():
    w = Worker(None, Clock())
    w.send(one(1))
    w.send(one(5), age_s=180)
    tally = w.send(one(3), age_s=120)  # overtaken by the one above: no error either
    assert (tally.added, tally.rejected) == (0, 0)
    assert w.count() == 5


def test_counts_that_go_down_within_a_series_are_rejected():
    w = Worker(None, Clock())
    w.send(one(4))
    tally = w.send(one(2), age_s=120)
    assert (tally.added, tally.rejected) == (0, 1)
    assert w.count() == 4


def test_a_known_clients_new_series_counts_whole_even_when_old():
    """The Java client's series all start with its meter: a topic it sends to an hour
    later is new, not a client that moved here."""
    w = Worker(None, Clock())
    w.send(one(1))
    w.send([0, 3, 0, 0, 0, 0, 0, 0], age_s=3600, group="G2")
    assert w.count("G2") == 3


def test_an_unknown_clients_old_series_is_a_baseline():
    w = Worker(None, Clock())
    w.send(one(7), age_s=3600)  # a client from before this proxy started
    assert w.count() == 0
    w.send(one(9), age_s=3660)
    assert w.count() == 2


def test_a_client_moving_between_workers_is_counted_once(tmp_path):
    """Connection aging moves a client A -> B -> A: each export adds what it adds since
    the last, wherever that one was added."""
    clock = Clock()
    a, b = Worker(str(tmp_path), clock), Worker(str(tmp_path), clock)
    a.send(one(1), age_s=60)
    b.send(one(3), age_s=120)
    b.send(one(6), age_s=180)
    a.send(one(10), age_s=240)
    assert a.count() == b.count() == 10
    restarted = Worker(str(tmp_path), clock)  # a worker restarts; the group's totals stay
    restarted.send(one(12), age_s=300)
    assert restarted.count() == 12


def test_an_export_names_one_client():
    w = Worker(None, Clock())
    mine = point(one(1), consumer_group="G", topic="T", client_id="c1")
    theirs = point(one(1), consumer_group="G", topic="T", client_id="c2")
    tally = w.ingest.ingest(export((NAME, mine), (NAME, theirs)), HEADERS)
    assert (tally.added, tally.rejected) == (1, 1)
    assert "c2" in tally.errors[0]


def test_other_bounds_land_in_the_first_proxy_bucket_at_least_as_high():
    assert ct._rebucket(NAME, (3.0, 100.0), [1, 2, 4]) == [0, 1, 0, 0, 0, 2, 0, 4]
    assert ct._rebucket(NAME, (), [5]) == [0, 0, 0, 0, 0, 0, 0, 5]


def test_new_series_past_the_limits_are_refused_never_evicted():
    w = Worker(None, Clock(), max_client_series=2, max_series_per_client=50)
    for client in ("a", "b", "c"):
        w.send(one(1), client=client)
    assert w.totals.sizes()["series"] == 2
    assert w.dropped("series_limit") == 1
    w.send(one(2), client="a", age_s=120)  # a kept series still adds up
    assert w.count() == 3

    w = Worker(None, Clock(), max_series_per_client=2)
    for group in ("G1", "G2", "G3"):
        w.send(one(1), group=group)
    assert w.totals.sizes()["series"] == 2
    assert w.dropped("series_limit") == 1


def test_a_silent_client_is_forgotten_with_its_series_and_label_sets():
    clock = Clock()
    w = Worker(None, clock, max_label_sets=1)
    w.send(one(1), client="old", group="G1")
    clock.now += ct.FORGET_AFTER_S / 2
    w.send(one(1), client="new", group="G2")  # past the label-set limit
    assert w.dropped("label_limit") == 1
    clock.now += ct.FORGET_AFTER_S / 2 + 1
    w.send(one(2), client="new", group="G2", age_s=90)  # "old" and G1 have expired
    assert w.totals.sizes() == {"clients": 1, "series": 1, "histograms": 1}
    assert w.count("G1") == 0 and w.count("G2") == 2


def test_malformed_points_are_rejected_with_reasons():
    w = Worker(None, Clock())
    bad = [
        point([1, 2]),  # counts for other bounds
        point(one(1), float("nan")),
        point(one(1), -1.0),
    ]
    tally = w.ingest.ingest(export(*((NAME, p) for p in bad)), HEADERS)
    assert (tally.added, tally.rejected) == (0, 3)
    assert len(tally.errors) == 3


def test_label_values_keep_no_control_characters():
    w = Worker(None, Clock())
    w.send(one(1), group="G\x1fX\n")
    assert w.count("GX") == 1


# -- any interleaving ------------------------------------------------------------------------

# A step: client i records n more, then exports to worker w, possibly twice (a retry) and
# possibly held back behind its next export (overtaken); or worker w restarts.
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("export"), st.integers(0, 3), st.integers(0, 2),
                  st.integers(0, 5), st.sampled_from(["once", "twice", "late"])),
        st.tuples(st.just("restart"), st.integers(0, 2)),
    ),
    max_size=40,
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(steps=_steps)
def test_any_interleaving_over_workers_adds_each_increment_once(tmp_path_factory, steps):
    directory = str(tmp_path_factory.mktemp("group"))
    clock = Clock()
    workers = [Worker(directory, clock) for _ in range(3)]
    recorded = [0] * 4  # each client's cumulative count so far
    exports = [0] * 4  # how many exports each client has made
    held: list[tuple[int, int, int, float]] = []  # (worker, client, count, age) held back

    def deliver(worker: int, client: int, count: int, age_s: float) -> None:
        workers[worker].send(one(count), client=f"c{client}", age_s=age_s)

    for step in steps:
        clock.now += 1
        if step[0] == "restart":
            workers[step[1]].totals.close()
            workers[step[1]] = Worker(directory, clock)
            continue
        _, client, worker, n, delivery = step
        recorded[client] += n
        exports[client] += 1
        this = (worker, client, recorded[client], 30.0 + exports[client])  # young at first
        if delivery != "late":
            deliver(*this)
        if delivery == "twice":  # a retry, taken by another worker
            deliver((worker + 1) % 3, *this[1:])
        for late in held:  # overtaken by the export above
            deliver(*late)
        held = [this] if delivery == "late" else []
    for late in held:
        deliver(*late)
    for w in workers:
        assert w.count() == sum(recorded)
        w.totals.close()
